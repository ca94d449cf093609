"""Host memory a process takes, for the run summary and the scale benchmarks."""

from __future__ import annotations


def proportional_set_mb(pid: int | str = "self") -> float | None:
    """A process's proportional set size now (Linux; None elsewhere or if it is gone), in MB.

    Unlike RSS it splits shared pages among the processes sharing them, so summed over ranks forked
    by the fork server it is the host memory they really take."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """The host memory the kernel could give processes now without swapping (`MemAvailable`); None if not told."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
