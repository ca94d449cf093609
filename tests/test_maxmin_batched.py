"""The flow engine solves many small components (the fluid NVLink side: one a host) as one vectorised max-min
problem: the rates, so the completions, are each component's own (closed forms), and the batched solver ran."""

from __future__ import annotations

import random

import numpy as np

from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.maxmin import NUMPY_THRESHOLD, maxmin_numpy, maxmin_python
from phantora.topology.loader import load_topology

SIZE = 900_000  # bytes: 2,000 ns alone on a 3.6 Tb/s NVLink port (450 bytes/ns)


def test_hosts_solved_together_keep_their_own_rates(solver_calls):
    topo = load_topology("leafspine1024")  # 128 hosts of 8 GPUs on one NVSwitch each, 3.6 Tb/s, 25 ns a hop
    flows: list[Flow] = []
    expect: dict[int, int] = {}
    fanned = 0
    for h in range(128):
        g = 8 * h
        k = 3 + h % 4  # GPU g sends to k GPUs of its host at once: each flow gets 1/k of g's port
        for j in range(k):
            expect[len(flows)] = k * 2_000 + 50
            flows.append(Flow(len(flows), g, g + 1 + j, SIZE))
        fanned += k
        m = 1 + h % 3  # and GPU g + 7 sends m flows to g (one path: a component of its own, closed form)
        for _ in range(m):
            expect[len(flows)] = m * 2_000 + 50
            flows.append(Flow(len(flows), g + 7, g, SIZE))
    assert fanned >= NUMPY_THRESHOLD
    calls = solver_calls
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    got = {c.flow_id: c.end_ns for c in sim.drain()}
    assert got == expect
    assert calls[0] == fanned  # the first re-solve: every host's fan in one call (the one-path flows: no solver)
    assert sim.stats()["resolves"] > 128  # counted per component, as before


def test_group_levels_give_each_group_its_own_rates():
    """`maxmin_numpy` with a group id a flow fills each group to its own level every round: lone flows get their
    channel's capacity (closed form), and random groups with ties get, bit for bit, the rates each gets alone."""
    lone = maxmin_numpy([[c] for c in range(600)], np.arange(100.0, 700.0), np.arange(600))
    assert lone.tolist() == [float(c) for c in range(100, 700)]
    rng = random.Random(7)
    paths: list[list[int]] = []
    groups: list[int] = []
    cap: list[float] = []
    alone: list[float] = []
    for g in range(300):
        base, nch = len(cap), rng.randint(1, 5)
        cap += [float(rng.choice((100, 200, 300, 450))) for _ in range(nch)]  # repeated values: ties
        mine = [[base + rng.randrange(nch) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 6))]
        paths += mine
        groups += [g] * len(mine)
        alone += maxmin_python(mine, cap)
    got = maxmin_numpy(paths, np.asarray(cap), np.asarray(groups))
    assert got.tolist() == alone
