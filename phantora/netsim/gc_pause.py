"""The cyclic garbage collector's policy for a run's long-lived processes (`use_run_policy`), and `gc_paused` for a
block that makes many objects and no garbage cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Generation 0 collected every 100,000 net container allocations, not CPython's 700; generations 1 and 2 as CPython
# has them (a full pass still waits for a quarter more long-lived objects, so cycles are collected as before).
RUN_THRESHOLDS = (100_000, 10, 10)


def use_run_policy() -> None:
    """The policy of a run's long-lived process (the coordinator, the network server, `phantora` commands): collect
    once, move every object alive after set-up (modules, the topology, the engine) out of the collector's passes
    (`gc.freeze`), and collect generation 0 at `RUN_THRESHOLDS`. The collector stays on throughout, so garbage
    cycles made later are still freed; `gc_paused` does nothing under this policy."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*RUN_THRESHOLDS)


def run_policy_on() -> bool:
    """Whether this process runs under `use_run_policy`."""
    return gc.get_threshold() == RUN_THRESHOLDS


def policy_line() -> str:
    """The collector's state as a log line: thresholds and objects frozen, read from `gc`."""
    name = "the run policy" if run_policy_on() else "not the run policy"
    return f"cyclic GC: {name}, thresholds {gc.get_threshold()}, {gc.get_freeze_count():,} objects frozen"


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC for the block (as it was after), unless the process runs under `use_run_policy`: a full
    pass walks every object alive, and passes come each time a quarter more objects survive, so a block that
    builds millions (an event loop's books, a plan's flows) pays passes that collect nothing (about 40 % of the
    flow engine's loop on big DAGs, half of planning the 1024-GPU step's graph). Around many short blocks (an
    event each) a pause costs instead: what a block made is still counted, and the first allocation after it pays
    the collections the block put off (23.8 % of the 128-rank live MoE dispatch's coordinator); the run policy's
    threshold makes those rare without a pause."""
    if run_policy_on():
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Freezer:
    """Moves a block's objects out of the collector's full passes (`freeze`, as often as the block likes) and back
    (`thaw`), leaving the frozen set as it found it where CPython allows: `gc.unfreeze` thaws every frozen object,
    not some, so if objects were frozen before the first `freeze` (the run policy's set-up, a caller's own), `thaw`
    leaves all frozen, the caller's as they were and the block's with them (still freed by reference counting;
    only their cycles wait)."""

    def __init__(self) -> None:
        self._found: int | None = None  # objects frozen when the first freeze came; None: nothing frozen by us

    def freeze(self) -> None:
        """Everything alive now out of the collector's full passes."""
        if self._found is None:
            self._found = gc.get_freeze_count()
        gc.freeze()

    def thaw(self) -> None:
        """Back to the collector what `freeze` froze, if nothing else was frozen before it (above)."""
        found, self._found = self._found, None
        if found == 0:
            gc.unfreeze()
