"""The fluid NVLink side split by host (`fluid_shards`, `phantora.netsim.fluid_shards`): every completion that of one
fluid engine, under the hybrid and alone, with deps across shards (markers and NVLink flows waiting on other hosts'),
across sides and across batches; against closed forms where one is known."""

from __future__ import annotations

import random

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.fluid_shards import ShardedFluid, host_shards
from phantora.netsim.hybrid import FluidNvlinkSimulator, in_order
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.loader import load_topology
from tests.random_dags import MIB, gpus_by_host, random_dag, ring_step


def key(done: list[Completion]) -> list[tuple[int, int, int]]:
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)


def two_batches_agree(
    sims: tuple[FlowSimulator | FluidNvlinkSimulator, ...], first: list[Flow], second: list[Flow], trial: int
) -> None:
    """Submit `first` at 0 and drain, then `second` 500 ns after each engine's clock and drain: every engine's starts
    and ends equal, the last one's (the engine under test) drained in (end, id) order."""
    for sim in sims:
        sim.submit(first, 0)
    done = [sim.drain() for sim in sims]
    assert all(key(d) == key(done[0]) for d in done), trial
    assert done[-1] == in_order(done[-1])
    for sim in sims:
        sim.submit(second, sim.now() + 500)
    done = [sim.drain() for sim in sims]
    assert all(key(d) == key(done[0]) for d in done), trial


def hybrid(topo_name: str, shards: int) -> FluidNvlinkSimulator:
    topo = load_topology(topo_name)
    fluid = (
        FlowSimulator(topo) if shards == 0 else ShardedFluid(topo, shards, lambda: FlowSimulator(topo, verify=True))  # type: ignore[arg-type]
    )
    return FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=1000, header_bytes=48)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("topo_name", "shards", "wire"), [("testbed16", 2, False), ("rail128", 3, False), ("rail128", 16, False),
                                      ("rail128", 5, True)]
)  # fmt: skip
def test_the_hybrid_over_fluid_shards_is_the_hybrid_over_one_fluid_engine(
    topo_name: str, shards: int, wire: bool
) -> None:
    """Random DAGs over both sides and every host, two batches (the second after the first drained, waiting on flows
    done on either side and any shard): every start and end that of the hybrid over one fluid engine, and of one
    flow engine carrying all of them (NVLink and fabric channels are disjoint); drained in (end, id) order. `wire`:
    every batch and its completions through msgpack (`ShardedFluid.wire`, the bench's measure of a process split)."""
    hosts = gpus_by_host(topo_name)
    topo = load_topology(topo_name)
    shard = host_shards(topo, shards)
    rng = random.Random(11 + shards)
    across = 0
    for trial in range(8):
        first = random_dag(rng, hosts, 0, rng.randint(40, 120), [], markers=0.15, wide=0.08)
        second = random_dag(rng, hosts, len(first), rng.randint(20, 60), [f.id for f in first], markers=0.15, wide=0.08)
        sims = (FlowSimulator(topo), hybrid(topo_name, 0), hybrid(topo_name, shards))
        one, base, split = sims
        split.fluid.wire = wire  # type: ignore[attr-defined]
        side = {f.id: split.side_of(f) for f in first + second}
        src = {f.id: f.src for f in first + second}
        across += sum(
            1 for f in first + second for d in f.deps if side[d] == side[f.id] == 1 and shard[src[d]] != shard[f.src]
        )
        two_batches_agree(sims, first, second, trial)
        assert split.in_flight() == 0
        fluid = split.fluid
        assert isinstance(fluid, ShardedFluid)
        assert [r.bytes for r in fluid.channel_usage()] == [r.bytes for r in base.fluid.channel_usage()]
        assert [r.busy_ns for r in fluid.channel_usage()] == [r.busy_ns for r in base.fluid.channel_usage()]
        assert (fluid.wire_bytes > 0) == wire
        assert split.stats()["fluid_shards"]["shards"] == shards  # (the hybrid's stats carry the split's)
    assert across > 20  # (fluid flows waiting on fluid flows of another shard, often)


