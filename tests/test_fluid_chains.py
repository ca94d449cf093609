"""Fluid chains (`fluid_chains=on`, issue 38): every fluid flow goes to its fluid engine (its shard) when placed, with
its deps, and that engine releases it at their ends; the ends of deps elsewhere (the packet side, other shards) are
told to the shards waiting on them (`FluidNvlinkSimulator._chain_deps`). Every completion that of the hybrid without
chains over one fluid engine and of one flow engine, on one engine and on shards; the submit floor and reactions
no later than the events they bound; a closed form."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.fluid_shards import ShardedFluid
from phantora.netsim.hybrid import FLUID, FluidNvlinkSimulator, in_order
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.loader import load_topology
from tests.random_dags import CAPS, MIB, gpus_by_host, random_dag
from tests.test_fluid_shards import key, two_batches_agree


def any_dag(rng: random.Random, hosts: list[list[int]], first: int, n: int, before: list[int]) -> list[Flow]:
    """`random_dag` with test_fluid_shards' shares of markers and wide lists."""
    return random_dag(rng, hosts, first, n, before, markers=0.15, wide=0.08)


def chain_dag(rng: random.Random, hosts: list[list[int]], first: int, n: int, before: list[int]) -> list[Flow]:
    """`random_dag`'s flows, but most deps on earlier flows of the same host (a collective's steps on one host:
    a fabric receive, then markers and NVLink hops after it), the rest on any flow, some lists of 16 or more."""
    flows: list[Flow] = []
    on_host: dict[int, list[int]] = {}
    host_of = {g: h for h, gs in enumerate(hosts) for g in gs}
    for i in range(n):
        h = rng.randrange(len(hosts))
        src = rng.choice(hosts[h])
        kind = rng.random()
        if kind < 0.2:
            dst, size = src, 0
        elif kind < 0.8:
            dst = rng.choice([g for g in hosts[h] if g != src])
            size = rng.choice([4096, MIB, rng.randint(1, 3 * MIB)])
        else:
            dst = rng.choice(hosts[(h + rng.randint(1, len(hosts) - 1)) % len(hosts)])
            size = rng.choice([65_536, MIB, rng.randint(1, 2 * MIB)])
        local = on_host.get(h, [])
        pool = [f.id for f in flows] + before
        if local and rng.random() < 0.06:
            deps = tuple(rng.sample(local, min(len(local), rng.randint(16, 24))))
        elif local and rng.random() < 0.8:
            deps = tuple(rng.sample(local[-6:], min(len(local[-6:]), rng.randint(1, 2))))
        else:
            deps = tuple(rng.sample(pool, min(len(pool), rng.randint(0, 2)))) if pool else ()
        cap = rng.choice(CAPS) if size else 0
        flows.append(Flow(first + i, src, dst, size, deps, rng.randint(0, 2_000), rate_bps=cap))
        on_host.setdefault(host_of[dst], []).append(first + i)
    return flows


def chained(topo_name: str, shards: int, chains: bool = True) -> FluidNvlinkSimulator:
    topo = load_topology(topo_name)
    fluid = (
        FlowSimulator(topo, verify=True)
        if shards == 0
        else ShardedFluid(topo, shards, lambda: FlowSimulator(topo, verify=True))
    )
    sim = FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=1000, header_bytes=48)  # type: ignore[arg-type]
    sim.fluid_chains = chains
    return sim


