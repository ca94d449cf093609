"""A rank stopped from outside writes where every thread of it stood, so a run that could not go on names its culprit.

The supervisor ends a run that cannot go on (past its bound, or after a peer died) by sending its ranks SIGTERM. A
rank blocked in a call that never returns (gloo's connect of a pair whose peer never calls, say) printed nothing, and
its log could not tell it from a rank waiting its turn in a simulated collective. On SIGTERM a rank now writes every
thread's Python stack to its log (`faulthandler`, which reads them even while the rank's thread is inside C++), then
ends as SIGTERM ends a process. A process the rank forks (a DataLoader worker) does not: torch may end those itself.
Nor does a rank whose session has ended (`quiet_when_stopped`): its results are with the coordinator, and the supervisor
stops a rank still tearing down a few seconds after a completed run (Megatron's ranks, each with six DataLoader
workers to end, at load 30 on 2 cores), where the dump printed "Stack (most recent call first): <no Python frame>" at
the end of a successful run's output.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

_registered = [False]


def dump_stacks_when_stopped() -> None:
    """On SIGTERM, write all threads' stacks to stderr (the rank's log), then end the process (once per process)."""
    if _registered[0]:
        return
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    os.register_at_fork(after_in_child=_not_in_forked_child)
    _registered[0] = True


def _not_in_forked_child() -> None:
    faulthandler.unregister(signal.SIGTERM)


def quiet_when_stopped() -> None:
    """The rank's session has ended: a SIGTERM from here on ends it without writing its stacks."""
    if _registered[0]:
        faulthandler.unregister(signal.SIGTERM)
        _registered[0] = False
