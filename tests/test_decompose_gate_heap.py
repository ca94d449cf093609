"""Route (a)'s driver keeps its gating flows in heaps across rounds (issue 38, item 2), one per owner, gated worker
and lookahead (none, or L - 1), not listed and sorted each round: `_horizon` must still read them in the order of
(bound, id) a sort gives, stop where none can lower a worker's limit, and keep one entry per unfinished gating flow in
each heap it belongs to (a marker's gate: every worker's)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.workers import spawn_workers
from phantora.netsim.decompose import DRIVER
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator, _Targets
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import SETTINGS, rail_dag, tiny


def test_targets_hand_each_set_flow_over_once() -> None:
    t = _Targets()
    t.setdefault(3, set()).add((0, False))
    t.setdefault(1, set()).add((1, True))
    t.setdefault(3, set()).add((1, False))  # (a second target: handed over again, to enter that worker's heap)
    assert t == {3: {(0, False), (1, False)}, 1: {(1, True)}}
    assert t.taken() == [3, 1] and t.taken() == []
    t.setdefault(1, set()).add((0, True))
    assert t.taken() == [1]


class _Recording(HybridDecomposedSimulator):
    """The driver, recording for each horizon the gating flows it pulled, with their bounds as the round began."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.walks: list[list[tuple[int, int]]] = []
        self._entry: dict[int, int] | None = None

    def _horizon(self, until: int) -> int:
        self._entry = {f: self._lb[f] for f in self._ext}
        self.walks.append([])
        try:
            return super()._horizon(until)
        finally:
            self._entry = None
            n = len(self._out)
            for k, heap in enumerate(self._gate_heaps):
                u, v, z = (k >> 1) // n, (k >> 1) % n, bool(k & 1)  # (u's flows gating v's, no lookahead for z)
                live = [f for _, f in heap if f in self._ext]
                gating = [
                    f
                    for f in self._ext
                    if self._owner[f] == u and any(w in (v, DRIVER) and y == z for w, y in self._gate_targets[f])
                ]
                assert sorted(live) == sorted(gating)  # one entry per unfinished flow gating them, none lost
                assert all(lb <= self._lb[f] for lb, f in heap if f in self._ext)  # keys never above

    def _pulled(self, fid: int, floors: list[int], memo: dict[int, int], wide: dict[int, int], need: int) -> int:
        if self._entry is not None and fid in self._entry and fid not in self._watch:
            self.walks[-1].append((self._entry[fid], fid))
        return super()._pulled(fid, floors, memo, wide, need)


@pytest.mark.slow  # two worker processes loading ns-3 (about 4 CPU s)
def test_horizon_reads_gating_flows_in_bound_order() -> None:
    topo = tiny()
    flows = rail_dag(topo, stages=4)
    sim = _Recording(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)  # type: ignore[arg-type]
    try:
        sim.submit(flows, 0)
        assert len(sim.drain()) == len(flows)
    finally:
        sim.close()
    assert sum(len(w) >= 2 for w in sim.walks) >= 2  # (not vacuous: rounds that pulled several gating flows)
    for walk in sim.walks:
        assert walk == sorted(walk) and len(set(walk)) == len(walk)
