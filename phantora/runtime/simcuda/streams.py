"""CUDA streams and events of the simulated GPU, on the rank's virtual clock.

The current stream is per host thread, as CUDA's: a thread starts on the default stream, and
`set_stream` / ``with torch.cuda.stream(s)`` change its own only. Every kernel of the program's thread
runs on the rank's one compute lane, whatever stream it was issued on, and collectives on the
communication lanes (clock.py): so that thread's `Stream` objects order no kernels. A thread the program
starts (dispatch.py) runs its kernels on its current stream's lane: the compute lane for the default
stream, in turn with the program's, and a side lane of its own for any other stream, beside the compute
lane; `wait_stream`, `wait_event` and `synchronize` join those lanes, and an `Event` records its stream's
lane. Streams order
collectives (stream_deps.py): a sync collective launched on a side stream is followed by that stream's
later collectives, and `wait_stream`/`wait_event` pass that on: to another side stream's collectives,
or, on the default stream, as a join of the compute lane. An `Event` records the compute lane's
simulated time, so ``start.elapsed_time(end)`` (a framework's own step timer) gives simulated
milliseconds. ``synchronize`` on a stream, an event or the device joins every lane and every
collective in flight, as a host that waits for the GPU does; from a thread the program started, a stream's
or an event's waits for that stream's or event's work alone (`RankSession.thread_sync`).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from phantora.errors import PhantoraError
from phantora.runtime.simcuda import devices

_ids = itertools.count(1)


def _session() -> Any:
    return _session_module().current()


def _in_turn() -> None:
    """A thread the program started reads or orders its lanes in its turn in simulated time (host_clocks.py)."""
    from phantora.runtime import host_clocks

    mine = host_clocks._mine()
    if mine is not None:
        mine[0].turn(mine[1])


def synchronize(device: Any = None) -> None:
    """Wait for the simulated GPU: join every lane and collective in flight. From a thread the program started
    (DCP's `async_save` writer syncs its CUDA stream in its own), its host clock (host_clocks.py) moves up to every
    lane and every collective in flight (`RankSession.thread_sync`); from another thread (gloo's), nothing."""
    s = _session()
    if s is None:
        return
    if threading.get_ident() == s.thread:
        s.sync()
    elif s.host_clocks is not None:
        s.thread_sync()


class Stream:
    """A CUDA stream of the simulated GPU (see the module docstring for its timing)."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        return super().__new__(cls)

    def __init__(self, device: Any = None, priority: int = 0, stream_id: int | None = None, **kwargs: Any) -> None:
        self.device = torch.device("cuda", devices.index_of(device))
        self.priority = priority
        self.stream_id = next(_ids) if stream_id is None else stream_id
        self.device_index = self.device.index
        self.device_type = 1  # c10::DeviceType::CUDA

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority, as torch gives it on a GPU: CUDA's 0 and -5, clamped to torch's 4 levels."""
        return 0, -3

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        s = _session()
        if s is not None:
            _in_turn()
            s.stream_wait(self.stream_id, s.streams.tail(stream.stream_id))
            _lane_wait(s, self.stream_id, stream.stream_id, None)

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False  # CUDA graphs are not simulated (api.py refuses torch.cuda.graph)

    def synchronize(self) -> None:
        """From a thread the program started: its host waits for this stream's work launched before (its lane and
        the collectives it follows, `RankSession.thread_sync`), not the other streams'; else as the device's."""
        s = _session()
        if s is not None and threading.get_ident() != s.thread and s.host_clocks is not None:
            s.thread_sync(self.stream_id, s.streams.tail(self.stream_id))
        else:
            synchronize()

    def __enter__(self) -> Stream:
        self._ctx = StreamContext(self)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)

    @property
    def cuda_stream(self) -> int:
        return self.stream_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and (self.stream_id, self.device) == (other.stream_id, other.device)

    def __hash__(self) -> int:
        return hash((self.stream_id, self.device))

    def __repr__(self) -> str:
        return f"<simulated torch.cuda.Stream device={self.device} id={self.stream_id}>"


class ExternalStream(Stream):
    """Streams made elsewhere (a CUDA library's) do not exist on the simulated GPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise PhantoraError("torch.cuda.ExternalStream wraps a real CUDA stream, which the simulated GPU does not have")


def _lane_wait(s: Any, waiter: int, source: int, t_ns: int | None) -> None:
    """`waiter`'s next work follows `source`'s work so far (or its event at `t_ns`), where either runs on a side
    lane of a thread's stream (clock.py); streams on the compute lane alone are in order already."""
    lanes = s.clock.lanes
    if lanes and (waiter in lanes or source in lanes):
        with s.lane_write(waiter if waiter in lanes else 0):
            s.clock.lane_wait(waiter, s.clock.lane_now(source) if t_ns is None else t_ns)


_default: dict[int, Stream] = {}
_current = threading.local()  # `streams`: this thread's current stream by device index (none: the default)


def default_stream(device: Any = None) -> Stream:
    i = devices.index_of(device)
    if i not in _default:
        _default[i] = Stream(i, stream_id=0)
    return _default[i]


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on `device` (its default stream until the thread sets one)."""
    i = devices.index_of(device)
    mine = getattr(_current, "streams", None)
    return (mine and mine.get(i)) or default_stream(i)


def _current_stream_id() -> int:
    return current_stream().stream_id


def _session_module() -> Any:
    from phantora.runtime import session

    return session


def set_stream(stream: Stream | None) -> None:
    """Make `stream` the calling thread's current stream on its device (other threads' stay as they are)."""
    if stream is not None:
        _session_module().current_stream_id = _current_stream_id
        mine = getattr(_current, "streams", None)
        if mine is None:
            mine = _current.streams = {}
        mine[stream.device.index or 0] = stream


class StreamContext:
    """``with torch.cuda.stream(s):`` makes `s` the current stream inside."""

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream
        self.prev: Stream | None = None

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            self.prev = current_stream(self.stream.device)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.prev is not None:
            set_stream(self.prev)


def stream(s: Stream | None) -> StreamContext:
    return StreamContext(s)


class Event:
    """A CUDA event: `record` notes the compute lane's simulated time."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, external: bool = False
    ) -> None:
        if interprocess:
            raise PhantoraError("interprocess CUDA events are not simulated (torch.cuda.Event(interprocess=True))")
        self.enable_timing = enable_timing
        self.t_ns: int | None = None
        self._stream = 0  # the stream it was recorded on
        self._after: list[Any] = []  # the collectives in flight that the recording stream's next work followed

    def record(self, stream: Stream | None = None) -> None:
        s = _session()
        _in_turn()
        self._stream = (stream or current_stream()).stream_id
        self.t_ns = s.clock.lane_now(self._stream) if s is not None else 0
        self._after = s.streams.tail(self._stream) if s is not None else []

    def wait(self, stream: Stream | None = None) -> None:
        s = _session()
        if s is None:
            return
        _in_turn()
        waiter = (stream or current_stream()).stream_id
        if self._after:
            s.stream_wait(waiter, self._after)
        if self.t_ns is not None:
            _lane_wait(s, waiter, self._stream, self.t_ns)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """From a thread the program started: its host waits for the work recorded before this event (its recorded
        time and the collectives it follows), not for the device; else as the device's synchronise."""
        s = _session()
        if s is not None and threading.get_ident() != s.thread and s.host_clocks is not None:
            s.thread_sync(calls=self._after, at=self.t_ns or 0)
        else:
            synchronize()

    def elapsed_time(self, end_event: Event) -> float:
        """Simulated milliseconds from this event to `end_event`, as torch.cuda.Event.elapsed_time."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.t_ns is None or end_event.t_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event.t_ns - self.t_ns) / 1e6

    def ipc_handle(self) -> Any:
        raise PhantoraError("CUDA event IPC handles are not simulated")
