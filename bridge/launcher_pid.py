"""The launcher of this process: its parent, or the launcher a fork server forked it for.

A coordinator or network server started as `python -m` is the launcher's child. One forked by a fork server
(bridge/forkserver.py, under a zygote: bridge/warm_start.py) is the fork server's child instead; the fork server
names the launcher that asked for the fork (`adopt`), so the process judges that launcher's silence by the same
process as a fresh interpreter would (`bridge.liveness.Silence`).
"""

from __future__ import annotations

import os

_adopted: int | None = None


def adopt(pid: int) -> None:
    """In a forked process: `pid` is its launcher."""
    global _adopted
    _adopted = pid


def launcher_pid() -> int:
    """The pid of the process that launched this one."""
    return _adopted if _adopted is not None else os.getppid()
