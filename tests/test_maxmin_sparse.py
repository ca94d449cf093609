"""`maxmin_numpy`'s rounds on large problems (`SPARSE_ENTRIES`): each round reads only the channels at its level and
the entries of the flows it freezes, with the same floating-point operations, so the rates are bit for bit the heap
solver's and the every-entry rounds', weighted or not, one problem or several (groups); and they are max-min."""

from __future__ import annotations

import random

import numpy as np
import pytest

from phantora.netsim import maxmin
from phantora.netsim.maxmin import maxmin_numpy, maxmin_python


def _problem(seed: int, weighted: bool) -> tuple[list[tuple[int, ...]], list[float], list[tuple[float, ...]] | None]:
    """Shared channels (NICs, links) and a private cap channel a flow, caps mostly distinct (a group's pairs each
    under its own rate), some equal (ties)."""
    rng = random.Random(seed)
    shared = rng.randint(1, 40)
    cap = [rng.choice([12.5, 25.0, 50.0, rng.uniform(1.0, 60.0)]) for _ in range(shared)]
    paths, weights = [], []
    for _ in range(rng.randint(2, 300)):
        p = tuple(rng.sample(range(shared), rng.randint(1, min(4, shared))))
        if rng.random() < 0.8:  # a rate cap: its own channel
            cap.append(rng.choice([3.0, 6.25, rng.uniform(0.5, 30.0)]))
            p = (*p, len(cap) - 1)
        paths.append(p)
        weights.append(tuple(rng.choice([1.0, 0.5, 0.25, 1 / 3, rng.uniform(0.05, 1.0)]) for _ in p))
    return paths, cap, weights if weighted else None


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_sparse_rounds_are_bit_for_bit_the_heap_solvers(seed: int, weighted: bool, monkeypatch) -> None:
    paths, cap, weights = _problem(seed, weighted)
    heap = maxmin_python(paths, cap, weights)
    dense = maxmin_numpy(paths, np.asarray(cap), None, weights).tolist()
    monkeypatch.setattr(maxmin, "SPARSE_ENTRIES", 0)
    sparse = maxmin_numpy(paths, np.asarray(cap), None, weights).tolist()
    assert sparse == dense == heap
    load = [0.0] * len(cap)  # max-min: feasible, and each flow on a saturated channel where none is faster
    for p, ws, r in zip(paths, weights or [(1.0,) * len(p) for p in paths], heap, strict=True):
        for c, x in zip(p, ws, strict=True):
            load[c] += x * r
    assert all(load[c] <= cap[c] * (1 + 1e-9) for c in range(len(cap)))
    on = [[q for pp, q in zip(paths, heap, strict=True) if c in pp] for c in range(len(cap))]
    for p, r in zip(paths, heap, strict=True):
        assert any(load[c] >= cap[c] * (1 - 1e-9) and all(r >= q * (1 - 1e-9) for q in on[c]) for c in p)


def test_sparse_rounds_keep_each_groups_own_levels(monkeypatch) -> None:
    """Several problems solved as one (the flow engine's components, `groups`): each gets its own rates."""
    parts = [_problem(100 + k, False) for k in range(6)]
    paths, cap, groups, alone = [], [], [], []
    for k, (p, c, _) in enumerate(parts):
        off = len(cap)
        paths += [tuple(ch + off for ch in path) for path in p]
        cap += c
        groups += [k] * len(p)
        alone += maxmin_python(p, c)
    dense = maxmin_numpy(paths, np.asarray(cap), np.asarray(groups)).tolist()
    monkeypatch.setattr(maxmin, "SPARSE_ENTRIES", 0)
    assert maxmin_numpy(paths, np.asarray(cap), np.asarray(groups)).tolist() == dense == alone
