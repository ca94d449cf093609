"""A rank stopped from outside writes where every thread of it stood, so a run that could not go on names its culprit.

The supervisor ends a run that cannot go on (past its bound, or after a peer died) by sending its ranks SIGTERM. A
rank blocked in a call that never returns (gloo's connect of a pair whose peer never calls, say) printed nothing, and
its log could not tell it from a rank waiting its turn in a simulated collective. On SIGTERM a rank now writes every
thread's Python stack to its log (`faulthandler`, which reads them even while the rank's thread is inside C++), then
ends as SIGTERM ends a process. A process the rank forks (a DataLoader worker) does not: torch may end those itself.
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
