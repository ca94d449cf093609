"""Slow GPUs (scenario gpu_slow, issue 36): the throttle's closed forms, and a compute-bound replay stretched k-fold."""

from __future__ import annotations

import pytest

from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.scenario import parse_scenario
from phantora.perfmodel.throttle import Throttle, Throttles
from phantora.replay import compute_stretch, replay_inprocess
from phantora.topology.generators import leaf_spine
from phantora.workload import Workload, workload_from_dict


def test_stretch_closed_forms() -> None:
    th = Throttles([Throttle(1, 1000, 5000, 3.0)])
    assert th.stretch(0, 0, 10_000) == 10_000  # another rank
    assert th.stretch(1, 6000, 700) == 700  # after the window
    assert th.stretch(1, 1000, 1000) == 3000  # inside: k x
    assert th.stretch(1, 0, 2000) == 1000 + 3 * 1000  # straddles the start
    # starts inside, runs past the end: 4000 ns of window do 4000/3 of work, the rest at full speed
    assert th.stretch(1, 1000, 2000) == 4000 + (2000 - round(4000 / 3))
    both = Throttles([Throttle(1, 0, None, 2.0), Throttle(1, 0, None, 1.5)])
    assert both.stretch(1, 10, 1000) == 3000  # overlapping windows multiply


def _job() -> Workload:
    """A compute-bound job: 6 steps of 2 ms compute then a 1 KiB all-reduce, each after the previous."""
    op = {"name": "s", "kind": "all_reduce", "bytes": "1KiB", "ranks": "all", "gap": "2ms", "repeat": 6}
    return workload_from_dict({"name": "cb", "op": [op]}, world=4)


@pytest.mark.parametrize("k", [2.0, 3.0])
def test_compute_bound_steps_stretch_by_k(k: float) -> None:
    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps", nvswitch=False)
    wl = _job()
    clean = replay_inprocess(wl, topo, FlowSimulator(topo))
    sc = parse_scenario(f'[[events]]\nkind = "gpu_slow"\nrank = 1\nfactor = {k}\nat = "0ns"\n', "s.toml")
    sim = make_engine(EngineSpec(), topo, scenario=sc)
    sim.stretch = compute_stretch(sc.throttles(), topo)
    slow = replay_inprocess(wl, topo, sim)
    comm = [r.duration_ns for r in clean.ops]
    assert comm == [r.duration_ns for r in slow.ops]  # the network part is untouched
    clean_steps = [b.end_ns - a.end_ns for a, b in zip(clean.ops, clean.ops[1:], strict=False)]
    slow_steps = [b.end_ns - a.end_ns for a, b in zip(slow.ops, slow.ops[1:], strict=False)]
    assert all(s - c == int(2_000_000 * (k - 1)) for s, c in zip(slow_steps, clean_steps, strict=True))
    compute = [s - d for s, d in zip(slow_steps, comm[1:], strict=True)]
    assert compute == [int(k * 2_000_000)] * 5  # every rank waits for the slow one: the step's compute is k x


def test_window_only_stretches_the_compute_inside() -> None:
    """A throttle from inside op 2 on: op 2 and before are untouched, each later step is longer by the same
    closed-form amount (rank 0's doubled compute against the others' finish)."""
    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps", nvswitch=False)
    wl = _job()
    clean = replay_inprocess(wl, topo, FlowSimulator(topo))
    t0 = clean.ops[2].start_ns + 1  # every rank's compute before op 2 is over; its compute for op 3 not begun
    sc = parse_scenario(f'[[events]]\nkind = "gpu_slow"\nrank = 0\nfactor = 2\nat = "{t0}ns"\n', "s.toml")
    sim = FlowSimulator(topo)
    sim.stretch = compute_stretch(sc.throttles(), topo)
    slow = replay_inprocess(wl, topo, sim)
    shift = [b.end_ns - a.end_ns for a, b in zip(clean.ops, slow.ops, strict=True)]
    done = clean.ops[2].rank_done_ns  # op 3 issues at max over ranks of (done + compute); rank 0 computes 4 ms
    late = max(done[0] + 4_000_000, max(done.values()) + 2_000_000) - (max(done.values()) + 2_000_000)
    assert 0 < late <= 2_000_000
    assert shift == [0, 0, 0, late, 2 * late, 3 * late]
