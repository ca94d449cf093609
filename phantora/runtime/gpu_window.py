"""The rank's simulated GPU work while a torch.profiler window is open (simcuda/profiler_cuda.py exports it).

`GpuWindow.open(session)` taps what the session already tells its trace (runtime/trace.py), whatever the trace level:
every kernel (on the compute lane, which stands for the default stream, or on a side stream's lane), every collective
at its completion (its span from issue to completion, as trace.json's comm lanes show it; the host's moment of its
issue noted when it was issued in the window). It also samples the pair (the host's real epoch time, the compute
lane's simulated time) at each kernel, wait and synchronise: `sim_ns` reads those samples to place a moment of the
host (a CPU op's start or end, as torch's profiler stamps it) on the simulated timeline, at the compute lane's time as
of the last GPU event the host had made by then. `close()` removes the taps.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phantora.runtime.timepatch import REAL_CLOCKS

NOT_KERNELS = ("nccl:host_launch", "host:")  # session.py's NCCL_LAUNCH and HOST_WORK: idle waits for the host
MEMCPY_PREFIX = "memcpy_"  # a copy between host memory and the GPU (runtime/hostwork.py `HostCopy.name`)


def real_time_ns() -> int:
    """The host's real epoch time in ns (CLOCK_REALTIME, the clock torch's profiler stamps CPU ops with)."""
    return int(REAL_CLOCKS.time_ns())


@dataclass(frozen=True, slots=True)
class GpuSpan:
    """A kernel, copy or collective of the simulated GPU: simulated ns, on `stream` (0: the default stream; a side
    stream's id; None for a collective, which runs on its communicator's stream), launched at real epoch `wall` (None:
    a collective issued before the window) by the program's thread (`main`) or another."""

    name: str
    start: int
    end: int
    stream: int | None
    wall: int | None
    main: bool
    args: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        """Its kind: "kernel", "memcpy" or "collective"."""
        if self.stream is None:
            return "collective"
        return "memcpy" if self.name.startswith(MEMCPY_PREFIX) else "kernel"


class GpuWindow:
    """The simulated GPU work of one rank between `open` and `close`."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.spans: list[GpuSpan] = []
        self.walls: list[int] = []  # real epoch ns of each sample ...
        self.sims: list[int] = []  # ... and the compute lane's simulated ns then
        self.start_ns = self.end_ns = int(session.clock.compute_ns)
        self._undo: list[Callable[[], None]] = []
        self.closed = False
        self._lock = threading.Lock()  # the taps run on any thread of the rank: a sample's pair, and `close`

    @classmethod
    def open(cls, session: Any) -> GpuWindow:
        """Start recording `session`'s GPU work."""
        w = cls(session)
        w.sample()
        w._tap()
        return w

    def sample(self) -> int | None:
        """Note the compute lane's time now; the real time noted (None once closed: a tap a thread entered before
        `close` restored the session records nothing more)."""
        with self._lock:
            return None if self.closed else self._sample()

    def _sample(self) -> int:
        wall = real_time_ns()
        self.walls.append(wall)
        self.sims.append(int(self.session.clock.compute_ns))
        return wall

    def close(self) -> None:
        """Stop recording (idempotent): the last sample, and the session as it was."""
        with self._lock:
            if self.closed:
                return
            self._sample()
            self.closed = True
        self.end_ns = self.sims[-1]
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        pairs = sorted(zip(self.walls, self.sims, strict=True))
        self.walls = [w for w, _ in pairs]
        self.sims = [s for _, s in pairs]

    def sim_ns(self, wall_ns: float) -> int:
        """The simulated time of the host's real epoch moment `wall_ns`: the compute lane's at the last sample at or
        before it (the first sample's before it)."""
        i = bisect.bisect_right(self.walls, wall_ns) - 1
        return self.sims[max(i, 0)]

    # ----- taps ------------------------------------------------------------------------------------
    def _tap(self) -> None:
        s, trace, clock = self.session, self.session.trace, self.session.clock
        spans, sample = self.spans, self.sample
        own = s._trace_ops is not None  # the run's trace records ops: the tap passes them on

        def op(name: str, start: int, end: int) -> None:
            wall = sample()
            if wall is not None and not name.startswith(NOT_KERNELS):
                spans.append(GpuSpan(name, start, end, 0, wall, threading.get_ident() == s.thread))
            if own:
                trace.op(name, start, end)  # nothing once --trace-steps stopped the recorder's ops

        def lane_op(stream: int, name: str, start: int, end: int) -> None:
            if not self.closed:
                spans.append(GpuSpan(name, start, end, stream, real_time_ns(), threading.get_ident() == s.thread))
            if own:
                plain_lane_op(stream, name, start, end)

        issued: dict[str, deque[tuple[int, bool]]] = {}  # a collective's name -> when and by which thread it was issued

        def register(kind: str, label: str, *args: Any, **kwargs: Any) -> Any:
            issued.setdefault(label, deque()).append((real_time_ns(), threading.get_ident() == s.thread))
            return plain_register(kind, label, *args, **kwargs)

        def comm(name: str, start: int, end: int, args: dict[str, Any]) -> None:
            mine = issued.get(name)
            wall, main = mine.popleft() if mine else (None, False)
            if not self.closed:
                spans.append(GpuSpan(name, start, end, None, wall, main, dict(args)))
            plain_comm(name, start, end, args)

        def join(t_done_ns: int) -> int:
            stall = plain_join(t_done_ns)
            sample()
            return stall

        def sync() -> int:
            now = plain_sync()
            sample()
            return now

        plain_lane_op, plain_comm = self._replace(trace, "lane_op", lane_op), self._replace(trace, "comm", comm)
        plain_join, plain_sync = self._replace(clock, "join", join), self._replace(clock, "sync", sync)
        plain_register = self._replace(s, "_register", register)
        before = s._trace_ops
        s._trace_ops = op

        def restore_ops() -> None:
            if s._trace_ops is op:
                s._trace_ops = before if trace.level != "none" else None

        self._undo.append(restore_ops)

    def _replace(self, obj: Any, name: str, tap: Callable[..., Any]) -> Any:
        """Set `obj.name` to `tap` on the instance; return what it was (restored at `close`)."""
        had = name in vars(obj)
        plain = getattr(obj, name)
        setattr(obj, name, tap)

        def undo() -> None:
            if vars(obj).get(name) is tap:
                if had:
                    setattr(obj, name, plain)
                else:
                    delattr(obj, name)

        self._undo.append(undo)
        return plain
