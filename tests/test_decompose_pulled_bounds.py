"""The plain decomposition driver's bounds pulled where they are read (`phantora.netsim.pulled_bounds`) equal the walk
that pushes every rise down the DAG: on random DAGs (tests/random_dags.py), each flow's bound after every event, and
every round's horizon, rounds and completions on two ns-3 workers (and one engine's completions)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from bridge.workers import spawn_workers
from phantora.netsim import decompose
from phantora.netsim.base import Flow
from phantora.netsim.decompose import DecomposedSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.pulled_bounds import Wide, pull
from phantora.topology.generators import rail_optimized
from phantora.topology.model import Topology
from tests.random_dags import gpus_by_host, rail_batches, random_dag, run_batches, tiny_rails


class Books:
    """One DAG's bounds kept both ways: pushed by the driver's own walk (`DecomposedSimulator._raise` over waiting
    lists) and pulled (C, deps lists, `pull`), fed the same events."""

    def __init__(self) -> None:
        self.push: Any = object.__new__(DecomposedSimulator)  # (only its bound dicts: `_raise` reads no more)
        self.push._lb, self.push._dependents, self.push._step = {}, {}, {}
        self.c: dict[int, int] = {}
        self.up: dict[int, tuple[int, ...]] = {}
        self.step: dict[int, int] = {}
        self.ends: dict[int, int] = {}
        self.memo: dict[int, int] = {}
        self.wide: Wide = {}

    def book(self, f: Flow, at: int, step: int) -> None:
        """A flow posted at `at` whose least time after its last dep is `step` (as `DecomposedSimulator._book`)."""
        lbs, waiting = self.push._lb, self.push._dependents
        a = lb = c = at
        alive = False
        for d in dict.fromkeys(f.deps):
            if d in self.ends:
                a = max(a, self.ends[d])
                continue
            alive = True
            lb, c = max(lb, lbs[d]), max(c, self.c[d])
            waiting.setdefault(d, []).append(f.id)
        self.push._step[f.id] = self.step[f.id] = step
        lbs[f.id] = max(a, lb) + step
        self.c[f.id] = max(a, c) + step
        if alive:
            self.up[f.id] = f.deps
        self.memo, self.wide = {}, {}

    def bound(self, fid: int, ns: int) -> None:
        """A worker's completion bound of `fid` (as `_bounds`)."""
        if ns > self.push._lb[fid]:
            self.push._raise(fid, ns)
        self.c[fid] = max(self.c[fid], ns)
        self.memo, self.wide = {}, {}

    def end(self, fid: int, ns: int) -> None:
        """`fid` ends at `ns` (as `_arrived`: its dependents raised to ns + their step, pushed on)."""
        push = self.push
        del push._lb[fid], push._step[fid], self.c[fid], self.step[fid]
        self.up.pop(fid, None)
        self.ends[fid] = ns
        for j in push._dependents.pop(fid, ()):
            if j in push._step:
                push._raise(j, ns + push._step[j])
        self.memo, self.wide = {}, {}

    def pulled(self, fid: int, need: int | None = None) -> int:
        if need is None:
            return pull(fid, self.c, self.ends, self.up, self.step, self.memo, self.wide)
        return pull(fid, self.c, self.ends, self.up, self.step, self.memo, self.wide, need)


@pytest.mark.parametrize("seed", range(6))
def test_pulled_bounds_equal_the_pushed_walk_after_every_event(seed: int) -> None:
    rng = random.Random(seed)
    hosts = gpus_by_host(rail_optimized(4, 4, 1))
    books = Books()
    flows: list[Flow] = []
    now = 0
    pulls = 0
    for batch in range(4):
        before = [f for f in books.c]
        new = random_dag(rng, hosts, 1000 * batch, 150, before, markers=0.1, wide=0.1)
        for f in new:
            books.book(f, now, rng.randint(0, 5_000))
        flows += new
        for _ in range(400):
            live = list(books.c)
            if not live:
                break
            if rng.random() < 0.6:
                f = rng.choice(live)
                books.bound(f, books.push._lb[f] + rng.randint(-500, 3_000))
            else:  # (a flow whose deps have all ended)
                f = rng.choice([g for g in live if all(d in books.ends for d in books.up.get(g, ()))])
                books.end(f, books.push._lb[f] + rng.randint(0, 2_000))
                now = max(now, books.ends[f])
            for g in rng.sample(live, min(len(live), 20)):  # (reads in any order, memoised in between)
                if g in books.c:
                    lb = books.push._lb[g]
                    need = lb + rng.randint(-3_000, 3_000)  # (below it: L exactly; else a lower bound, >= need)
                    v = books.pulled(g, need)
                    assert v == lb if v < need else need <= v <= lb, (seed, batch, g, need)
                    assert books.pulled(g) == lb, (seed, batch, g)
                    pulls += 1
        for g in books.c:
            assert books.pulled(g) == books.push._lb[g]
    assert pulls > 1000 and len(books.ends) > 300  # (it walked: bounds rose and flows ended under dependents)


L_NS = 1000
SETTINGS = {"cc": "dcqcn", "nvlink": "fluid", "nic_latency": L_NS, "payload_bytes": 4096, "header_bytes": 62}


def _run(topo: Topology, workers: int, pulls: bool, first: list[Flow], second: list[Flow]) -> tuple[list, list]:
    """Two batches (the second 30 us in) on `workers` decomposition workers; (completions, every round's (horizon,
    least end the caller reacts to))."""
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=workers)), topo, spawner=spawn_workers)
    rounds: list[tuple[int, int]] = []
    try:
        if workers:
            packet = sim.packet
            packet.pulls_bounds = pulls
            horizon = packet._horizon

            def recorded(until: int) -> int:
                h = horizon(until)
                rounds.append((h, packet._react_ns))
                return h

            packet._horizon = recorded
        done = run_batches(sim, first, second)
    finally:
        sim.close()
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done), rounds


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_every_rounds_horizon_pulled_equals_the_pushed_walks_and_one_engine(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = tiny_rails()
    first, second = rail_batches(random.Random(100 + seed), 80)
    count = [0]

    def counted(*args: Any) -> int:
        count[0] += 1
        return pull(*args)

    monkeypatch.setattr(decompose, "pull", counted)
    pulled, pulled_rounds = _run(topo, 2, True, first, second)
    assert count[0] > 0  # (the pulled runs pulled)
    pushed, pushed_rounds = _run(topo, 2, False, first, second)
    one, _ = _run(tiny_rails(), 0, True, first, second)
    assert len(pulled_rounds) > 3
    assert pulled_rounds == pushed_rounds
    assert pulled == pushed == one
    assert len(one) == len(first) + len(second)