def test_a_marker_after_another_hosts_nvlink_flow_releases_it_at_its_end() -> None:
    """Host 0's 1 MiB NVLink flow at its 400 Gb/s cap (20,972 ns + 2 hops of 25 ns), then a marker of host 1 after it
    (a 300 ns delay), then host 1's NVLink flow after the marker: on 2 shards the marker waits across them and each
    flow ends where the closed form says, as on one engine."""
    topo = load_topology("testbed16")
    hosts = gpus_by_host("testbed16")
    a, b = hosts[0][:2]
    c, d = hosts[1][:2]
    flows = [
        Flow(0, a, b, MIB, rate_bps=400_000_000_000),
        Flow(1, c, c, 0, (0,), 300),
        Flow(2, c, d, MIB, (1,), rate_bps=400_000_000_000),
    ]
    split = ShardedFluid(topo, 2, lambda: FlowSimulator(topo))
    split.prechecked = True  # (as the hybrid sets it: it checks each batch whole)
    split.submit(flows, 0)
    assert split.in_flight() == 3 and split._held  # (the marker is held: its dep is on the other shard)
    got = {x.flow_id: x for x in split.drain()}
    xfer = -(-MIB * 8 * 1_000_000_000 // 400_000_000_000) + 50
    assert got[0].end_ns == xfer
    assert got[1].start_ns == got[1].end_ns == xfer + 300
    assert (got[2].start_ns, got[2].end_ns) == (xfer + 300, 2 * xfer + 300)
    one = FlowSimulator(topo)
    one.submit(flows, 0)
    assert key(one.drain()) == key(list(got.values()))
    assert split.together_ns > 0


def test_fluid_shards_needs_nvlink_fluid_and_a_count() -> None:
    with pytest.raises(InputError, match="fluid_shards.*nvlink=fluid"):
        PacketConfig(fluid_shards=2)
    with pytest.raises(InputError, match="fluid_shards"):
        PacketConfig(nvlink="fluid", fluid_shards=-1)
    assert PacketConfig(nvlink="fluid", fluid_shards=4).fluid_shards == 4


def test_hosts_go_to_shards_in_runs_of_consecutive_hosts() -> None:
    topo = load_topology("rail128")
    shard = host_shards(topo, 4)
    hosts = sorted({n.host for n in topo.nodes if n.host is not None})
    by_host = {n.host: shard[v] for v, n in enumerate(topo.nodes) if n.host is not None}
    assert [by_host[h] for h in hosts] == sorted(by_host[h] for h in hosts)
    assert [list(by_host.values()).count(s) for s in range(4)] == [list(by_host.values()).count(0)] * 4


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize(("partition", "procs"), [(0, "off"), (2, "off"), (2, "on")])
def test_fluid_shards_beside_ns3_give_one_keyed_engines_completions_and_links(partition: int, procs: str) -> None:
    """testbed16's two hosts, two rings across them (each step an NVLink flow inside each host and a fabric flow
    between them, released by each other), and markers of one host after the other host's NVLink flows (deps across
    the shards): one keyed engine with one fluid engine, against `fluid_shards=2` on one keyed engine or on 2 stepped
    partition workers (`procs`: each shard in a process of its own, `fluid_procs`): every completion and every
    channel's bytes and packets equal."""
    import dataclasses

    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import KEYED_SCHEDULER

    topo = load_topology("testbed16")
    g = [v for v, node in enumerate(topo.nodes) if node.kind == "gpu"]
    flows: list[Flow] = []
    fid = 1
    last: dict[tuple[int, int], tuple[int, ...]] = {}
    for step in range(4):  # gpu0 -> gpu1 -> gpu9 -> gpu8 -> gpu0 and gpu4 -> gpu5 -> gpu13 -> gpu12 -> gpu4
        for base in (0, 4):
            flows += ring_step(g, base, step, fid, last)
            fid += 4
            # host 1's marker after host 0's NVLink hop of this step, then an NVLink flow on host 1 after it
            flows.append(Flow(fid, g[10], g[10], 0, delay_ns=1_500, deps=(fid - 4,)))
            flows.append(Flow(fid + 1, g[10], g[11], 1 << 20, deps=(fid,), rate_bps=400_000_000_000))
            fid += 2
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", queue_sample_ns=0)
    got, links = {}, {}
    for shards in (0, 2):
        n = partition if shards else 0
        one = dataclasses.replace(cfg, partition=n, fluid_shards=shards, fluid_procs=procs if shards else "off")
        sim = make_engine(EngineSpec("ns3", one), topo,
                          partitioner=run_partitioned_batches, stepper=spawn_stepped)  # fmt: skip
        try:
            sim.submit(flows, 0)
            got[shards] = sorted(dataclasses.astuple(c) for c in sim.drain())
            links[shards] = [(u.channel, u.bytes, u.packets) for u in sim.channels().channel_usage()]
            if shards:
                split = sim.fluid  # type: ignore[attr-defined]
                assert isinstance(split, ShardedFluid) and split.together_ns > 0 and min(split.shard_cpu_s) > 0
                assert (type(split).__name__ == "ProcShardedFluid") == (procs == "on")
        finally:
            sim.close()
    assert got[2] == got[0] and len(got[0]) == len(flows)
    assert links[2] == links[0]
