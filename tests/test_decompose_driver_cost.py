"""The decomposition driver's per-flow and per-completion costs, cut without changing a value (issue 38, item 2).

Completions and flows decoded from columns are built a column at a time (`bridge.columns._by_column`); route (a)'s
driver places a flow from its endpoint pair's summary, computed once per pair (`HybridDecomposedSimulator._placed`);
a large submit freezes the process's objects out of the collector's full passes until `close`. No ns-3: the fake
pool of tests/test_decompose_joins.py.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from bridge.columns import completions_from_columns, completions_to_columns, flows_from_columns, flows_to_columns
from phantora.netsim.base import Completion, Flow
from phantora.netsim.decompose import DecomposedSimulator, WorkerDiedError
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.pieces import route_in_piece
from tests.test_decompose import L_NS, SETTINGS, gpu, tiny
from tests.test_decompose_joins import END_NS, _Pool


def test_a_decoded_completion_equals_and_hashes_as_one_built_by_its_class() -> None:
    want = Completion(7, 100, 1_100, 4096, 3, 5, "x")
    (c,) = completions_from_columns(completions_to_columns([want]))
    assert c == want and hash(c) == hash(want) and c.lost == () and type(c) is Completion
    with pytest.raises(AttributeError):  # still frozen
        c.end_ns = 0  # type: ignore[misc]
    done = [want, Completion(8, 0, 9, 10, 1, 2, "", ((0, 4),))]
    assert completions_from_columns(completions_to_columns(done)) == done


def test_a_decoded_flow_equals_and_hashes_as_one_built_by_its_class() -> None:
    values = (9, 2, 3, 4096, (5, 6), 7, "t", 5, None, 100, 10**9, 11, 12)
    want = Flow(*values)
    (f,) = flows_from_columns(flows_to_columns([want]))
    assert f == want and hash(f) == hash(want) and type(f) is Flow and f.with_deps((1,)).deps == (1,)
    with pytest.raises(AttributeError):  # still frozen
        f.size = 0  # type: ignore[misc]


def test_route_a_places_each_flow_as_its_own_route_gives() -> None:
    """Worker and least time of fabric and NVLink flows, two sizes on each pair (the pair's summary keeps no size):
    fabric, L + the route's propagation + size at its bottleneck; NVLink, size at the fastest channel leaving the
    source - 2 ns + the least latency of one."""
    topo = tiny()
    pool: Any = _Pool
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)
    out = {c: topo.channel_ends(c) for c in range(topo.num_channels)}
    for size in (4096, 1_000_003, 4096):
        for k, (a, b) in enumerate([(gpu(topo, 0, 0), gpu(topo, 1, 0)), (gpu(topo, 2, 1), gpu(topo, 0, 1))]):
            f = Flow(10 * size + k, a, b, size)
            piece, path = route_in_piece(topo, sim.pieces, f)
            least = L_NS + topo.path_latency_ns(path) + size * 8_000_000_000 // topo.path_bottleneck_bps(path)
            assert sim._placed(f) == (sim._piece_worker[piece], least)
        a, b = gpu(topo, 1, 0), gpu(topo, 1, 1)  # one host's two GPUs: NVLink
        bw = max(topo.channel_bandwidth(c) for c, (x, _) in out.items() if x == a)
        lat = min(topo.channel_latency(c) for c, (x, _) in out.items() if x == a)
        f = Flow(10 * size + 5, a, b, size)
        nv = topo.shared_nvswitch(a, b)
        assert sim._placed(f) == (sim._nv_worker[nv], max(0, size * 8_000_000_000 // bw - 2) + lat)
        assert f.id in sim._zero  # no lookahead
    sim.close()


@pytest.mark.parametrize("least", [1, 10**9])
def test_a_large_submit_freezes_until_close(monkeypatch: pytest.MonkeyPatch, least: int) -> None:
    monkeypatch.setattr("phantora.netsim.decompose.HAND_OVER_MIN", least)
    gc.unfreeze()
    topo = tiny()
    pool: Any = _Pool
    sim = DecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)
    flows = [Flow(i, gpu(topo, i % 3, 0), gpu(topo, (i + 1) % 3, 0), 4096, delay_ns=100 * i) for i in range(5)]
    sim.submit(flows, 0)
    assert (gc.get_freeze_count() > 0) == (least == 1)  # a batch of at least HAND_OVER_MIN flows only
    assert {c.flow_id: c.end_ns for c in sim.drain()} == {i: 100 * i + END_NS for i in range(5)}
    sim.close()
    assert gc.get_freeze_count() == 0


class _DyingPool(_Pool):
    """The fake pool whose worker 0 dies in the first round (the hand-over of a large submit)."""

    def round(self, posts: dict[int, Any]) -> Any:
        raise WorkerDiedError("worker 0 (pid 0) exited with 9")


def test_a_submit_that_fails_leaves_nothing_frozen_without_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """The freeze is process-wide: a submit that raises after freezing undoes it itself, so a caller that drops the
    engine without closing it (the freeze would keep a cycle holding it from the collector) leaves none behind."""
    monkeypatch.setattr("phantora.netsim.decompose.HAND_OVER_MIN", 1)
    gc.unfreeze()
    topo = tiny()
    pool: Any = _DyingPool
    sim = DecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)
    flows = [Flow(i, gpu(topo, i % 3, 0), gpu(topo, (i + 1) % 3, 0), 4096) for i in range(5)]
    with pytest.raises(WorkerDiedError, match="worker 0"):
        sim.submit(flows, 0)
    assert gc.get_freeze_count() == 0
    sim.close()
    assert gc.get_freeze_count() == 0
