"""Threads the program starts run GPU work on the simulated device, as on a GPU host.

torch's dispatch modes are per thread, so a `threading.Thread` would not see the rank's `ChargeMode`: its cuda
ops would reach this CPU build's missing CUDA kernels. `install` makes `Thread.start`, called from the program's
thread or from a thread it adopted, hand the new thread the mode: the thread's ops are charged on the lane of its
own current stream (dispatch.py `adopt`, simcuda/streams.py), from its host time (host_clocks.py: from the compute
lane's time at its start, or its starter's host time), in turn with the other threads in simulated time, and the
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

from phantora.runtime import host_clocks

_installed: list[Callable[..., Any]] = []  # Thread.start as the process had it
# phantora's own threads (send copies, gloo lanes, the watchdogs: all named so) do host work for the rank and are
# never the program's: not adopted, so the rank's ops do not go in turn while they live
OWN = "phantora-"


def install(mode: Any, now: Callable[[], int]) -> None:
    """Adopt every thread that the program's thread, or a thread adopted, starts from now on into `mode`, each
    from the simulated time `now()` when it is started."""
    host_clocks.watch_waits()  # a pool's queue made before its first thread too
    start = _installed[0] if _installed else threading.Thread.start
    if not _installed:
        _installed.append(start)

    def adopting_start(thread: threading.Thread) -> None:
        if thread.name.startswith(OWN) or not mode.charges(threading.get_ident()):
            start(thread)
            return
        mode.starting()
        clocks = host_clocks.ensure(mode.session, mode)
        starter = clocks.part_of(threading.get_ident())
        # from the later of the compute lane's time and the program's host time; a thread's, from its starter's
        floor = now() if starter is clocks.main else 0
        part = clocks.register(f'thread "{thread.name}"', starter, floor)
        thread._phantora_part = part  # type: ignore[attr-defined]  # its host time, for a join (host_clocks.py)
        _adopt(thread, mode, clocks, part)
        try:
            start(thread)
        except BaseException:
            clocks.end(part)
            mode.release()
            raise

    threading.Thread.start = adopting_start  # type: ignore[method-assign,assignment]


def _adopt(thread: threading.Thread, mode: Any, clocks: host_clocks.HostClocks, part: host_clocks.Part) -> None:
    """Run `thread`'s target with `mode` pushed, its ops charged from its host time `part` (its `run`, bound in its
    place)."""
    run = thread.run

    def run_on_the_simulated_gpu() -> None:
        clocks.bind(part)
        mode.adopt(part)
        torch._C._set_multithreading_enabled(False)  # its backward on itself, as the program's (simcuda/device.py)
        _push_mode(mode)
        try:
            run()
        finally:
            _pop_mode()
            clocks.end(part)
            mode.release()

    thread.run = run_on_the_simulated_gpu  # type: ignore[method-assign]
