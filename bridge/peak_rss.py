"""This process's own peak resident memory, for the figures workers report.

`ru_maxrss` is not it in a started child: Linux keeps the largest RSS across fork and exec, so a partition worker
started by a driver holding 2 GB reports the driver's 2 GB however little it used itself (a child of a 613 MB
Python process, using 14 MB, reported 613). `VmHWM` in /proc/self/status is the high-water mark of this
process image alone; where it is not told (not Linux), `ru_maxrss` stands in.
"""

from __future__ import annotations

import resource
from pathlib import Path

STATUS = Path("/proc/self/status")


def peak_rss_kb(status: Path = STATUS) -> int:
    """The peak RSS of this process image in KiB: VmHWM, else ru_maxrss."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
