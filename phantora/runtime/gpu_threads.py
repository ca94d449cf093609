"""Threads the program starts run GPU work on the simulated device, as on a GPU host.

torch's dispatch modes are per thread, so a `threading.Thread` would not see the rank's `ChargeMode`: its cuda
ops would reach this CPU build's missing CUDA kernels. `install` makes `Thread.start`, called from the program's
thread or from a thread it adopted, hand the new thread the mode: the thread's ops are charged on the lane of its
own current stream (dispatch.py `adopt`, simcuda/streams.py), from the compute lane's time at its start, and the
backward it runs too (autograd's engine would run a cuda tensor's backward on its own device threads). Threads
started elsewhere (torch's C++ pools, which carry the mode themselves; a thread of a thread started before the
session) are left as they are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _pop_mode, _push_mode

_installed: list[Callable[..., Any]] = []  # Thread.start as the process had it
# phantora's own threads (send copies, gloo lanes, the watchdogs: all named so) do host work for the rank and are
# never the program's: not adopted, so the rank's ops do not go in turn while they live
OWN = "phantora-"


def install(mode: Any, now: Callable[[], int]) -> None:
    """Adopt every thread that the program's thread, or a thread adopted, starts from now on into `mode`, each
    from the simulated time `now()` when it is started."""
    start = _installed[0] if _installed else threading.Thread.start
    if not _installed:
        _installed.append(start)

    def adopting_start(thread: threading.Thread) -> None:
        if thread.name.startswith(OWN) or not mode.charges(threading.get_ident()):
            start(thread)
            return
        mode.starting()
        _adopt(thread, mode, now())
        try:
            start(thread)
        except BaseException:
            mode.release()
            raise

    threading.Thread.start = adopting_start  # type: ignore[method-assign,assignment]


def _adopt(thread: threading.Thread, mode: Any, floor_ns: int) -> None:
    """Run `thread`'s target with `mode` pushed, its ops charged from `floor_ns` (its `run`, bound in its place)."""
    run = thread.run

    def run_on_the_simulated_gpu() -> None:
        mode.adopt(floor_ns)
        torch._C._set_multithreading_enabled(False)  # its backward on itself, as the program's (simcuda/device.py)
        _push_mode(mode)
        try:
            run()
        finally:
            _pop_mode()
            mode.release()

    thread.run = run_on_the_simulated_gpu  # type: ignore[method-assign]
