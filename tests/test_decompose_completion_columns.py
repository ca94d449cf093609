"""Route (a)'s driver keeps a reply's completions as columns (issue 38, item 2: `CompletionColumns`): its books read
ids and ends, the `Completion` objects are built (and the other columns checked) when handed out, and `drain` builds
them while the workers run the next round. Every object must be the one its row describes, in the driver's order; a
drain must return what one engine returns, field for field and in order, and what stepping one completion time at a
time returns."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bridge.columns import completion_columns, completions_to_columns
from bridge.errors import ProtocolError
from bridge.workers import spawn_workers
from phantora.netsim.base import Completion
from phantora.netsim.completion_columns import ROW_BY_ROW_MAX, CompletionColumns, completions_of
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import SETTINGS, rail_dag, tiny


def _batch() -> CompletionColumns:
    """Three rows, the middle one with lost ranges."""
    return CompletionColumns(
        [7, 3, 9], [0, 5, 10], [100, 100, 250], [1000, 2000, 3000], [1, 2, 3], [4, 5, 6], ["a", "b", "c"],
        {1: ((0, 64), (512, 64))},
    )  # fmt: skip


def test_a_row_builds_the_completion_it_describes() -> None:
    cols = _batch()
    want = [
        Completion(7, 0, 100, 1000, 1, 4, "a"),
        Completion(3, 5, 100, 2000, 2, 5, "b", ((0, 64), (512, 64))),
        Completion(9, 10, 250, 3000, 3, 6, "c"),
    ]
    assert cols.built() == want and list(cols) == want and len(cols) == 3
    assert cols.built([2, 0]) == [want[2], want[0]]
    assert cols.built([1, 0, 2]) == [want[1], want[0], want[2]]  # (every row, not in order: gathered, not reused)
    assert cols[1] == want[1] and cols[-1] == want[2] and cols[1:] == want[1:]
    assert cols[1].lost_bytes == 128 and hash(cols[0]) == hash(want[0])
    with pytest.raises(IndexError):
        cols[3]


def test_few_rows_and_many_build_the_same_completions() -> None:
    """Fewer rows than `ROW_BY_ROW_MAX` are built one by one, more a column at a time: each is its row's, either
    way, lost ranges included, and a row past the batch raises."""
    n = 2 * ROW_BY_ROW_MAX + 1
    lost = {3: ((0, 64),), n - 2: ((128, 32), (512, 64))}
    cols = CompletionColumns(
        [100 + i for i in range(n)], list(range(n)), [10 * i for i in range(n)], [64 * i for i in range(n)],
        [i % 8 for i in range(n)], [(i + 1) % 8 for i in range(n)], [f"t{i}" for i in range(n)], lost,
    )  # fmt: skip

    def row(i: int) -> Completion:
        return Completion(100 + i, i, 10 * i, 64 * i, i % 8, (i + 1) % 8, f"t{i}", lost.get(i, ()))

    for rows in (range(n), range(2, 6), [n - 2, 3, 0], range(1, 1 + ROW_BY_ROW_MAX), range(ROW_BY_ROW_MAX - 1)):
        assert cols.built(rows) == [row(i) for i in rows]
    assert cols.built([3])[0].lost_bytes == 64 and cols.built([n - 2])[0].lost_bytes == 96
    with pytest.raises(IndexError):
        cols.built([n])
    with pytest.raises(IndexError):
        cols.built(range(n - 1, n + 1))
    with pytest.raises(IndexError):
        cols.built(range(n + 1))


def test_refs_come_back_in_their_order_from_any_batch() -> None:
    a, b = _batch(), CompletionColumns([20], [1], [300], [64], [0], [1], ["m"])
    marker = Completion(50, 120, 120, 0, 2, 2, "marker")
    got = completions_of([(a, 2), marker, (b, 0), (a, 0)])
    assert got == [a.built([2])[0], marker, Completion(20, 1, 300, 64, 0, 1, "m"), a.built([0])[0]]
    assert got[1] is marker
    assert completions_of([]) == []


def test_columns_from_the_wire_are_kept_and_checked() -> None:
    done = _batch().built()
    cols = completion_columns(completions_to_columns(done))
    assert isinstance(cols, CompletionColumns) and cols.ids == [7, 3, 9] and cols.ends == [100, 100, 250]
    assert cols.built() == done
    assert completions_to_columns(cols) == completions_to_columns(done)  # (columns out without building)
    bad = completions_to_columns(done)
    bad["end"][1] = 1.5  # (the books read ids and ends: checked at once)
    with pytest.raises(ProtocolError, match="bad column 'end'"):
        completion_columns(bad)
    bad = completions_to_columns(done)
    bad["tag"][1] = 5  # (the other columns before the first object is built)
    late = completion_columns(bad)
    assert late.ids == [7, 3, 9]
    with pytest.raises(ProtocolError, match="'tag' must hold strings"):
        late.built([0])
    bad = completions_to_columns(done)
    bad["size"].pop()
    with pytest.raises(ProtocolError, match="different lengths"):
        completion_columns(bad)


def _fields(done: list[Any]) -> list[tuple[Any, ...]]:
    return [dataclasses.astuple(c) for c in done]


@pytest.mark.slow  # one engine and two runs on two worker processes loading ns-3 (about 10 CPU s)
def test_a_drain_equals_one_engine_in_order_and_stepping_a_time_at_a_time() -> None:
    topo = tiny()
    flows = rail_dag(topo, stages=4)
    handed: list[int] = []

    class Counted(HybridDecomposedSimulator):
        def _while_round(self) -> None:
            handed.append(sum(len(rows) for _, rows in self._handed or ()))  # (segments of the buffer's runs)
            super()._while_round()

    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    try:
        one.submit(flows, 0)
        want = _fields(one.drain())
    finally:
        one.close()
    sim = Counted(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)  # type: ignore[arg-type]
    try:
        sim.submit(flows, 0)
        drained = sim.drain()
        now = sim.now()
    finally:
        sim.close()
    stepped: list[Completion] = []
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)  # type: ignore[arg-type]
    try:
        sim.submit(flows, 0)
        while sim.in_flight():
            got = sim.advance_to_completion(2**62)
            assert got and len({c.end_ns for c in got}) == 1 and sim.now() == got[0].end_ns
            stepped += got
        stepped_now = sim.now()
    finally:
        sim.close()
    assert _fields(drained) == want and len(want) == len(flows)
    assert _fields(stepped) == want and now == stepped_now == max(c.end_ns for c in drained)
    assert all(type(c) is Completion for c in drained)
    # (not vacuous: most of them were built while the workers ran a later round, the last round's after it)
    assert sum(handed) > len(flows) // 2
