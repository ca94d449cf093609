"""Asynchronous rounds on stepped partition workers (issue 38, item 3): the fluid NVLink side runs ahead while the
workers run a round (`SteppedPartition.meanwhile`, the hybrid's `run_ahead`), and every completion is the serial
driver's.

Fast (no ns-3): one logical worker whose fabric flow ends a fixed time after its post (`_FakePool` of
tests/test_partition_reuse.py), the fluid side real. Two chains on testbed16's two hosts: A alternates fabric flows
(gpu0 -> gpu8 and back) with compute markers on the fluid side, each released by the last; B is a host's compute
markers and NVLink flows that nothing of A waits on, so they run while A's fabric flows are in flight. The ends
against closed forms (A: its fabric flows and markers end to end; B: its markers' delays end to end), and every
completion equal with and without the overlap.
Slow (ns-3 workers): the same kind of traffic on 2 and 4 stepped workers of a 32-GPU leaf-spine against one keyed
engine, every completion equal, with fluid events run ahead during rounds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig
from phantora.topology.loader import load_topology
from tests.random_dags import ring_step
from tests.test_partition_reuse import _FakePool

FABRIC_NS = 50_000  # a fabric flow's time from its post to its end, in the fake worker
MARK_NS = 3_000  # chain A's compute step between two fabric flows
ROUNDS = 6


class _Pool(_FakePool):
    END_NS = FABRIC_NS

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        rec = self.records  # (what reuse reads at its start: the merged counters)
        rec.stats, rec.channels, rec.workers, rec.ties = {}, [], [], 0
        rec.trims, rec.transport, rec.effective = [], {}, []


def _hybrid(overlap: bool) -> tuple[Any, Any, list[int]]:
    from phantora.netsim.factory import fluid_nvlink
    from phantora.netsim.partition_stepped import SteppedPartition

    topo = load_topology("testbed16")
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", queue_sample_ns=0, partition=2)
    spawn: Any = _Pool  # (a WorkerPool by duck typing)
    stepped = SteppedPartition(topo, cfg, spawn)
    engine = fluid_nvlink(topo, cfg, packet=stepped)
    stepped.follow(engine)
    if not overlap:
        stepped.meanwhile = None
    g = [v for v, node in enumerate(topo.nodes) if node.kind == "gpu"]
    return engine, stepped, g


def _dag(g: list[int]) -> tuple[list[Flow], list[int], list[int]]:
    """Chain A (fabric, marker, fabric, ...) and chain B (host 0's markers of 7 us, each releasing an NVLink flow of
    1 MiB from gpu1 to gpu2, and the next marker); the ids of A's and B's markers."""
    flows: list[Flow] = []
    a_marks, b_marks = [], []
    fid, last = 1, ()
    for i in range(ROUNDS):
        src, dst = (g[0], g[8]) if i % 2 == 0 else (g[8], g[0])
        flows.append(Flow(fid, src, dst, 1 << 20, deps=last))
        flows.append(Flow(fid + 1, dst, dst, 0, delay_ns=MARK_NS, deps=(fid,)))
        a_marks.append(fid + 1)
        last, fid = (fid + 1,), fid + 2
    last = ()
    for _ in range(3 * ROUNDS):
        flows.append(Flow(fid, g[1], g[1], 0, delay_ns=7_000, deps=last))
        flows.append(Flow(fid + 1, g[1], g[2], 1 << 20, deps=(fid,)))
        b_marks.append(fid)
        last, fid = (fid,), fid + 2
    return flows, a_marks, b_marks


def test_the_fluid_side_runs_ahead_during_rounds_and_every_completion_is_the_serial_drivers() -> None:
    got = {}
    for overlap in (False, True):
        engine, stepped, g = _hybrid(overlap)
        flows, a_marks, b_marks = _dag(g)
        engine.submit(flows, 0)
        done = engine.drain()
        got[overlap] = sorted(dataclasses.astuple(c) for c in done)
        ends = {c.flow_id: c.end_ns for c in done}
        # A: each fabric flow posted at the last marker's end, FABRIC_NS to its end, then MARK_NS
        assert [ends[m] for m in a_marks] == [(k + 1) * (FABRIC_NS + MARK_NS) for k in range(ROUNDS)]
        # B: its markers end to end, 7 us each (nothing of A or the fabric in its way)
        assert [ends[m] for m in b_marks] == [(k + 1) * 7_000 for k in range(3 * ROUNDS)]
        if overlap:
            assert engine.ahead_steps > 0 and stepped.meanwhile_cpu_s > 0  # B's events ran during rounds
        else:
            assert engine.ahead_steps == 0 and stepped.meanwhile_cpu_s == 0
    assert got[True] == got[False] and len(got[True]) == 2 * ROUNDS + 6 * ROUNDS


def test_no_overlap_with_reuse_between_the_fluid_side_and_the_workers() -> None:
    """Reuse's episodes end where the whole network is quiet, which a round in progress does not say: with reuse
    between them the fluid side steps the workers serially, as before."""
    from phantora.netsim.factory import fluid_nvlink, packet_side
    from phantora.netsim.partition_stepped import SteppedPartition

    topo = load_topology("testbed16")
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", queue_sample_ns=0, partition=2,
                       reuse="on")  # fmt: skip
    spawn: Any = _Pool
    stepped = SteppedPartition(topo, cfg, spawn)
    engine = fluid_nvlink(topo, cfg, packet=packet_side(stepped, cfg))
    stepped.follow(engine)
    assert stepped.meanwhile is None
    stepped._rounding = True  # a round in progress: not known quiet, whatever its last replies said
    assert not stepped.quiet()


LEAFSPINE32 = """
[topology]
name = "leafspine32"
[[hosts]]
count = 4
gpus = 8
nic_bandwidth = "400Gbps"
nvlink_bandwidth = "3600Gbps"
"""


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize("workers", [2, 4])
def test_overlapped_rounds_on_ns3_workers_give_one_keyed_engines_completions(workers: int) -> None:
    """testbed16's two hosts and a ring across them: each step an NVLink flow inside each host and a fabric flow
    between them, released by each other, beside a host's own NVLink chain that nothing waits on; one keyed engine
    and `workers` stepped workers with the fluid side overlapping their rounds: every completion equal."""
    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    topo = load_topology("testbed16")
    g = [v for v, node in enumerate(topo.nodes) if node.kind == "gpu"]
    flows: list[Flow] = []
    fid = 1
    last: dict[tuple[int, int], tuple[int, ...]] = {}
    for step in range(4):  # two rings, gpu0 -> gpu1 -> gpu9 -> gpu8 -> gpu0 and gpu4 -> gpu5 -> gpu13 -> gpu12 -> gpu4
        for base in (0, 4):
            flows += ring_step(g, base, step, fid, last)
            fid += 4
    prev: tuple[int, ...] = ()
    for _ in range(40):  # host 1's own compute and NVLink chain
        flows.append(Flow(fid, g[10], g[10], 0, delay_ns=2_000, deps=prev))
        flows.append(Flow(fid + 1, g[10], g[11], 1 << 20, deps=(fid,)))
        prev, fid = (fid + 1,), fid + 2
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", queue_sample_ns=0)
    got, stats = {}, {}
    for n in (0, workers):
        sim = make_engine(EngineSpec("ns3", dataclasses.replace(cfg, partition=n)), topo,
                          partitioner=run_partitioned_batches, stepper=spawn_stepped)  # fmt: skip
        try:
            sim.submit(flows, 0)
            got[n] = sorted(dataclasses.astuple(c) for c in sim.drain())
            stats[n] = sim.stats()
        finally:
            sim.close()
    assert got[workers] == got[0] and len(got[0]) == len(flows)
    part = stats[workers]["partition"]
    assert part["workers"] == workers and part["rounds"] > 1 and part["ahead_steps"] > 0
