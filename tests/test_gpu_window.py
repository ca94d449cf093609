"""`GpuWindow` (runtime/gpu_window.py) tapped into a rank's clock and trace from more than one thread: a thread the
program started may be inside a tap while the program's thread closes the window (torch.profiler's stop)."""

from __future__ import annotations

import threading
from typing import Any

from phantora.runtime.clock import VirtualClock
from phantora.runtime.gpu_window import GpuWindow
from phantora.runtime.trace import TraceRecorder


class _Rank:
    """What a window taps of a `RankSession`: its real clock and trace recorder, and the hooks it replaces."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        self.trace = TraceRecorder(0, "ops")
        self._trace_ops = self.trace.op
        self.thread = threading.get_ident()

    def _register(self, kind: str, label: str, *args: Any, **kwargs: Any) -> None:
        return None


class _SlowClock(VirtualClock):
    """A clock whose compute lane, once `hold` is set, is read only after `go`: a thread paused inside a sample."""

    def __init__(self) -> None:
        super().__init__()
        self.hold, self.inside, self.go = False, threading.Event(), threading.Event()

    def __getattribute__(self, name: str) -> Any:
        if name == "compute_ns" and object.__getattribute__(self, "hold"):
            object.__setattr__(self, "hold", False)
            self.inside.set()
            self.go.wait(10)
        return object.__getattribute__(self, name)


def test_a_tap_entered_before_close_adds_nothing_after_it() -> None:
    """A thread that looked up the tapped `clock.join` and `trace.lane_op` before `close` restored them calls them
    after: the run's trace still gets its op, the closed window keeps the samples and spans it closed with."""
    rank = _Rank()
    w = GpuWindow.open(rank)
    join, lane_op, op = rank.clock.join, rank.trace.lane_op, rank._trace_ops
    rank.clock.charge(1_000)
    op("aten.mm", 0, 1_000)
    w.close()
    walls, sims, spans = list(w.walls), list(w.sims), list(w.spans)
    assert len(spans) == 1 and sims == [0, 1_000, 1_000]
    join(5_000)
    lane_op(3, "aten.add", 1_000, 1_200)
    op("aten.mm", 1_000, 2_000)
    assert (w.walls, w.sims, w.spans) == (walls, sims, spans)
    assert [o[0] for o in rank.trace._ops] == ["aten.mm", "aten.mm"]  # the trace's own recorder, as without a window
    assert [o[1] for o in rank.trace._lane_ops] == ["aten.add"]


def test_close_while_another_thread_samples() -> None:
    """A thread inside a sample (its real time noted, the compute lane's not yet) while the program's thread closes
    the window: every real time keeps its simulated one (before: the close's pairing raised, the lists unequal)."""
    clock = _SlowClock()
    rank = _Rank(clock)
    w = GpuWindow.open(rank)
    clock.compute_ns = 500
    clock.hold = True
    sampler = threading.Thread(target=w.sample)  # as a thread's kernel, wait or synchronise has its tap do
    sampler.start()
    assert clock.inside.wait(10)
    failed: list[BaseException] = []

    def close() -> None:
        try:
            w.close()
        except BaseException as e:  # noqa: BLE001 (reported by the assertion below)
            failed.append(e)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(0.2)  # (it waits for the sample under way, or fails at once)
    clock.go.set()
    sampler.join(10)
    closer.join(10)
    assert not failed
    assert w.closed and len(w.walls) == len(w.sims) == 3 and w.sims == [0, 500, 500]
    assert w.walls == sorted(w.walls)
