"""Was a child killed by the kernel's OOM killer? The kernel counts its kills (/proc/vmstat `oom_kill`).

A rank SIGKILLed while that count rose was most likely killed for host memory (the count is the machine's, so
another process may have been the one killed). `explain` turns that into what to do about it.
"""

from __future__ import annotations

import signal
from pathlib import Path

VMSTAT = Path("/proc/vmstat")

ADVICE = (
    "host memory ran out: run with --phantom (shapes only, no tensor data), fewer live ranks (--nproc), "
    "or a smaller configuration (sequence, batch, model)"
)


def kills(vmstat: Path = VMSTAT) -> int | None:
    """The number of processes the kernel's OOM killer has killed since boot; None where it is not told."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def explain(returncode: int | None, kills_before: int | None, kills_now: int | None) -> str | None:
    """The note for a child that ended with `returncode`, given the OOM kill counts at its start and now."""
    if returncode != -signal.SIGKILL or kills_before is None or kills_now is None or kills_now <= kills_before:
        return None
    n = kills_now - kills_before
    return (
        f"by the kernel's OOM killer, most likely ({n} OOM kill{'s' if n > 1 else ''} on this machine since it "
        f"started): {ADVICE}"
    )
