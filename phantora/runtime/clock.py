"""Per-rank virtual GPU clock with a compute lane and a communication lane (integer ns).

The compute lane is the GPU's compute stream: ops run back to back on it. A collective is issued
at the compute lane's current time and occupies the comm lane until its completion. Waiting on a
collective joins the lanes: the compute lane jumps to the completion time if it is later. A
synchronisation (a step boundary, the end of the run) joins every lane.

A side stream that a thread other than the program's launches kernels on has a lane of its own (`lanes`, by
stream id; simcuda/streams.py): its kernels run back to back there, beside the compute lane, which stands for
the default stream (and for every stream of the program's own thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VirtualClock:
    """Two lanes of simulated time; all values are integer nanoseconds."""

    compute_ns: int = 0  # when the compute stream becomes free
    comm_ns: int = 0  # when the last known collective on the comm lane completes
    compute_busy_ns: int = 0  # total time the compute lane spent running ops
    waited_ns: int = 0  # total time the compute lane stalled waiting for collectives
    lanes: dict[int, int] = field(default_factory=dict)  # side stream id -> when its lane becomes free
    side_busy_ns: int = 0  # total time the side lanes spent running ops

    def now(self) -> int:
        """The rank's simulated time: the compute lane."""
        return self.compute_ns

    def charge(self, duration_ns: int) -> tuple[int, int]:
        """Run an op of `duration_ns` on the compute lane; return its (start, end)."""
        if duration_ns < 0:
            raise ValueError(f"negative op duration {duration_ns}")
        if type(duration_ns) is not int:
            duration_ns = int(duration_ns)
        start = self.compute_ns
        self.compute_ns = end = start + duration_ns
        self.compute_busy_ns += duration_ns
        return start, end

    def issue(self) -> int:
        """The issue time of a collective: the compute lane's current time."""
        return self.compute_ns

    def complete(self, t_done_ns: int) -> None:
        """Record that a collective occupies the comm lane until `t_done_ns`."""
        self.comm_ns = max(self.comm_ns, int(t_done_ns))

    def join(self, t_done_ns: int) -> int:
        """The compute lane waits for an event at `t_done_ns`; return the stall in ns."""
        self.complete(t_done_ns)
        stall = max(0, int(t_done_ns) - self.compute_ns)
        self.compute_ns += stall
        self.waited_ns += stall
        return stall

    def lane_now(self, stream: int) -> int:
        """When `stream`'s lane becomes free: its side lane's, else the compute lane's."""
        return self.lanes.get(stream, self.compute_ns) if stream else self.compute_ns

    def occupy(self, stream: int, start_ns: int, duration_ns: int) -> int:
        """Run an op from `start_ns` for `duration_ns` on `stream`'s lane (the compute lane for stream 0); its end."""
        end = start_ns + duration_ns
        if stream:
            self.lanes[stream] = end
            self.side_busy_ns += duration_ns
        else:
            self.compute_ns = end
            self.compute_busy_ns += duration_ns
        return end

    def lane_wait(self, stream: int, t_ns: int) -> None:
        """`stream`'s next work starts no earlier than `t_ns` (a `wait_stream` / `wait_event` of another lane's
        work): its side lane's, else the compute lane's (an idle gap there, not a wait for a collective)."""
        if stream in self.lanes:
            self.lanes[stream] = max(self.lanes[stream], t_ns)
        else:
            self.compute_ns = max(self.compute_ns, t_ns)

    def sync(self) -> int:
        """Join every lane (like a device synchronise); return the new time."""
        if self.lanes:
            self.compute_ns = max(self.compute_ns, *self.lanes.values())
        self.join(self.comm_ns)
        return self.compute_ns
