"""The fluid chains' placement read at C speed (`FluidNvlinkSimulator._place`, `_chain_deps`; `ShardedFluid._rows`;
`IdSet.update`): a wide deps list mixing this batch's fluid flows of both shards, a fabric flow, a flow of an earlier
batch still running and one done gives each shard the external deps a hand count says, and every start and end one
flow engine's and the hybrid's without chains; a whole DAG's rows are the bytes of rows made field by field; a
bulk add is the adds one by one."""

from __future__ import annotations

import msgpack

from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.fluid_shards import ShardedFluid
from phantora.netsim.idset import DENSE_LIMIT, IdSet
from phantora.topology.loader import load_topology
from tests.random_dags import MIB, gpus_by_host
from tests.test_fluid_chains import chained
from tests.test_fluid_shards import key

CAP = 400_000_000_000


def mixed_batches() -> tuple[list[Flow], list[Flow], dict[int, list[int]]]:
    """testbed16 (host 0 on shard 0, host 1 on shard 1 at 2 shards). First batch: 0 a long NVLink flow on host 1,
    1 a short one on host 0. Second batch (ids from 2): 10 NVLink flows on each host, a fabric flow host 0 -> host 1,
    then on host 1 a marker waiting on all 21 and on 0 (running, shard 1) and 1 (done), an NVLink flow on host 0
    after a host-1 flow (one dep, another shard) and one on host 1 after the fabric flow. Also what `_ext` must hold
    once the second batch is placed: dep -> the shards told of its end."""
    (a, *ga), (b, *gb) = gpus_by_host("testbed16")
    first = [Flow(0, b, gb[0], 64 * MIB, rate_bps=CAP), Flow(1, a, ga[0], 4096, rate_bps=CAP)]
    second: list[Flow] = []
    fid = 2
    for src, peers in ((a, ga), (b, gb)):
        for i in range(10):
            second.append(Flow(fid, src, peers[i % len(peers)], (i + 1) * 65_536, rate_bps=CAP))
            fid += 1
    host0, host1 = list(range(2, 12)), list(range(12, 22))
    fabric = fid
    second.append(Flow(fabric, a, b, MIB))
    marker = fabric + 1
    wide = (*host0, *host1, fabric, 0, 1)
    second.append(Flow(marker, b, b, 0, wide, 200))
    second.append(Flow(marker + 1, a, ga[1], MIB, (host1[3],), rate_bps=CAP))
    second.append(Flow(marker + 2, b, gb[1], MIB, (fabric,), rate_bps=CAP))
    told = {d: [1] for d in (*host0, fabric)}  # (the marker, shard 1: host 0's flows and the fabric flow; 0 runs there)
    told[host1[3]] = [0]
    return first, second, told


def test_a_wide_list_of_both_shards_the_fabric_and_earlier_flows_is_told_as_counted() -> None:
    first, second, told = mixed_batches()
    topo_name = "testbed16"
    one, base, sim = FlowSimulator(load_topology(topo_name)), chained(topo_name, 0, chains=False), chained(topo_name, 2)
    for s in (one, base, sim):
        s.submit(first, 0)
    ends = [s.advance(2_000) for s in (one, base, sim)]  # (flow 1 done, flow 0 still running)
    assert [key(e) for e in ends] == [key(ends[0])] * 3 and [c.flow_id for c in ends[0]] == [1]
    for s in (one, base, sim):
        s.submit(second, 2_000)
    assert {d: sorted(ws) for d, ws in sim._ext.items()} == told
    assert sim.fluid_chained == 3  # (the marker and the two one-dep flows wait on deps elsewhere)
    done = [s.drain() for s in (one, base, sim)]
    assert key(done[2]) == key(done[0]) == key(done[1])
    assert not sim._ext and not sim._ext_step and sim.in_flight() == 0


def test_a_whole_dags_rows_are_the_bytes_of_rows_made_field_by_field() -> None:
    """The first submit's rows (nothing done: every field as it is) packed as the per-field rows with list deps."""
    first, second, _ = mixed_batches()
    topo = load_topology("testbed16")
    split = ShardedFluid(topo, 2, lambda: FlowSimulator(topo))
    flows = first + second
    rows = split._rows(flows, 1, routed=True)
    by_field = [
        [f.id, f.src, f.dst, f.size, list(f.deps), f.delay_ns, f.tag, f.priority, f.key, f.loss_budget, f.rate_bps,
         f.conn, f.queue, f.via_nic]
        for f in flows
    ]  # fmt: skip
    assert msgpack.packb(rows) == msgpack.packb(by_field)
    assert set(split._sent) == {f.id for f in flows}


def test_a_bulk_add_is_the_adds_one_by_one() -> None:
    ids = [5, 0, 5, 7, 1 << 20, 3, DENSE_LIMIT, DENSE_LIMIT + 9, -4, 7, DENSE_LIMIT, 1 << 20]
    bulk, one = IdSet(), IdSet()
    bulk.update(ids)
    for i in ids:
        one.add(i)
    assert len(bulk) == len(one) == len(set(ids)) == 8
    for i in [*ids, 1, 2, 6, 8, (1 << 20) + 1, DENSE_LIMIT + 1, -3]:
        assert (i in bulk) == (i in one) == (i in set(ids))
