"""Outer gates on a caller that submits as it goes (issue 38, item 2): `phantora run` and nccl-tests watch flows and
submit more when one completes. Over the plain decomposition driver the hybrid gates the packet flows waiting on
its fluid side (`FluidNvlinkSimulator.outer_gates`, default on); every return of `advance_watching` and every
completion must be one engine's."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bridge.workers import spawn_workers
from phantora.netsim.base import INF_NS, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.generators import rail_optimized
from phantora.topology.model import Topology
from tests.random_dags import random_dag

BASE = PacketConfig(cc="dcqcn", nvlink="fluid", nic_latency=1000, payload_bytes=4096, header_bytes=62)


def _rails() -> Topology:
    """3 hosts x 2 GPUs on 2 rails (a decomposition piece a rail)."""
    return rail_optimized(3, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="rail-3x2")


def _hosts(topo: Topology) -> list[list[int]]:
    """The GPU node ids of each host, hosts in order."""
    hosts: dict[int, list[int]] = {}
    for v, n in enumerate(topo.nodes):
        if n.kind == "gpu" and n.host is not None:
            hosts.setdefault(n.host, []).append(v)
    return [hosts[h] for h in sorted(hosts)]


def _on_rails(flows: list[Flow], hosts: list[list[int]]) -> list[Flow]:
    """Each fabric flow's destination moved to its source's rail."""
    where = {g: (h, r) for h, gs in enumerate(hosts) for r, g in enumerate(gs)}
    out = []
    for f in flows:
        (hs, rs), (hd, _) = where[f.src], where[f.dst]
        out.append(f if hs == hd else replace(f, dst=hosts[hd][rs]))
    return out


Trace = list[tuple[int, tuple[int, ...]]]


def _live(config: PacketConfig, seed: int) -> tuple[Trace, list[tuple[int, int, int]], dict[str, object]]:
    """A random DAG, then `advance_watching` on every fifth flow: each watched completion submits six more flows after
    it, at that ns. Every return's (now, ids), every flow's (id, start, end), the stats."""
    topo = _rails()
    hosts = _hosts(topo)
    first = _on_rails(random_dag(random.Random(seed), hosts, 0, 80, (), markers=0.1, wide=0.1), hosts)
    watch = {f.id for f in first if f.id % 5 == 0}
    sim = make_engine(EngineSpec("ns3", config), topo, spawner=spawn_workers)
    trace: Trace = []
    done = []
    try:
        if isinstance(sim, FluidNvlinkSimulator):
            assert sim.outer_gates == (config.workers > 0)  # (on by default over the plain driver)
        sim.submit(first, 0)
        nxt = 1000
        while watch:
            got = sim.advance_watching(INF_NS, watch)
            done += got
            trace.append((sim.now(), tuple(sorted(c.flow_id for c in got))))
            for c in sorted(got, key=lambda c: c.flow_id):
                if c.flow_id in watch:
                    watch.discard(c.flow_id)
                    more = random_dag(random.Random(c.flow_id), hosts, nxt, 6, [c.flow_id], markers=0.1, wide=0.0)
                    sim.submit(_on_rails(more, hosts), sim.now())
                    nxt += 6
        done += sim.drain()
        stats = sim.stats()
    finally:
        sim.close()
    return trace, sorted((c.flow_id, c.start_ns, c.end_ns) for c in done), stats


@pytest.mark.slow  # per seed one engine, then 2 workers that load ns-3 (about 8 CPU s)
@pytest.mark.parametrize("seed", range(2))
def test_outer_gates_under_a_watching_caller_equal_one_engine(seed: int) -> None:
    one_trace, one, _ = _live(BASE, 900 + seed)
    two_trace, two, stats = _live(replace(BASE, workers=2), 900 + seed)
    assert len(one_trace) >= 5 and len(one) > 80  # (not vacuous: returns at watched completions, flows added)
    assert two_trace == one_trace
    assert two == one
    assert isinstance(stats["outer_gated"], int) and stats["outer_gated"] > 0