@pytest.mark.parametrize(
    ("topo_name", "shards", "wire"), [("testbed16", 0, False), ("testbed16", 2, False), ("rail128", 0, False),
                                      ("rail128", 3, False), ("rail128", 16, False), ("rail128", 5, True)]
)  # fmt: skip
def test_fluid_chains_give_the_hybrid_over_one_fluid_engine(topo_name: str, shards: int, wire: bool) -> None:
    """Random DAGs over both sides and every host, two batches (the second waiting on flows done on either side):
    every start and end that of the hybrid without chains over one fluid engine and of one flow engine carrying all
    of them; drained in (end, id) order; chains were placed ahead of held deps (the point of the route)."""
    hosts = gpus_by_host(topo_name)
    topo = load_topology(topo_name)
    rng = random.Random(23 + shards)
    ahead = 0
    for trial in range(8):
        dag = chain_dag if trial % 2 else any_dag
        first = dag(rng, hosts, 0, rng.randint(40, 160), [])
        second = dag(rng, hosts, len(first), rng.randint(20, 60), [f.id for f in first])
        one, base, got_sim = FlowSimulator(topo), chained(topo_name, 0, chains=False), chained(topo_name, shards)
        if wire:
            got_sim.fluid.wire = True  # type: ignore[attr-defined]
        two_batches_agree((one, base, got_sim), first, second, trial)
        assert got_sim.in_flight() == 0 and not got_sim._ext and not got_sim._ext_step
        assert [r.bytes for r in got_sim.fluid.channel_usage()] == [r.bytes for r in base.fluid.channel_usage()]
        ahead += got_sim.fluid_chained
    assert ahead > 20


