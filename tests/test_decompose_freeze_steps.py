"""A decomposed driver given one large batch after another (a live run's collectives, each handed over and frozen:
`gc.freeze` twice a batch) keeps the collector's permanent generation from growing with the batches: a finished
batch's objects leave it as they are freed, so it stays at the first batch's size, and `close` empties it. No
ns-3: the fake pool of tests/test_decompose_joins.py."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.decompose import DecomposedSimulator
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import SETTINGS, gpu, tiny
from tests.test_decompose_joins import END_NS, _Pool

BATCHES = 8
FLOWS = 600  # a batch; every batch is handed over (HAND_OVER_MIN 1 here) and frozen


def test_permanent_generation_does_not_grow_with_the_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("phantora.netsim.decompose.HAND_OVER_MIN", 1)
    calls = []
    real = gc.freeze

    def counted() -> None:
        calls.append(1)
        real()

    monkeypatch.setattr(gc, "freeze", counted)
    gc.unfreeze()
    topo = tiny()
    pool: Any = _Pool
    sim = DecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)
    frozen = []
    t, fid = 0, 0
    for _ in range(BATCHES):
        flows = [
            Flow(
                fid + i, gpu(topo, i % 3, i % 2), gpu(topo, (i + 1) % 3, i % 2), 4096, (fid + i - 3,) if i >= 3 else ()
            )
            for i in range(FLOWS)
        ]
        sim.submit(flows, t)
        done = sim.drain()
        # each flow gated on the one 3 before it, on the other rail's worker: it ends END_NS after that one
        assert sorted((c.flow_id, c.end_ns) for c in done) == [
            (fid + i, t + (i // 3 + 1) * END_NS) for i in range(FLOWS)
        ]
        t, fid = t + FLOWS // 3 * END_NS, fid + FLOWS
        del flows, done
        frozen.append(gc.get_freeze_count())
    assert len(calls) == 2 * BATCHES  # frozen at each batch: not vacuous
    assert frozen[0] > FLOWS  # the first freeze holds the batch's flows (and the process's objects) ...
    assert max(frozen) - frozen[0] < FLOWS // 4  # ... and later ones hold no earlier batch: no growth with batches
    sim.close()
    assert gc.get_freeze_count() == 0
