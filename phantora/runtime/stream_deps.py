"""Which collectives a simulated CUDA stream's next work must follow.

Kernels all run on the rank's one compute lane (clock.py), which stands for the default stream (id 0). A
collective is launched on a CUDA stream too: ProcessGroupNCCL (torch >= 2.8, pytorch#150398) launches an
`async_op=False` one on the caller's current stream and an `async_op=True` one on the group's internal stream,
after making that stream wait for the current one. So on a side stream (FSDP2's all-gather and reduce-scatter
streams) a sync collective holds up that stream's later work, not the default stream's, until a
`wait_stream` / `wait_event` / `Work.wait` from another stream, or a kernel that reads its data, asks for it.

`StreamDeps` keeps, per stream, the collectives its next work follows: a sync collective launched on it (which
itself follows the earlier ones), and those another stream's `wait_stream`/`wait_event` handed it. The session
sends their handles with each collective issued from that stream (`after`), and the coordinator starts the
collective only once they have ended (bridge/stream_order.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

COMPUTE_STREAM = 0  # the default stream: the compute lane itself


class InFlight(Protocol):
    """What StreamDeps reads of a collective in flight (the session's `Pending`)."""

    handles: list[int]
    t_done: int | None


Pending = TypeVar("Pending", bound=InFlight)


class StreamDeps(Generic[Pending]):
    """Per simulated CUDA stream id, the collectives in flight that its next work must follow."""

    def __init__(self) -> None:
        self._deps: dict[int, list[Pending]] = {}

    def tail(self, stream: int) -> list[Pending]:
        """The collectives `stream`'s next work follows (those not joined yet); an event recorded on it now."""
        live = [p for p in self._deps.get(stream, ()) if p.t_done is None]
        if live:
            self._deps[stream] = live
        else:
            self._deps.pop(stream, None)
        return list(live)

    def after(self, stream: int) -> list[int]:
        """The bridge handles a collective issued from `stream` must start after."""
        return [h for p in self.tail(stream) for h in p.handles]

    def launched(self, stream: int, p: Pending) -> None:
        """A sync collective ran on `stream`: its next work follows it (and so what it followed)."""
        self._deps[stream] = [p]

    def follow(self, stream: int, pending: Iterable[Pending]) -> None:
        """`stream` waits for `pending` (another stream's tail, an event, a Work): its next work follows them."""
        mine = self._deps.setdefault(stream, [])
        mine.extend(p for p in pending if p.t_done is None and all(p is not q for q in mine))
