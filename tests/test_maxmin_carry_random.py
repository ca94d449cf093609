"""The carried max-min on random fabrics and flow sets (fixed seeds) against progressive filling in exact arithmetic,
and the flow engine carrying a component under `CARRY_FLOWS` flows (`CARRY_GIANT`) against solving every event."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from phantora.netsim import flow as flow_mod
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.maxmin import maxmin_python
from phantora.netsim.maxmin_carry import CarriedMaxMin
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

G = 10**9


def exact_filling(paths: list[tuple[int, ...]], cap: list[float]) -> list[Fraction]:
    """Progressive filling in exact arithmetic: raise every unfrozen flow's rate together; a channel whose capacity
    is used up freezes its flows at that level."""
    rate: list[Fraction | None] = [None] * len(paths)
    used = {c: Fraction(0) for p in paths for c in p}
    level = Fraction(0)
    while any(r is None for r in rate):
        live: dict[int, int] = {}
        for p, r in zip(paths, rate, strict=True):
            if r is None:
                for c in p:
                    live[c] = live.get(c, 0) + 1
        # the level at which the first channel fills: used + (level' - level) * unfrozen = capacity
        step = min((Fraction(cap[c]) - used[c]) / k for c, k in live.items())
        level += step
        for c, k in live.items():
            used[c] += step * k
        full = {c for c in live if used[c] == Fraction(cap[c])}
        for i, p in enumerate(paths):
            if rate[i] is None and any(c in full for c in p):
                rate[i] = level
    return [r for r in rate if r is not None]


def random_fabric(rng: random.Random) -> Topology:
    return leaf_spine(
        rng.randint(2, 4),
        rng.randint(2, 6),
        rng.randint(1, 3),
        nic_rate=rng.choice([100 * G, 200 * G, 400 * G]),
        oversubscription=rng.choice([1, 2, 3]),
    )


@pytest.mark.parametrize("seed", range(4))
def test_carried_rates_on_random_fabrics_are_exact_progressive_filling(seed: int) -> None:
    """Flows between random endpoints of a random leaf-spine (ECMP routes by key), two in three under a private
    rate cap, leaving and joining: after every step each carried rate is bit for bit `maxmin_python`'s from scratch
    and within 1e-12 (relative) of progressive filling in exact arithmetic, and the changes it reports are the rates
    that moved."""
    rng = random.Random(seed)
    topo = random_fabric(rng)
    eps = topo.endpoints
    cap = [topo.channel_bandwidth(c) / 8e9 for c in range(topo.num_channels)]  # bytes/ns, as the engine has them
    carrier = CarriedMaxMin(cap)
    flows: dict[int, tuple[int, ...]] = {}
    nxt = 0
    for _ in range(40):
        left = [g for g in flows if rng.random() < 0.15]
        joined = []
        for _ in range(rng.randint(0, 8)):
            src, dst = rng.sample(eps, 2)
            path = tuple(topo.route(src, dst, rng.randint(0, 1 << 16)))
            if rng.random() < 2 / 3:
                cap.append(rng.choice([5.0, 12.5, rng.uniform(0.5, 40.0)]))
                path = (*path, len(cap) - 1)
            joined.append((nxt, path))
            nxt += 1
        for g in left:
            del flows[g]
        before = {g: carrier.rate(g) for g in flows}
        flows.update(joined)
        changed = carrier.update(left, joined)
        if changed is None:  # (float rounding repeated a level: the engine starts a new carrier)
            carrier = CarriedMaxMin(cap)
            changed = carrier.update((), list(flows.items()))
            assert changed is not None
            before = {}
        ids = sorted(flows)
        got = [carrier.rate(g) for g in ids]
        paths = [flows[g] for g in ids]
        assert got == maxmin_python(paths, cap)  # bit for bit
        for r, x in zip(got, exact_filling(paths, cap), strict=True):
            assert abs(Fraction(r) - x) <= x * Fraction(1, 10**12)
        assert set(changed) == {g for g in ids if before.get(g) != carrier.rate(g)}


@pytest.mark.parametrize("seed", range(3))
def test_engine_carries_a_large_component_under_carry_flows_as_solving_every_event(seed: int) -> None:
    """An uneven all-to-all under per-pair rate caps on a random leaf-spine: one component of fewer than
    `CARRY_FLOWS` flows, which the engine carries from the event a search finds `CARRY_GIANT` of them together,
    with every rate checked against a full solve after each event (verify): the same completions, bytes and busy
    times as re-solving every active flow at every event."""
    rng = random.Random(100 + seed)
    topo = random_fabric(rng)
    eps = topo.endpoints
    flows = []
    for src in eps:
        for dst in eps:
            if src != dst:
                rate = rng.choice([0, 10 * G, 25 * G, 40 * G])
                size = rng.randint(1, 64) * 65536
                flows.append(Flow(len(flows), src, dst, size, rate_bps=rate, key=rng.randint(0, 7)))
    assert flow_mod.CARRY_GIANT <= len(flows) < flow_mod.CARRY_FLOWS
    full = FlowSimulator(topo, incremental=False)
    full.submit(flows, 0)
    want = full.drain()
    sim = FlowSimulator(topo, verify=True)
    sim.submit(flows, 0)
    assert sim.drain() == want
    assert sim.channel_bytes() == full.channel_bytes() and sim.channel_busy_ns() == full.channel_busy_ns()
    st = sim.stats()
    assert st["carried_resolves"] >= 10 and st["carry_fallbacks"] == 0  # (under CARRY_GIANT at the end: not carried)
