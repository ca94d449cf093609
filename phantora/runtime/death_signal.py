"""A process that dies with its parent: the death signal (prctl PR_SET_PDEATHSIG), and the race prctl(2) warns of."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent dies; `parent` is the pid that started it. A parent
    that died before the call sends nothing (prctl(2): check the parent's pid after it), so a process already
    reparented away from `parent` gets `sig` now."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
