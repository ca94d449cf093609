"""Route (a)'s driver takes a reply's completion bounds at once (issue 38, item 2: `HybridDecomposedSimulator._bounds`
sets the rises at C speed and notes them in their chains' `Chain.raised` only when a chain bound is next read, where
it raised them one call each). A flow's bound after a reply must be the most of its bound and every bound the reply
gave it, in the driver's books, in the gating flows' arrays and in its chain's rises; and with real workers every
completion must be one engine's, field for field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bridge.workers import spawn_workers
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import SETTINGS, rail_dag, shared_rails, tiny


class _NoRounds:
    """A pool that is never asked for a round: the books alone."""

    def __init__(self, _topo: Any, _config: Any, assignment: list[list[int]], *_: Any) -> None:
        self.workers = [type("H", (), {"index": i, "pid": 0, "pieces": p})() for i, p in enumerate(assignment)]
        self.curve = False

    def keepalive(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_a_replys_bounds_raise_each_flow_to_the_most_it_was_given() -> None:
    topo = tiny()
    flows = rail_dag(topo, stages=4)
    pool: Any = _NoRounds
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)
    sim.submit(flows, 0)
    gates = sim._gate_bounds()
    before = dict(sim._lb)
    raised_before = {id(ch): set(ch.raised) for ch, _ in sim._chain_of.values()}
    ids = sorted(before)
    up, down = ids[::3], ids[1::3]  # every third flow rises, every third after it is given a lower bound
    twice = up[0]  # and one is given two bounds in the reply: the higher counts, though it comes first
    flat: list[int] = [twice, before[twice] + 5000]
    for k, f in enumerate(up):
        flat += [f, before[f] + 1000 + k]
    for f in down:
        flat += [f, before[f] - 1]
    sim._bounds(flat)
    want = dict(before)
    for k, f in enumerate(up):
        want[f] = before[f] + 1000 + k
    want[twice] = before[twice] + 5000
    assert sim._lb == want
    gates._catch_up()  # (the arrays take the rises at the next horizon)
    idx, hit = gates._where(ids)
    assert gates.lb[idx].tolist() == [want[ids[h]] for h in hit.tolist()]
    assert len(idx) > 0 and sorted(gates.raised.tolist()) == sorted(set(gates.raised.tolist()))
    sim._note_rises()  # (the chains' rises, as `_pulled` reads them)
    rose = set(up)
    for ch, _ in sim._chain_of.values():
        positions = {p for p, f in enumerate(ch.nodes) if f in rose}
        assert set(ch.raised) == raised_before[id(ch)] | positions
        assert len(ch.raised) == len(set(ch.raised))


def _all_fields(done: list[Any]) -> list[tuple[Any, ...]]:
    return sorted(dataclasses.astuple(c) for c in done)


@pytest.mark.slow  # two worker processes loading ns-3, twice (about 8 CPU s)
@pytest.mark.parametrize("dag", ["shared_rails", "rail_dag"])
def test_route_a_equals_one_engine_field_for_field_as_bounds_rise(dag: str) -> None:
    topo = tiny()
    flows = shared_rails(topo) if dag == "shared_rails" else rail_dag(topo, stages=4)
    rises = []

    class Counted(HybridDecomposedSimulator):
        def _bounds(self, flat: list[int]) -> None:
            rises.append(sum(ns > self._lb.get(f, ns) for f, ns in zip(flat[0::2], flat[1::2], strict=True)))
            super()._bounds(flat)

    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    try:
        one.submit(flows, 0)
        want = _all_fields(one.drain())
    finally:
        one.close()
    sim = Counted(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)  # type: ignore[arg-type]
    try:
        sim.submit(flows, 0)
        got = _all_fields(sim.drain())
    finally:
        sim.close()
    assert got == want
    assert len(got) == len(flows)
    assert sum(rises) > 0  # (not vacuous: the workers' bounds raised flows' bounds)
