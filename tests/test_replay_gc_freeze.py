"""`run_engine`'s freeze of a large DAG (phantora/replay.py, `gc_pause.Freezer`): the DAG is out of the collector's
full passes while it runs, and the process's frozen set is as the caller had it after, as far as CPython allows."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from phantora.netsim.base import Completion, Flow
from phantora.netsim.decompose import FREEZE_MIN
from phantora.replay import run_engine


class Probe:
    """An engine that runs nothing and notes the objects frozen while it drains."""

    def __init__(self) -> None:
        self.frozen_in_drain = -1

    def now(self) -> int:
        return 0

    def submit(self, flows: list[Flow], at: int) -> None:
        pass

    def drain(self) -> list[Completion]:
        self.frozen_in_drain = gc.get_freeze_count()
        return []


class Node:
    """A garbage cycle once dropped: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def thawed() -> Iterator[None]:
    """Nothing frozen before the test, nothing after (the freeze is process-wide)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def dag() -> list[Flow]:
    return [Flow(i, 0, 1, 1) for i in range(FREEZE_MIN)]


def test_a_dag_frozen_by_the_run_alone_is_thawed_after(thawed: None) -> None:
    sim: Any = Probe()
    flows = dag()
    run_engine(sim, flows)
    assert sim.frozen_in_drain > len(flows)  # the DAG was frozen while it ran ...
    assert gc.get_freeze_count() == 0  # ... and nothing is frozen after, as before


def test_objects_a_caller_froze_stay_frozen(thawed: None) -> None:
    """Before `Freezer`, the run's `gc.unfreeze` thawed the caller's objects too (the run policy's set-up under
    `phantora replay`): a garbage cycle the caller froze was then collected."""
    node = Node()
    ref = weakref.ref(node)
    gc.freeze()  # the caller's
    del node
    frozen = gc.get_freeze_count()
    sim: Any = Probe()
    run_engine(sim, dag())
    assert sim.frozen_in_drain > frozen + FREEZE_MIN
    gc.collect()
    assert ref() is not None  # still frozen: not collected
    # a thaw would leave none of the caller's objects frozen; refcounting may still free a few frozen objects
    assert gc.get_freeze_count() >= 0.99 * frozen
    gc.unfreeze()
    gc.collect()
    assert ref() is None  # a cycle the collector frees once thawed: the check above could fail


def test_a_small_dag_freezes_nothing(thawed: None) -> None:
    sim: Any = Probe()
    run_engine(sim, dag()[: FREEZE_MIN - 1])
    assert sim.frozen_in_drain == 0
