"""A decomposition worker's per-flow costs, cut without changing a value (issue 38, item 2, route (a)'s workers).

`Flow.with_deps` and `base.completion` set slots one by one; ns-3's completion bounds of 8 or more flows are read
from the C++ vector in place (`packet._rows`), its completions as packed words; a decomposition worker's layers skip
the checks its driver already made on the whole DAG (a hybrid worker's, and since the posts are trusted a plain one's:
`bridge.netserver._trust_posts`), so either driver must still refuse a bad flow itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from phantora.errors import InputError
from phantora.netsim import packet
from phantora.netsim.base import Completion, Flow, completion
from phantora.netsim.decompose import DecomposedSimulator
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import SETTINGS, gpu, tiny
from tests.test_decompose_joins import _Pool
from tests.test_packet_engine import US, star, wire_ns

G = 10**9


def test_with_deps_and_completion_equal_and_hash_as_built_by_their_class() -> None:
    f = Flow(9, 2, 3, 4096, (5, 6), 7, "t", 5, None, 100, 10**9, 11, 12)
    g = f.with_deps((1,))
    want = Flow(9, 2, 3, 4096, (1,), 7, "t", 5, None, 100, 10**9, 11, 12)
    assert g == want and hash(g) == hash(want) and type(g) is Flow
    assert f.with_deps((), 0) == Flow(9, 2, 3, 4096, (), 0, "t", 5, None, 100, 10**9, 11, 12)
    c = completion(7, 100, 1_100, 4096, 3, 5, "x", ((0, 4),))
    want_c = Completion(7, 100, 1_100, 4096, 3, 5, "x", ((0, 4),))
    assert c == want_c and hash(c) == hash(want_c) and completion(1, 2, 3, 4, 5, 6) == Completion(1, 2, 3, 4, 5, 6)
    with pytest.raises(AttributeError):  # both still frozen
        g.size = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        c.end_ns = 0  # type: ignore[misc]


@pytest.mark.ns3
def test_many_completions_and_bounds_read_in_place_are_each_flows_own(ns3_lib: Any) -> None:
    """Ten lone flows on ten disjoint host pairs end together, each at one lone flow's closed form (its packets back
    to back, the last one's second hop, two link delays), so one take reads ten records; their ids (one above
    2^63), tags and endpoints come back as given, and mid-way each bound lies between now and the flow's end."""
    n, size, payload = 10, 1_000_000, 1000
    ids = [i if i else (1 << 63) + 5 for i in range(n)]
    pkt = wire_ns(payload + 48, 100 * G)
    end = size // payload * pkt + pkt + 2 * US
    with Ns3Simulator(star(2 * n), PacketConfig()) as sim:
        sim.submit([Flow(fid, 2 * i, 2 * i + 1, size, tag=f"f{i}") for i, fid in enumerate(ids)], at=0)
        sim.advance(40_000)
        bounds = sim.completion_bounds()
        assert sorted(bounds) == sorted(ids)
        assert all(40_000 < ns <= end + 5 for ns in bounds.values()), bounds
        done = sim.advance_to_completion(1 << 62)
    assert packet._LAYOUT.get("FlowBound") is True  # (read in place, not element by element)
    assert sim._step_packed  # (the records as StepToCompletion's words: tests/test_ns3_packed_calls.py)
    assert len(done) == n
    for i, fid in enumerate(ids):
        (c,) = [c for c in done if c.flow_id == fid]
        assert (c.src, c.dst, c.size, c.tag, c.start_ns, c.lost) == (2 * i, 2 * i + 1, size, f"f{i}", 0, ())
        assert abs(c.end_ns - end) <= 5 and c.end_ns >= bounds[fid], (c, end)


@pytest.mark.parametrize("driver", [HybridDecomposedSimulator, DecomposedSimulator])
@pytest.mark.parametrize(
    ("bad", "field"),
    [({"priority": 0}, "priority"), ({"src": 10**6}, "src/dst"), ({"deps": (12345,)}, "deps")],
)
def test_the_drivers_refuse_what_their_workers_no_longer_check(bad: dict[str, Any], field: str, driver: Any) -> None:
    """The workers (route (a)'s and the plain driver's) rely on the driver's check of the whole DAG: a bad flow is
    refused at the driver's submit with a one-line error naming its field, before any worker sees it."""
    topo = tiny()
    pool: Any = _Pool
    sim = driver(topo, PacketConfig(**SETTINGS, workers=2), pool)
    try:
        args = {"id": 1, "src": gpu(topo, 0, 0), "dst": gpu(topo, 1, 0), "size": 4096, **bad}
        with pytest.raises(InputError) as err:
            sim.submit([Flow(**args)], 0)
        assert err.value.field == field and "\n" not in str(err.value)
    finally:
        sim.close()


@pytest.mark.ns3
def test_a_plain_workers_layers_trust_posts_and_still_end_a_flow_at_its_closed_form(ns3_lib: Any) -> None:
    """After a post the plain worker's NIC-latency layer and its ns-3 skip their batch checks (`_trust_posts`), and a
    lone flow posted there still ends at the closed form: posted at 0, first packet at the NIC latency L, its packets
    back to back, the last one's second hop, two link delays (as the test above, + L)."""
    from bridge.netserver import _trust_posts
    from phantora.netsim.nic_latency import NicLatencySimulator

    size, payload, lat = 1_000_000, 1000, 1_000
    pkt = wire_ns(payload + 48, 100 * G)
    end = lat + size // payload * pkt + pkt + 2 * US
    eng = NicLatencySimulator(Ns3Simulator(star(2), PacketConfig()), lat)
    try:
        assert not eng.prechecked and not eng.inner.prechecked
        _trust_posts(eng)
        assert eng.prechecked and eng.inner.prechecked
        eng.post([Flow(7, 0, 1, size)], [0])
        (c,) = eng.advance_to_completion(1 << 62)
    finally:
        eng.inner.close()
    assert (c.flow_id, c.start_ns) == (7, 0) and abs(c.end_ns - end) <= 5, (c, end)