def test_chains_of_markers_and_nvlink_flows_behind_a_fabric_flow_end_at_the_closed_form() -> None:
    """A 1 MiB fabric flow, then on its receiver's host a marker (300 ns delay) and two 1 MiB NVLink flows in a row,
    each capped at 400 Gb/s: all three go to the fluid engine when placed (the marker told of the fabric flow's end)
    and each NVLink flow ends one capped transfer + its 2 hops of 25 ns after the one before, as without chains."""
    hosts = gpus_by_host("testbed16")
    a, (c, d, e) = hosts[0][0], hosts[1][:3]
    cap = 400_000_000_000
    flows = [
        Flow(0, a, c, MIB),
        Flow(1, c, c, 0, (0,), 300),
        Flow(2, c, d, MIB, (1,), rate_bps=cap),
        Flow(3, d, e, MIB, (2,), rate_bps=cap),
    ]
    sims = [chained("testbed16", 0), chained("testbed16", 0, chains=False)]
    placed = []
    runs = []
    for sim in sims:
        sim.submit(flows, 0)
        placed.append(sim.fluid.in_flight())
        runs.append({x.flow_id: x for x in sim.drain()})
    assert placed == [3, 0]  # (with chains the three go to the fluid engine at once; without, each at its dep's end)
    assert sims[0].fluid_chained == 1 and sims[1].fluid_chained == 0  # (the marker: told of the fabric flow's end)
    got = runs[0]
    xfer = -(-MIB * 8 * 1_000_000_000 // cap) + 50
    assert got[1].start_ns == got[1].end_ns == got[0].end_ns + 300
    assert (got[2].start_ns, got[2].end_ns) == (got[1].end_ns, got[1].end_ns + xfer)
    assert (got[3].start_ns, got[3].end_ns) == (got[2].end_ns, got[2].end_ns + xfer)
    assert key(list(got.values())) == key(list(runs[1].values()))


def test_a_start_marker_across_shards_runs_on_one_of_its_deps_shards_in_turn() -> None:
    """Collectives across every host of rail128 on 16 shards, each started by a marker at host 0's first GPU (as a
    replay anchors `cN/start`) waiting on every host's last NVLink flow, then a 1 MiB NVLink flow on each host after
    it: the markers are dealt to the 16 shards in turn (not all to host 0's), a marker of one host stays on its
    shard, and every start and end is one flow engine's and the hybrid's without chains."""
    hosts = gpus_by_host("rail128")
    topo = load_topology("rail128")
    flows: list[Flow] = []
    last = [-1] * len(hosts)
    markers, local = [], []
    for k in range(20):
        m = len(flows)
        deps = tuple(x for x in last if x >= 0)
        flows.append(Flow(m, hosts[0][0], hosts[0][0], 0, deps, 100 * k))
        markers.append(m)
        for h, gpus in enumerate(hosts):
            last[h] = len(flows)
            flows.append(Flow(len(flows), gpus[k % 4], gpus[4 + k % 4], MIB, (m,)))
        one_host = len(flows)  # (a marker of host 3's flows only: stays on host 3's shard)
        flows.append(Flow(one_host, hosts[3][1], hosts[3][1], 0, (last[3],), 7))
        local.append(one_host)
        last[3] = len(flows)
        flows.append(Flow(len(flows), hosts[3][2], hosts[3][5], 4096, (one_host,)))
    one, base, got_sim = FlowSimulator(topo), chained("rail128", 0, chains=False), chained("rail128", 16)
    fluid = got_sim.fluid
    assert isinstance(fluid, ShardedFluid)
    got_sim.submit(flows, 0)
    placed = [fluid._where[m] for m in markers]
    assert placed[0] == 0  # (no deps: its node's shard)
    assert sorted(placed[1:17]) == list(range(16)) and placed[17:] == placed[1:4]  # (in turn over the 16)
    assert {fluid._where[m] for m in local} == {fluid.node_shard[hosts[3][1]]}
    for sim in (one, base):
        sim.submit(flows, 0)
    want, ref, got = (sim.drain() for sim in (one, base, got_sim))
    assert key(got) == key(ref) == key(want)
    assert got == in_order(got)
    assert got_sim.in_flight() == 0 and not got_sim._ext and not got_sim._ext_step


def _noting(post: Callable[[list[Flow], int], None], handed: list[int]) -> Callable[[list[Flow], int], None]:
    """`post`, noting each batch's submit ns in `handed`."""

    def submit(batch: list[Flow], at: int) -> None:
        handed.append(at)
        post(batch, at)

    return submit


def test_the_floor_and_reactions_with_chains_never_pass_what_they_bound() -> None:
    """Stepped one hybrid step at a time over random DAGs with chains on 2 shards: the submit floor is never past a
    packet flow handed over by fluid ends alone, and a packet flow's reaction never past the gap to a packet flow
    after it through fluid flows (what its end may hand over)."""
    topo_name = "testbed16"
    hosts = gpus_by_host(topo_name)
    rng = random.Random(5)
    reacted = floors = 0
    for trial in range(6):
        flows = (chain_dag if trial % 2 else any_dag)(rng, hosts, 0, rng.randint(60, 120), [])
        sim = chained(topo_name, 2)
        sim.submit(flows, 0)
        side = {f.id: sim.side_of(f) for f in flows}
        deps_of: dict[int, list[int]] = {}
        for f in flows:
            for d in f.deps:
                deps_of.setdefault(d, []).append(f.id)
        ends: dict[int, int] = {}
        starts: dict[int, int] = {}
        reaction: dict[int, int] = {}
        handed: list[int] = []
        sim.packet.submit = _noting(sim.packet.submit, handed)  # type: ignore[method-assign]
        while not sim._idle():
            for fid in list(sim._side):
                if side[fid] != FLUID and fid not in reaction:
                    reaction[fid] = sim.reaction_ns(fid)
                    if any(side[j] == FLUID for j in deps_of.get(fid, ())):  # (its end releases a fluid flow)
                        assert sim.reacts_to(fid), fid
            floor = sim.submit_floor()
            handed.clear()
            got = sim._step(INF_NS)
            for c in got:
                ends[c.flow_id] = c.end_ns
                starts[c.flow_id] = c.start_ns
            if all(side[c.flow_id] == FLUID for c in got):  # (no packet end: what it hands over is the floor's)
                assert all(at >= floor for at in handed), (floor, handed)
                floors += len(handed)
        for fid, r in reaction.items():  # (the packet flows after `fid` through fluid flows: a packet flow's packet
            # deps are the packet side's own, not handed over here)
            todo, least, seen = [j for j in deps_of.get(fid, ()) if side[j] == FLUID], INF_NS, set()
            while todo:
                j = todo.pop()
                if j in seen:
                    continue
                seen.add(j)
                if side[j] != FLUID:
                    least = min(least, starts[j] - ends[fid])
                else:
                    todo.extend(deps_of.get(j, ()))
            assert r <= least, fid
            reacted += least < INF_NS
    assert reacted > 20 and floors > 20


def test_fluid_chains_setting_is_checked() -> None:
    assert PacketConfig(nvlink="fluid", fluid_chains="on").fluid_chains == "on"
    with pytest.raises(InputError, match="fluid_chains"):
        PacketConfig(nvlink="fluid", fluid_chains="yes")
    with pytest.raises(InputError, match="fluid_chains.*nvlink=fluid"):
        PacketConfig(fluid_chains="on")
