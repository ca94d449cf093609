"""The flow engine's closed form for a component of flows on one path, each under its own rate cap or none
(`one_path_capped_rates`: an NVLink GPU pair's channels under NCCL's caps), against progressive filling
(`maxmin_python`) bit for bit and against hand-solved rates, and in the engine with its re-solves verified."""

from __future__ import annotations

import random

from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator, _Active, one_path_capped_rates
from phantora.netsim.maxmin import maxmin_python
from phantora.topology.loader import load_topology


def recs(path: tuple[int, ...], caps: list[float | None], cap: list[float]) -> list[_Active]:
    """One record a flow on `path`, each capped flow on a fresh pseudo-channel appended to `cap`."""
    out = []
    for i, c in enumerate(caps):
        ch = -1
        if c is not None:
            ch = len(cap)
            cap.append(c)
        out.append(_Active(Flow(i, 0, 1, 1000), path, 0, 0, None, ch))
    return out


def test_hand_solved_rates() -> None:
    cap = [100.0, 120.0]
    # caps 10 and 20 bind; the 70 left of the tighter channel goes half and half to the two at 50
    assert one_path_capped_rates(recs((0, 1), [10.0, 20.0, 50.0, 50.0], cap), cap) == [10.0, 20.0, 35.0, 35.0]
    cap = [100.0, 120.0]
    # every cap binds below the fair share 25; an uncapped flow takes the 100 - 30 left
    assert one_path_capped_rates(recs((1, 0), [10.0, None, 20.0], cap), cap) == [10.0, 70.0, 20.0]
    cap = [90.0]
    assert one_path_capped_rates(recs((0,), [30.0, 30.0, 30.0], cap), cap) == [30.0, 30.0, 30.0]  # a tie: all at once


def test_other_components_are_left_to_the_solver() -> None:
    cap = [100.0, 100.0, 100.0]
    rs = recs((0, 1), [10.0, None], cap)
    rs.append(_Active(Flow(9, 0, 1, 1000), (0, 2), 0, 0, None, -1))
    assert one_path_capped_rates(rs, cap) is None
    cap = [100.0, 100.0]
    assert one_path_capped_rates(recs((0, 1, 0), [10.0], cap), cap) is None  # a channel twice


def test_bit_for_bit_progressive_filling() -> None:
    """Random paths, capacities and caps (ties among caps and with the path's share on purpose)."""
    rng = random.Random(7)
    for _ in range(3000):
        nch = rng.randint(1, 3)
        cap = [rng.choice([rng.uniform(1, 500), 450.0 * 0.96, 100.0]) for _ in range(nch)]
        path = tuple(rng.sample(range(nch), rng.randint(1, nch)))
        n = rng.randint(1, 14)
        pool = [rng.uniform(1, 120) for _ in range(3)] + [min(cap[c] for c in path) / n]
        caps = [None if rng.random() < 0.2 else rng.choice(pool) for _ in range(n)]
        rs = recs(path, caps, cap)
        want = maxmin_python([r.solve_path for r in rs], cap)
        assert one_path_capped_rates(rs, cap) == want, (path, cap, caps)


def test_engine_verified_against_full_solves() -> None:
    """Capped NVLink flows of one GPU pair starting and ending at different times, through the engine with every
    incremental re-solve checked against a full one (`verify`), end where their caps say."""
    topo = load_topology("testbed16")
    a, b = topo.endpoints[0], topo.endpoints[1]
    caps = [80_000_000_000, 160_000_000_000, 400_000_000_000, None, 400_000_000_000]
    flows = [Flow(i, a, b, 1 << 20, rate_bps=c or 0, delay_ns=300 * i) for i, c in enumerate(caps)]
    sim = FlowSimulator(topo, verify=True)
    sim.submit(flows, at=0)
    done = {c.flow_id: c for c in sim.drain()}
    path, lat = sim.route(flows[0])
    # the 80 Gb/s flow alone on the pair is bound by its cap all along: (1 MiB x 8 / 80 Gb/s) + propagation
    assert done[0].end_ns - done[0].start_ns == -(-(1 << 20) * 8 * 1_000_000_000 // 80_000_000_000) + lat
    assert sim.stats()["flows_completed"] == 5
