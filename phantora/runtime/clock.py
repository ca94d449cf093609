"""Per-rank virtual GPU clock with a compute lane and a communication lane (integer ns).

The compute lane is the GPU's compute stream: ops run back to back on it. A collective is issued
at the compute lane's current time and occupies the comm lane until its completion. Waiting on a
collective joins the lanes: the compute lane jumps to the completion time if it is later. A
synchronisation (a step boundary, the end of the run) joins every lane.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class VirtualClock:
    """Two lanes of simulated time; all values are integer nanoseconds."""

    compute_ns: int = 0  # when the compute stream becomes free
    comm_ns: int = 0  # when the last known collective on the comm lane completes
    compute_busy_ns: int = 0  # total time the compute lane spent running ops
    waited_ns: int = 0  # total time the compute lane stalled waiting for collectives

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

    def sync(self) -> int:
        """Join every lane (like a device synchronise); return the new time."""
        self.join(self.comm_ns)
        return self.compute_ns
