"""The weighted max-min solvers (a flow split over several paths, `lb=spray`): closed-form shares, the vectorised
solver bit for bit the heap solver's rates on seeded random problems, and the flow engine's sprayed runs the same
whichever solver each component goes to."""

from __future__ import annotations

import random

import numpy as np
import pytest

from phantora.netsim import maxmin
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.maxmin import NUMPY_THRESHOLD, maxmin_numpy, maxmin_python, maxmin_rates
from phantora.topology.model import Topology

G = 10**9


def _both(paths, cap, weights, groups=None):
    """The heap solver's rates, after checking the vectorised solver gives them bit for bit."""
    py = maxmin_python(paths, cap, weights)
    assert maxmin_numpy(paths, np.asarray(cap), groups, weights).tolist() == py
    return py


def test_split_flow_and_single_path_flow_share_a_bottleneck():
    """Flow 0 crosses its NIC (channel 0, weight 1) and splits 50/50 over channels 1 and 2; flow 1 crosses channel 1
    alone; flow 2 crosses channel 2 alone. Channel 1 (10) saturates first, at the level where 0.5 R + R = 10, so
    flows 0 and 1 both get 10 / 1.5; flow 2 then takes what is left of channel 2 (100 - 0.5 x 10 / 1.5)."""
    paths = [(0, 1, 2), (1,), (2,)]
    weights = [(1.0, 0.5, 0.5), (1.0,), (1.0,)]
    r0, r1, r2 = _both(paths, [100.0, 10.0, 100.0], weights)
    assert r0 == pytest.approx(10 / 1.5, rel=1e-15) and r1 == pytest.approx(10 / 1.5, rel=1e-15)
    assert r2 == pytest.approx(100 - 0.5 * 10 / 1.5, rel=1e-15)


def test_split_flow_limited_by_its_nic():
    """A flow split over 4 paths of 200 each (weight 1/4 on each) with a 50 NIC; two single-path flows beside it on
    path 0. Path 0's share is 200 / 2.25 > 50, so the NIC holds the split flow at 50 first; the two others then
    share what it leaves there: (200 - 50/4) / 2 each. With path 0 at 30 instead, its share 30 / 2.25 comes first
    and holds all three flows (a congested path slows the whole split flow)."""
    paths = [(0, 1, 2, 3, 4), (1,), (1,)]
    weights = [(1.0, 0.25, 0.25, 0.25, 0.25), (1.0,), (1.0,)]
    r = _both(paths, [50.0, 200.0, 200.0, 200.0, 200.0], weights)
    assert r[0] == pytest.approx(50.0, rel=1e-15)
    assert r[1] == r[2] == pytest.approx((200 - 50 / 4) / 2, rel=1e-15)
    r = _both(paths, [50.0, 30.0, 200.0, 200.0, 200.0], weights)
    assert r[0] == r[1] == r[2] == pytest.approx(30 / 2.25, rel=1e-15)


def test_many_split_flows_one_level_each_in_groups():
    """600 independent copies (a group each, so over the vectorised threshold) of the first test at capacities
    scaled by k: every copy gets its own closed form, (10 k) / 1.5 for the split flow."""
    paths, weights, cap, groups = [], [], [], []
    for k in range(1, 201):
        b = len(cap)
        cap += [100.0 * k, 10.0 * k, 100.0 * k]
        paths += [(b, b + 1, b + 2), (b + 1,), (b + 2,)]
        weights += [(1.0, 0.5, 0.5), (1.0,), (1.0,)]
        groups += [k] * 3
    assert len(paths) >= NUMPY_THRESHOLD
    got = _both(paths, cap, weights, np.asarray(groups))
    for k in range(1, 201):
        r0, r1, r2 = got[3 * k - 3 : 3 * k]
        assert r0 == r1 == pytest.approx(10 * k / 1.5, rel=1e-15)
        assert r2 == pytest.approx(100 * k - 0.5 * 10 * k / 1.5, rel=1e-15)


@pytest.mark.parametrize("seed", range(30))
def test_vectorised_weighted_is_bitwise_the_heap_solver(seed: int):
    """Random weighted problems (shares like spray's halves, thirds and quarters, and arbitrary ones; ties): the
    vectorised solver and `maxmin_rates` give the heap solver's rates bit for bit, and they are max-min: feasible,
    and every flow crosses a saturated channel whose other flows are no faster."""
    rng = random.Random(seed)
    nch = rng.randint(1, 60)
    cap = [rng.choice([12.5, 25.0, 50.0, 3.125, rng.uniform(0.5, 60.0)]) for _ in range(nch)]
    paths, weights = [], []
    for _ in range(rng.randint(2, 400)):
        p = tuple(rng.sample(range(nch), rng.randint(1, min(6, nch))))
        paths.append(p)
        weights.append(tuple(rng.choice([1.0, 0.5, 0.25, 1 / 3, 0.125, rng.uniform(0.05, 1.0)]) for _ in p))
    py = _both(paths, cap, weights)
    assert maxmin_rates(paths, cap, weights=weights) == py
    load = [0.0] * nch
    for p, ws, r in zip(paths, weights, py, strict=True):
        for c, w in zip(p, ws, strict=True):
            load[c] += w * r
    assert all(load[c] <= cap[c] * (1 + 1e-9) for c in range(nch))
    for p, r in zip(paths, py, strict=True):
        assert any(
            load[c] >= cap[c] * (1 - 1e-9)
            and all(r >= q * (1 - 1e-9) for pp, q in zip(paths, py, strict=True) if c in pp)
            for c in p
        )


def _fabric() -> Topology:
    """4 leaves x 4 GPUs, 4 spines, 100G NICs, 50G uplinks (2:1): cross-leaf traffic crowds the spines."""
    topo = Topology("ls4")
    hosts = [topo.add_node("host") for _ in range(16)]
    leaves = [topo.add_node("switch", tier=1) for _ in range(4)]
    spines = [topo.add_node("switch", tier=2) for _ in range(4)]
    for i, h in enumerate(hosts):
        topo.add_link(h, leaves[i // 4], 100 * G, 1000)
    for a in leaves:
        for b in spines:
            topo.add_link(a, b, 50 * G, 1000)
    return topo.validate()


def _sprayed_all_to_all(monkeypatch, threshold: int):
    """A sprayed all-to-all (240 flows, sizes and starts varied) with the solver threshold set; completions."""
    monkeypatch.setattr(maxmin, "NUMPY_THRESHOLD", threshold)
    rng = random.Random(3)
    flows = [
        Flow(i * 16 + j, i, j, rng.randint(1, 40) * 100_000, delay_ns=rng.randint(0, 20_000))
        for i in range(16)
        for j in range(16)
        if i != j
    ]
    sim = FlowSimulator(_fabric(), lb="spray")
    sim.submit(flows, at=0)
    done = [(c.flow_id, c.start_ns, c.end_ns) for c in sim.drain()]
    return done, sim.stats()


def test_sprayed_engine_is_the_same_with_either_solver(monkeypatch):
    """The flow engine under lb=spray gives the same completions, to the ns, whether its components go to the
    vectorised solver (threshold 2) or to the heap solver (threshold above any component)."""
    vec, st_vec = _sprayed_all_to_all(monkeypatch, 2)
    heap, st_heap = _sprayed_all_to_all(monkeypatch, 10**9)
    assert st_vec["max_component"] >= NUMPY_THRESHOLD  # (so the default threshold sends it to numpy too)
    assert vec == heap
    assert len(vec) == 240
