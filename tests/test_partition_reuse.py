"""Profile reuse (`reuse=on`) over stepped partition workers (issue 38, item 3): episodes of the whole network.

testbed16 (2 hosts x 8 GPUs, a leaf each, 4 spines) with the fluid NVLink side, DCQCN with a step ECN marking
(kmin = kmax: ns-3 draws no random number) and a fresh queue pair per flow: there reuse is exact, so one keyed
engine without reuse, one with it, and 2 or 4 stepped partition workers with it must give the same results. Each
period a compute marker (200 us after the last period's fabric flows) releases an incast of 2 x 512 KiB into GPU 8,
and a second marker 3 us later an incast into GPU 9 while the first is in flight: one episode, two batches. The
second incast is 640 KiB from GPU 3 in every third period: that period matches the recorded first batch, then
diverges at its second and materialises (on every worker at once); the next such period is served from it.
Fast: how reuse runs the engine below on its own (`reuse.catch_up`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from phantora.netsim.base import Completion, Flow
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig
from phantora.netsim.reuse import catch_up
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology

PERIODS = 6
GAP_NS = 200_000  # the fabric falls quiet within it (each incast takes about 25 us at 400G)
_STEP = {400_000_000_000: 60_000, 800_000_000_000: 60_000}  # a step marking at the NICs' and the spines' rates
SETTINGS: dict[str, Any] = {
    "cc": "dcqcn",
    "scheduler": KEYED_SCHEDULER,
    "nvlink": "fluid",
    "queue_sample_ns": 0,
    "kmin_map": _STEP,
    "kmax_map": dict(_STEP),
    "qp": "flow",  # a fresh CC state per flow: nothing outlives an episode
}
FILES = ("flows.csv", "links.csv", "pfc.csv", "ecn_marks.csv", "cnps.csv")


def periodic_incasts(topo: Topology) -> list[Flow]:
    """PERIODS periods of: marker a (after the last period's fabric flows, + GAP_NS), GPUs 0, 1 -> 8 after a;
    marker b 3 us after a, GPUs 2, 3 -> 9 after b (GPU 3's 640 KiB in every third period). ECMP keys by role."""
    g = [v for v, node in enumerate(topo.nodes) if node.kind == "gpu"]
    flows: list[Flow] = []
    last: tuple[int, ...] = ()
    for k in range(PERIODS):
        a = len(flows)
        flows.append(Flow(a, g[0], g[0], 0, deps=last, delay_ns=GAP_NS if k else 0))
        fabric = []
        for h in (0, 1):
            fabric.append(len(flows))
            flows.append(Flow(len(flows), g[h], g[8], 512 << 10, deps=(a,), key=h + 1))
        b = len(flows)
        flows.append(Flow(b, g[0], g[0], 0, deps=(a,), delay_ns=3_000))
        for h in (2, 3):
            size = 640 << 10 if (h == 3 and k % 3 == 2) else 512 << 10
            fabric.append(len(flows))
            flows.append(Flow(len(flows), g[h], g[9], size, deps=(b,), key=h + 1))
        last = tuple(fabric)
    return flows


def run(topo: Topology, flows: list[Flow], out: Path | None, **changes: Any) -> tuple[list[Completion], dict[str, Any]]:
    """Every completion (by id) and the engine's stats; with `out`, the network files written there."""
    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.results.write import write_network_files

    spec = EngineSpec("ns3", PacketConfig(**{**SETTINGS, **changes}))
    sim = make_engine(spec, topo, partitioner=run_partitioned_batches, stepper=spawn_stepped)
    try:
        sim.submit(flows, 0)
        done = sorted(sim.drain(), key=lambda c: c.flow_id)
        if out is not None:
            end = max(c.end_ns for c in done)
            write_network_files(out, topo, sim, done, elapsed_ns=end, flows={f.id: f for f in flows}, spec=spec)
        return done, dict(sim.stats())
    finally:
        sim.close()


@pytest.mark.slow  # one engine 3 times, 2 + 4 workers (each imports ns-3): 58 s wall, 19 CPU s at load 7-9
@pytest.mark.ns3
def test_reuse_on_stepped_partition_workers_gives_one_keyed_engines_files(tmp_path: Path) -> None:
    topo = load_topology("testbed16")
    flows = periodic_incasts(topo)
    want, off = run(topo, flows, None)
    assert len(want) == len(flows) and off["ecn_marks"]  # the incasts mark: DCQCN acts, the check is not vacuous
    # The closed form reuse rests on, time-shift invariance: a period whose flows are the first one's (all but
    # every third) has the first period's FCTs, shifted to its marker's end; the 640 KiB period does not.
    rel: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for c in want:
        k, i = divmod(c.flow_id, 6)
        if i not in (0, 3):  # (markers)
            rel[k].append((c.start_ns - want[6 * k].end_ns, c.end_ns - want[6 * k].end_ns))
    assert all(rel[k] == rel[0] for k in range(PERIODS) if k % 3 != 2) and rel[2] == rel[5] != rel[0]

    one, on = run(topo, flows, tmp_path / "one", reuse="on")
    assert one == want
    # periods 0 and 2 recorded (2 after matching 0's first batch: materialised), 1, 3, 4 served from 0, 5 from 2
    episodes = {k: on[f"reuse_{k}"] for k in ("episodes", "recorded", "served", "materialised", "mismatches")}
    assert episodes == {"episodes": 6, "recorded": 2, "served": 4, "materialised": 1, "mismatches": 0}
    for n in (2, 4):
        got, stats = run(topo, flows, tmp_path / f"p{n}", reuse="on", partition=n)
        assert got == want
        assert {k: stats[f"reuse_{k}"] for k in episodes} == episodes  # the driver decides as one engine
        assert stats["partition"]["workers"] == n and stats["partition"]["stepped"]
        assert "reuse=on" in stats["approximations"]
        for name in FILES:
            assert (tmp_path / f"p{n}" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert (tmp_path / "one" / "ecn_marks.csv").read_bytes().count(b"\n") > 1000  # served marks replayed too


class _Below:
    """An engine below reuse, with or without a `catch_up` of its own."""

    def __init__(self, own: bool) -> None:
        self.calls: list[tuple[str, int]] = []
        if own:
            self.catch_up = lambda t: self._call("catch_up", t)

    def _call(self, name: str, t: int) -> list[Completion]:
        self.calls.append((name, t))
        return []

    def advance(self, t: int) -> list[Completion]:
        return self._call("advance", t)


@pytest.mark.parametrize("own", [True, False])
def test_reuse_runs_the_engine_below_through_its_catch_up_if_it_has_one(own: bool) -> None:
    below = _Below(own)
    catch_up(below)(5)  # type: ignore[arg-type]
    assert below.calls == [("catch_up" if own else "advance", 5)]


def test_partition_without_fluid_nvlink_still_refuses_reuse_in_one_line() -> None:
    from phantora.errors import InputError
    from phantora.netsim.factory import partitioned

    config = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, partition=2, reuse="on")
    with pytest.raises(InputError, match="reuse") as err:
        partitioned(load_topology("testbed16"), config, runner=lambda *a: None)
    assert "\n" not in str(err.value) and "nvlink=fluid" in str(err.value)


class _FakePool:
    """One logical stepped worker without ns-3: a flow ends END_NS after its post, and the fabric falls quiet
    ACKS_NS after the last end (the ACKs); `merged` gives records that grow."""

    END_NS, ACKS_NS = 10_000_000, 500

    def __init__(self, *_: Any) -> None:
        self.workers = [type("H", (), {"index": 0, "pid": 0, "pieces": [0]})()]
        self.quiet = True
        self.reacting: list[int] | None = None  # (the driver's reacting flows: this pool runs every round whole)
        self.stopped: int | None = None
        self.pending: dict[int, Flow] = {}
        self.ends: dict[int, int] = {}
        self.records = type("R", (), {"pfc": [], "queues": [], "drops": [], "cnps": [], "marks": []})()

    def round(self, posts: dict[int, Any]) -> Any:
        from phantora.netsim.decompose import RoundReply

        if not posts:  # (its next event is past the round's horizon)
            return iter(())
        ((_, out, until),) = posts.values()
        for (f, _), at in zip(out.flows, out.at, strict=True):
            self.pending[f.id], self.ends[f.id] = f, at + self.END_NS
        done = [Completion(i, self.ends[i] - self.END_NS, self.ends[i], f.size, f.src, f.dst)
                for i, f in sorted(self.pending.items()) if self.ends[i] <= until]  # fmt: skip
        for c in done:
            del self.pending[c.flow_id]
        self.quiet = not self.pending and max(self.ends.values(), default=0) + self.ACKS_NS <= until
        nxt = min((self.ends[i] for i in self.pending), default=None)
        return iter([(0, RoundReply(done, [], 0.0, 0.0, until, nxt, len(self.pending)))])

    def merged(self, now: int) -> Any:
        return self.records

    def keepalive(self) -> None:
        return None

    def close(self) -> None:
        return None


def _stepped() -> Any:
    from phantora.netsim.partition_stepped import SteppedPartition

    topo = load_topology("testbed16")
    cfg = PacketConfig(**{**SETTINGS, "partition": 2})
    g = [v for v, node in enumerate(topo.nodes) if node.kind == "gpu"]
    spawn: Any = _FakePool  # (a WorkerPool by duck typing)
    return SteppedPartition(topo, cfg, spawn), g


def test_stepped_partition_is_quiet_only_once_every_worker_is_and_none_is_past_now() -> None:
    sim, g = _stepped()
    assert sim.quiet()
    sim.submit([Flow(1, g[0], g[8], 1000)], 0)
    assert not sim.quiet()  # a flow in flight
    sim.floor = lambda: 30_000_000  # the caller submits nothing before, and does not react to the flow's end:
    sim.reacts = lambda fid: False  # so the worker runs ahead, past it
    end = _FakePool.END_NS
    assert [c.end_ns for c in sim.advance_to_completion(20_000_000)] == [end]
    assert sim.now() == end and sim._pool.quiet and max(sim._wnow) > end
    assert not sim.quiet()  # the worker is quiet, but it ran past now: quiet at now is not known
    sim.advance(max(sim._wnow))
    assert sim.quiet()


def test_catch_up_runs_the_workers_to_its_time_and_no_further() -> None:
    sim, g = _stepped()
    floor = lambda: 30_000_000  # noqa: E731
    sim.floor = floor
    sim.submit([Flow(1, g[0], g[8], 1000)], 0)
    assert sim.catch_up(5_000_000) == [] and max(sim._wnow) <= 5_000_000 == sim.now()
    assert sim.floor is floor  # restored for the fluid side's own calls
    sim.submit([Flow(2, g[1], g[8], 1000)], 5_000_000)  # at the workers' clock: accepted


def test_new_records_are_the_merged_records_since_the_last_call() -> None:
    sim, _ = _stepped()
    rec = sim._pool.records
    rec.pfc.extend(["p1", "p2"])
    rec.marks.append("m1")
    first = sim.new_records()
    assert list(first.pfc) == ["p1", "p2"] and list(first.marks) == ["m1"] and not first.drops
    rec.pfc.append("p3")
    second = sim.new_records()
    assert list(second.pfc) == ["p3"] and not second.marks
