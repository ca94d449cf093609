"""`CarriedMaxMin`: max-min carried from one solve to the next gives every rate bit for bit `maxmin_python`'s from
scratch, as flows leave and join; the closed form of processor sharing through it; and the flow engine carrying it
gives the timeline of the engine solving every event from scratch."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from phantora.netsim import flow as flow_mod
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.maxmin import maxmin_python
from phantora.netsim.maxmin_carry import CarriedMaxMin
from tests.test_flow_engine_random import leaf_spine, random_batches, simulate

G = 10**9


def _churn(seed: int, shared: int, steps: int) -> tuple[int, int]:
    """Flows over `shared` channels, most under a private rate cap (distinct levels, some equal), leaving and
    joining at random; after each step every rate is compared with a from-scratch solve. Returns (steps solved,
    steps the carrier gave up on: a level that did not rise)."""
    rng = random.Random(seed)
    cap = [rng.choice([12.5, 25.0, 50.0, 3.0, rng.uniform(1.0, 60.0)]) for _ in range(shared)]
    flows: dict[int, tuple[int, ...]] = {}
    carrier, solved, gave_up, nxt = CarriedMaxMin(cap), 0, 0, 0
    for _ in range(steps):
        left = [g for g in flows if rng.random() < 0.12]
        joined = []
        for _ in range(rng.randint(0, 5)):
            p = tuple(rng.sample(range(shared), rng.randint(1, min(4, shared))))
            if rng.random() < 0.7:
                cap.append(rng.choice([3.0, 6.25, rng.uniform(0.5, 30.0)]))
                p = (*p, len(cap) - 1)
            joined.append((nxt, p))
            nxt += 1
        for g in left:
            del flows[g]
        flows.update(joined)
        before = {g: carrier.rate(g) for g in flows if g not in dict(joined)}
        changed = carrier.update(left, joined)
        if changed is None:  # (a new carrier, as the flow engine makes one)
            gave_up += 1
            carrier = CarriedMaxMin(cap)
            changed = carrier.update((), list(flows.items()))
            if changed is None:
                continue
        ids = sorted(flows)
        expect = maxmin_python([flows[g] for g in ids], cap) if ids else []
        assert [carrier.rate(g) for g in ids] == expect  # bit for bit
        assert len(carrier) == len(flows)
        # the changes it reports are exactly the rates that moved (and every flow that joined)
        moved = {g for g in ids if g not in before or before[g] != carrier.rate(g)}
        assert set(changed) == moved and all(changed[g] == carrier.rate(g) for g in changed)
        solved += 1
    return solved, gave_up


@pytest.mark.parametrize("seed", range(30))
def test_carried_rates_are_bit_for_bit_a_fresh_solves(seed: int) -> None:
    solved, gave_up = _churn(seed, shared=30, steps=120)
    assert solved >= 110 and gave_up <= 2


def test_carried_rates_with_many_ties() -> None:
    """Few channels of small capacities: many flows at equal levels, rounds of several channels at once."""
    solved = gave_up = 0
    for seed in range(40):
        s, g = _churn(1000 + seed, shared=6, steps=80)
        solved, gave_up = solved + s, gave_up + g
    assert solved >= 0.98 * 40 * 80 and gave_up <= 0.01 * 40 * 80


def test_processor_sharing_closed_form() -> None:
    """n flows into one channel of capacity C: each gets C/n; as the smallest leaves, the others get C/(n-1)...
    The carrier gives those rates exactly where progressive filling gives them as one division."""
    cap = [100.0, 400.0, 400.0]
    n = 8
    carrier = CarriedMaxMin(cap)
    got = carrier.update((), [(g, (1 + g % 2, 0)) for g in range(n)])  # two uplinks, one shared downlink
    assert got == {g: 100.0 / n for g in range(n)}
    for k in range(n - 1):
        got = carrier.update([k], [])
        assert got == {g: 100.0 / (n - k - 1) for g in range(k + 1, n)}
    # a flow joining a path with a cap of its own below its share: the others share what it leaves
    cap.append(20.0)
    got = carrier.update((), [(n, (1, 0, 3))])
    assert got == {n: 20.0, n - 1: 80.0}
    # a path through a channel twice (the solvers count it twice) is not carried
    assert CarriedMaxMin(cap).update((), [(0, (1, 0, 1))]) is None


def test_engine_carrying_max_min_gives_processor_sharing_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flows of sizes s1 < s2 < ... from distinct hosts into one 100G host: processor sharing, closed form
    t_i = t_(i-1) + (s_i - s_(i-1)) (n - i + 1) / C, each end rounded up to whole ns, plus the path latency."""
    monkeypatch.setattr(flow_mod, "CARRY_FLOWS", 2)
    topo = leaf_spine(1, 8, 1, 400 * G)
    eps = topo.endpoints
    sizes = [10_000 * (i + 1) ** 2 for i in range(6)]
    flows = [Flow(i, eps[2 + i], eps[0], s, (), 0, f"f{i}") for i, s in enumerate(sizes)]
    sim = FlowSimulator(topo)
    sim.submit(flows, 0)
    out = {c.flow_id: c for c in sim.drain()}
    assert sim.stats()["carried_resolves"] >= len(sizes) - 1
    cap = 100 * G / 8e9  # bytes/ns
    t, prev = 0.0, 0
    for i, s in enumerate(sizes):
        t += (s - prev) * (len(sizes) - i) / cap
        prev = s
        lat = sim.route(flows[i])[1]
        assert abs(out[i].end_ns - lat - t) <= 1 + 1e-9 * t
        assert out[i].end_ns - lat >= math.floor(t)


@pytest.mark.parametrize("seed", [1, 2, 3, 6])
def test_engine_carrying_max_min_equals_solving_every_event(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random DAG traffic with deps, delays and rate caps on a leaf-spine: carried from the first flow on (every
    event solved by the carrier, checked against a full solve after each), the same completions, bytes and busy
    times as re-solving every active flow at every event."""
    fabric = leaf_spine(3, 4, 2, 100 * G)
    rng = random.Random(seed)
    batches = [
        (at, [f if rng.random() < 0.5 else replace(f, rate_bps=rng.choice([5, 20, 40]) * G) for f in b])
        for at, b in random_batches(seed, fabric)
    ]
    full, st_full = simulate(fabric, batches, incremental=False)
    monkeypatch.setattr(flow_mod, "CARRY_FLOWS", 1)
    carried, st = simulate(fabric, batches, verify=True)
    assert carried == full
    assert st["bytes"] == st_full["bytes"] and st["busy"] == st_full["busy"]
    assert st["carried_resolves"] >= 0.9 * st["resolves"] and st["rate_changes"] == st_full["rate_changes"]
