"""Seeded random cross-checks of the flow engine: solver paths agree, incremental == full, determinism."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from phantora.netsim import maxmin
from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.maxmin import maxmin_numpy, maxmin_python, maxmin_rates
from phantora.topology.model import Topology

G = 10**9


def random_problem(rng: random.Random) -> tuple[list[tuple[int, ...]], list[float]]:
    nch = rng.randint(1, 40)
    cap = [rng.choice([12.5, 25.0, 50.0, 3.125, rng.uniform(0.5, 60.0)]) for _ in range(nch)]
    paths = [tuple(rng.sample(range(nch), rng.randint(1, min(5, nch)))) for _ in range(rng.randint(1, 120))]
    return paths, cap


def assert_maxmin(paths: list[tuple[int, ...]], cap: list[float], rate: list[float]) -> None:
    """The definition: feasible, and every flow crosses a saturated channel on which no flow is faster."""
    load = [0.0] * len(cap)
    for p, r in zip(paths, rate, strict=True):
        assert r > 0
        for c in p:
            load[c] += r
    assert all(load[c] <= cap[c] * (1 + 1e-9) for c in range(len(cap)))
    fastest = [0.0] * len(cap)
    for p, r in zip(paths, rate, strict=True):
        for c in p:
            fastest[c] = max(fastest[c], r)
    for p, r in zip(paths, rate, strict=True):
        assert any(load[c] >= cap[c] * (1 - 1e-9) and r >= fastest[c] * (1 - 1e-9) for c in p)


@pytest.mark.parametrize("seed", range(40))
def test_solvers_agree_and_are_maxmin(seed: int) -> None:
    rng = random.Random(seed)
    paths, cap = random_problem(rng)
    py = maxmin_python(paths, cap)
    assert maxmin_numpy(paths, np.asarray(cap)).tolist() == py  # bitwise
    assert maxmin_rates(paths, cap) == py
    assert_maxmin(paths, cap, py)


def test_components_solve_independently() -> None:
    """Solving two channel-disjoint problems together (in any order) gives bitwise the rates of each alone."""
    rng = random.Random(7)
    for _ in range(20):
        p1, c1 = random_problem(rng)
        p2, c2 = random_problem(rng)
        shifted = [tuple(c + len(c1) for c in p) for p in p2]
        both = maxmin_python(p1 + shifted, c1 + c2)
        assert both == maxmin_python(p1, c1) + maxmin_python(p2, c2)
        assert maxmin_numpy(shifted + p1, np.asarray(c1 + c2)).tolist() == maxmin_python(p2, c2) + maxmin_python(p1, c1)


def leaf_spine(leaves: int, per_leaf: int, spines: int, up_bps: int) -> Topology:
    """Small two-tier fabric with 100G NICs, a 25G straggler NIC, and `up_bps` uplinks."""
    topo = Topology("ls")
    hosts = [topo.add_node("host") for _ in range(leaves * per_leaf)]
    lf = [topo.add_node("switch", tier=1) for _ in range(leaves)]
    sp = [topo.add_node("switch", tier=2) for _ in range(spines)]
    for i, h in enumerate(hosts):
        topo.add_link(h, lf[i // per_leaf], 25 * G if i == 1 else 100 * G, 500 + 100 * (i % 3))
    for a in lf:
        for b in sp:
            topo.add_link(a, b, up_bps, 1000)
    return topo.validate()


def random_batches(seed: int, topo: Topology, n: int = 300) -> list[tuple[int, list[Flow]]]:
    """Batches of flows at increasing times, with deps on earlier flows, delays, markers and shared keys."""
    rng = random.Random(seed)
    eps = topo.endpoints
    batches: list[tuple[int, list[Flow]]] = []
    t, fid = 0, 0
    while fid < n:
        batch = []
        for _ in range(rng.randint(1, 40)):
            src, dst = rng.choice(eps), rng.choice(eps)
            earlier = range(max(0, fid - 60), fid)
            deps = tuple(rng.sample(earlier, min(len(earlier), rng.choice([0, 0, 1, 2])))) if fid else ()
            size = rng.choice([0, 1, 1500, 64 * 1024, rng.randint(1, 4 * 10**6)])
            key = rng.choice([None, rng.randint(0, 5)])
            batch.append(Flow(fid, src, dst, size, deps, rng.choice([0, 0, 300]), f"f{fid}", key=key))
            fid += 1
        batches.append((t, batch))
        t += rng.randint(0, 200_000)
    return batches


def simulate(topo: Topology, batches: list[tuple[int, list[Flow]]], **kw: object) -> tuple[list[Completion], dict]:
    sim = FlowSimulator(topo, **kw)
    out: list[Completion] = []
    for at, flows in batches:
        out += sim.advance(at)
        sim.submit(flows, at)
    out += sim.drain()
    return out, sim.stats() | {"bytes": sim.channel_bytes(), "busy": sim.channel_busy_ns()}


@pytest.fixture(scope="module")
def fabric() -> Topology:
    return leaf_spine(3, 4, 2, 100 * G)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_equals_full_resolve(fabric: Topology, seed: int) -> None:
    batches = random_batches(seed, fabric)
    inc, st_inc = simulate(fabric, batches, verify=True)  # asserts rates == full solve after every event
    full, st_full = simulate(fabric, batches, incremental=False)
    assert inc == full
    assert st_inc["bytes"] == st_full["bytes"] and st_inc["busy"] == st_full["busy"]
    assert st_inc["resolved_flows"] < st_full["resolved_flows"]
    assert 0 < st_inc["giant_resolves"] < st_inc["resolves"]  # both the component search and its fallback ran


def test_numpy_solver_inside_the_engine_gives_the_same_timeline(
    fabric: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = random_batches(4, fabric)
    ref, _ = simulate(fabric, batches)
    monkeypatch.setattr(maxmin, "NUMPY_THRESHOLD", 2)
    assert simulate(fabric, batches)[0] == ref


def test_no_flow_beats_its_line_rate_and_bytes_are_conserved(fabric: Topology) -> None:
    batches = random_batches(5, fabric)
    out, st = simulate(fabric, batches)
    flows = {f.id: f for _, b in batches for f in b}
    assert sorted(c.flow_id for c in out) == sorted(flows)
    carried = 0
    for c in out:
        f = flows[c.flow_id]
        if f.size == 0 or f.src == f.dst:
            assert c.end_ns == c.start_ns
            continue
        path = fabric.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
        fastest = math.ceil(f.size * 8 * G / fabric.path_bottleneck_bps(path) - 1e-6)
        assert c.end_ns - c.start_ns >= fastest + fabric.path_latency_ns(path)
        carried += f.size * len(path)
    assert sum(st["bytes"]) == carried


def test_dependents_start_after_their_deps_arrive(fabric: Topology) -> None:
    batches = random_batches(6, fabric)
    out, _ = simulate(fabric, batches)
    end = {c.flow_id: c.end_ns for c in out}
    start = {c.flow_id: c.start_ns for c in out}
    for at, flows in batches:
        for f in flows:
            assert start[f.id] == max([at, *(end[d] for d in f.deps)]) + f.delay_ns


def test_deterministic_and_independent_of_batch_order(fabric: Topology) -> None:
    batches = random_batches(8, fabric)
    first, _ = simulate(fabric, batches)
    assert simulate(fabric, batches)[0] == first
    rng = random.Random(0)
    shuffled = [(at, rng.sample(flows, len(flows))) for at, flows in batches]
    assert simulate(fabric, shuffled)[0] == first
