"""`CarriedMaxMin`: max-min carried from one solve to the next gives every rate bit for bit `maxmin_python`'s from
scratch, as flows leave and join; the closed form of processor sharing through it; and the flow engine carrying it
gives the timeline of the engine solving every event from scratch."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from fractions import Fraction

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


def _water_level(capacity: float, caps: list[float]) -> Fraction:
    """Max-min on one channel of `capacity` shared by flows under private caps, in exact arithmetic: the level L
    with sum(min(c, L)) = capacity (every flow at its cap if the caps sum to less: then the largest cap)."""
    if sum(Fraction(c) for c in caps) <= capacity:
        return Fraction(max(caps))
    rest, k = Fraction(capacity), len(caps)
    for c in sorted(caps):
        if Fraction(c) * k >= rest:
            return rest / k
        rest, k = rest - Fraction(c), k - 1
    raise AssertionError("unreachable")


def test_a_slack_channel_goes_bare_and_its_solve_runs_again_when_it_fills() -> None:
    """Flows under private caps on one channel of 100: while their caps sum to under 95 % of it the channel carries
    no states (bare), every flow at its cap; flows joining with large caps fill it, the solve runs again with its
    states, and every rate is the water level's closed form (and bit for bit a fresh solve's)."""
    cap = [100.0] + [2.0 + i for i in range(10)]  # channel 0 shared; 1..10 the caps of flows 0..9 (sum 65)
    carrier = CarriedMaxMin(cap)
    flows = {g: (0, 1 + g) for g in range(10)}
    assert carrier.update((), list(flows.items())) == {g: 2.0 + g for g in range(10)}
    assert carrier.bare == 0  # (a channel no flow crossed before is solved with its states)
    cap.append(3.5)  # flow 9 (cap 11) leaves, flow 10 (cap 3.5) joins: 57.5 of 100
    del flows[9]
    flows[10] = (0, 11)
    assert carrier.update([9], [(10, flows[10])]) == {10: 3.5}
    assert carrier.bare == 1 and carrier.redone == 0  # channel 0 is bare
    cap.extend([40.0, 50.0])  # two flows capped at 40 and 50: 147.5 asked of 100
    joined = [(11, (0, 12)), (12, (0, 13))]
    flows.update(joined)
    got = carrier.update((), joined)
    assert carrier.redone == 1 and carrier.bare == 0  # not slack after: solved again with its states
    level = _water_level(100.0, [cap[p[1]] for p in flows.values()])
    assert level == (100 - Fraction(57.5)) / 2  # every small flow at its cap, the two large ones share the rest
    assert got == {11: float(level), 12: float(level)}
    ids = sorted(flows)
    assert [carrier.rate(g) for g in ids] == maxmin_python([flows[g] for g in ids], cap)
    del flows[11]
    assert carrier.update([11], []) == {12: 42.5}  # 100 - 57.5 left, under flow 12's cap of 50


@pytest.mark.parametrize("seed", range(12))
def test_bare_channels_under_churn_give_a_fresh_solves_rates(seed: int) -> None:
    """Wide channels of many flows, most under private caps, with flows leaving and joining so that the wide
    channels go from slack to full and back: every rate bit for bit `maxmin_python`'s from scratch after every step,
    bare channels and solves run again both met."""
    rng = random.Random(seed)
    cap = [rng.choice([40.0, 60.0, 100.0]) for _ in range(4)]
    flows: dict[int, tuple[int, ...]] = {}
    carrier, nxt, bare, redone = CarriedMaxMin(cap), 0, 0, 0
    for _ in range(150):
        left = [g for g in flows if rng.random() < 0.1]
        joined = []
        for _ in range(rng.randint(0, 6)):
            cap.append(rng.choice([1.0, 2.5, rng.uniform(0.5, 12.0)]))
            joined.append((nxt, (*rng.sample(range(4), rng.randint(1, 2)), len(cap) - 1)))
            nxt += 1
        for g in left:
            del flows[g]
        flows.update(joined)
        changed = carrier.update(left, joined)
        if changed is None:
            carrier = CarriedMaxMin(cap)
            if carrier.update((), list(flows.items())) is None:
                continue
        ids = sorted(flows)
        assert [carrier.rate(g) for g in ids] == (maxmin_python([flows[g] for g in ids], cap) if ids else [])
        bare = max(bare, carrier.bare)
        redone = max(redone, carrier.redone)
    assert bare >= 1 and redone >= 1
