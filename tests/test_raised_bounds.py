"""`RaisedBounds`: a worker's completion bounds that rose since its last report, against the rule written out."""

from __future__ import annotations

import random

import numpy as np
import pytest

from phantora.netsim import raised_bounds
from phantora.netsim.raised_bounds import RaisedBounds


def _rule(last: dict[int, int], ids: list[int], ns: list[int]) -> list[int]:
    """The report by its definition: each flow, in its order, whose bound is new or above the last report's."""
    return [x for fid, b in zip(ids, ns, strict=True) if fid not in last or b > last[fid] for x in (fid, b)]


def test_closed_form_rounds() -> None:
    rb = RaisedBounds()
    assert rb.update(np.array([7, 3, 5]), np.array([100, 0, 50])) == [7, 100, 3, 0, 5, 50]  # all new (0 too)
    assert rb.update(np.array([5, 3, 9]), np.array([50, 10, 0])) == [3, 10, 9, 0]  # 5 stays, 3 rose, 9 new
    assert rb.update(np.array([7]), np.array([100])) == [7, 100]  # 7 left the last report: new again
    assert rb.update(np.array([], np.int64), np.array([], np.int64)) == []
    assert rb.update(np.array([7]), np.array([99])) == [7, 99]


@pytest.mark.parametrize("base", [0, 2**40])  # dense ids, and ids past DENSE_MAX (the dict) from the first round on
def test_random_rounds_against_the_rule(base: int) -> None:
    rng = random.Random(38)
    rb, last = RaisedBounds(), {}
    for _ in range(200):
        ids = rng.sample(range(base, base + 300), rng.randrange(0, 120))
        ns = [rng.choice([last.get(i, 0), last.get(i, 0) + rng.randrange(0, 3), rng.randrange(0, 2**50)]) for i in ids]
        got = rb.update(np.array(ids, np.uint64), np.array(ns, np.int64))
        assert got == _rule(last, ids, ns)
        assert all(type(x) is int for x in got)
        last = dict(zip(ids, ns, strict=True))


def test_dense_then_sparse(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id past `DENSE_MAX` in a later round: the last report carried over into the dict."""
    monkeypatch.setattr(raised_bounds, "DENSE_MAX", 64)
    rb = RaisedBounds()
    assert rb.update(np.array([3, 9]), np.array([10, 20])) == [3, 10, 9, 20]
    assert rb.update(np.array([9, 100, 3]), np.array([20, 5, 11])) == [100, 5, 3, 11]
    assert rb.update(np.array([100, 3]), np.array([5, 11])) == []


def test_the_dense_array_stays_within_dense_max(monkeypatch: pytest.MonkeyPatch) -> None:
    """The array grows by doubling, but never past `DENSE_MAX` ids (the memory bound its docstring gives): ids up to
    40, then up to 50, with `DENSE_MAX` 64, keep 64 entries at most (before: 82, twice 41)."""
    monkeypatch.setattr(raised_bounds, "DENSE_MAX", 64)
    rb = RaisedBounds()
    assert rb.update(np.array([40]), np.array([7])) == [40, 7]
    assert rb.update(np.array([50, 40]), np.array([8, 7])) == [50, 8]
    assert rb._last.size <= 64
    assert rb.update(np.array([63, 50]), np.array([9, 9])) == [63, 9, 50, 9]  # the last dense id
    assert rb._last.size == 64 and rb._sparse is None


def test_unequal_columns_refused() -> None:
    with pytest.raises(ValueError, match="2 ids for 1 ns"):
        RaisedBounds().update(np.array([1, 2]), np.array([5]))
