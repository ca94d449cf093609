"""Flow-level engine against closed forms: line rate, fair shares, hand-solved max-min, dependencies."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import Flow, NetworkSimulator
from phantora.netsim.flow import CausalityError, FlowSimulator
from phantora.netsim.idset import DENSE_LIMIT, IdSet
from phantora.topology.model import Topology

G = 10**9
LAT = 1000


def build(links: list[tuple[str, str, int]], lat: int = LAT) -> tuple[Topology, dict[str, int]]:
    """Topology from (a, b, bits/s) links; names starting with 's' are switches, others hosts."""
    topo = Topology("test")
    ids: dict[str, int] = {}
    for a, b, _ in links:
        for name in (a, b):
            if name not in ids:
                ids[name] = topo.add_node("switch" if name.startswith("s") else "host", name)
    for a, b, bw in links:
        topo.add_link(ids[a], ids[b], bw, lat)
    return topo.validate(), ids


def tx_ns(size: int, bps: int | Fraction) -> int:
    """Closed-form serialisation time, rounded up to whole ns (exact rational arithmetic)."""
    return math.ceil(Fraction(size * 8 * G) / Fraction(bps))


def run(topo: Topology, flows: list[Flow], **kw: object) -> dict[int, tuple[int, int]]:
    sim = FlowSimulator(topo, **kw)
    sim.submit(flows, at=0)
    return {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}


def test_is_a_network_simulator() -> None:
    topo, _ = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G)])
    assert isinstance(FlowSimulator(topo), NetworkSimulator)


@pytest.mark.parametrize("size", [1, 1_000_000, 1_234_567, 3 * 2**30])
def test_single_flow_gets_line_rate(size: int) -> None:
    topo, n = build([("h0", "s0", 100 * G), ("s0", "h1", 100 * G)])
    done = run(topo, [Flow(1, n["h0"], n["h1"], size)])
    assert done[1] == (0, tx_ns(size, 100 * G) + 2 * LAT)


def test_payload_efficiency_scales_capacity() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("s0", "h1", 100 * G)])
    done = run(topo, [Flow(1, n["h0"], n["h1"], 1_234_567)], payload_efficiency=0.8)
    assert done[1][1] == tx_ns(1_234_567, 80 * G) + 2 * LAT


def test_slowest_link_sets_the_rate() -> None:
    topo, n = build([("h0", "s0", 400 * G), ("s0", "s1", 25 * G), ("s1", "h1", 100 * G)])
    done = run(topo, [Flow(1, n["h0"], n["h1"], 10**7)])
    assert done[1][1] == tx_ns(10**7, 25 * G) + 3 * LAT


@pytest.mark.parametrize("k", [2, 3, 7])
def test_k_flows_sharing_a_link_get_one_kth(k: int) -> None:
    links = [(f"h{i}", "s0", 100 * G) for i in range(k)] + [("s0", "dst", 100 * G)]
    topo, n = build(links)
    done = run(topo, [Flow(i, n[f"h{i}"], n["dst"], 1_000_000) for i in range(k)])
    expect = tx_ns(1_000_000 * k, 100 * G) + 2 * LAT  # each at B/k: k * S / B
    assert all(done[i] == (0, expect) for i in range(k))


def test_staggered_flows_share_then_speed_up() -> None:
    """A alone for 40 us, then A and B at half rate, then B alone: piecewise closed form."""
    topo, n = build([("a", "s0", 100 * G), ("b", "s0", 100 * G), ("s0", "d", 100 * G)])
    sim = FlowSimulator(topo)
    sim.submit([Flow(1, n["a"], n["d"], 1_000_000)], at=0)
    assert sim.advance(40_000) == []
    sim.submit([Flow(2, n["b"], n["d"], 1_000_000)], at=40_000)
    done = {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}
    # A: 500 kB alone (40 us at 12.5 B/ns), 500 kB at 6.25 B/ns (80 us) -> tx end 120 us.
    # B: 500 kB at 6.25 B/ns until 120 us, then 500 kB alone (40 us) -> tx end 160 us.
    assert done == {1: (0, 120_000 + 2 * LAT), 2: (40_000, 160_000 + 2 * LAT)}
    assert sim.now() == 162_000


def test_flow_bottlenecked_elsewhere_leaves_its_share() -> None:
    """X is held to 25G past the shared 100G link, so Y and Z split the other 75G."""
    topo, n = build(
        [("h0", "sA", 100 * G), ("h1", "sA", 100 * G), ("h2", "sA", 100 * G), ("sA", "sB", 100 * G)]
        + [("sB", "h3", 25 * G), ("sB", "h4", 100 * G), ("sB", "h5", 100 * G)]
    )
    size = 9_375_000
    flows = [Flow(1, n["h0"], n["h3"], size), Flow(2, n["h1"], n["h4"], size), Flow(3, n["h2"], n["h5"], size)]
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    sim.advance(0)
    assert sim.rates() == {1: 25 / 8, 2: 37.5 / 8, 3: 37.5 / 8}
    done = {c.flow_id: c.end_ns for c in sim.drain()}
    # Y, Z: size / 37.5G; X keeps 25G (its own bottleneck) when they leave.
    assert done == {1: tx_ns(size, 25 * G) + 3 * LAT, 2: tx_ns(size, 37.5 * G) + 3 * LAT, 3: done[2]}
    assert done[2] == 2_000_000 + 3 * LAT and done[1] == 3_000_000 + 3 * LAT


def test_parking_lot() -> None:
    """A long flow over three hops, one short flow per hop: all at C/2 until the shorts leave."""
    topo, n = build(
        [("s0", "s1", 100 * G), ("s1", "s2", 100 * G), ("s2", "s3", 100 * G)]
        + [("L", "s0", 100 * G), ("s3", "Ld", 100 * G)]
        + [(f"a{i}", f"s{i}", 100 * G) for i in range(3)]
        + [(f"s{i + 1}", f"b{i}", 100 * G) for i in range(3)]
    )
    s = 1_250_000  # S / 6.25 B/ns = 200 us
    flows = [Flow(10, n["L"], n["Ld"], 4 * s)] + [Flow(i, n[f"a{i}"], n[f"b{i}"], (i + 1) * s) for i in range(3)]
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    sim.advance(0)
    assert set(sim.rates().values()) == {50 / 8}
    done = {c.flow_id: c.end_ns for c in sim.drain()}
    # Shorts end at 200, 400, 600 us; the long flow has 3S done by 600 us and sends S alone (100 us).
    assert done == {0: 200_000 + 3 * LAT, 1: 400_000 + 3 * LAT, 2: 600_000 + 3 * LAT, 10: 700_000 + 5 * LAT}


def test_three_level_maxmin() -> None:
    """Hand-solved: L2 (10G) gives flows 3,4 5G; flow 1 stops at its 10G exit; flow 2 takes L1's 15G rest."""
    fast = 1000 * G
    topo, n = build(
        [("h1", "sA", fast), ("h2", "sA", fast), ("h3", "sA", fast), ("sA", "sB", 30 * G)]
        + [("sB", "d1", 10 * G), ("sB", "d2", fast), ("sB", "sC", 10 * G), ("sC", "d3", fast)]
        + [("h4", "sB", fast), ("sC", "d4", fast)]
    )
    sizes = {1: 1_000_000, 2: 1_500_000, 3: 500_000, 4: 500_000}  # all take 800 us at their max-min rate
    flows = [Flow(i, n[f"h{i}"], n[f"d{i}"], sizes[i]) for i in sizes]
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    sim.advance(0)
    assert sim.rates() == {1: 10 / 8, 2: 15 / 8, 3: 5 / 8, 4: 5 / 8}
    done = {c.flow_id: c.end_ns for c in sim.drain()}
    assert done == {1: 803_000, 2: 803_000, 3: 804_000, 4: 803_000}


def _two_leaves(spines: int, uplink_bps: int, per_leaf: int = 8) -> tuple[Topology, list[int], list[int]]:
    links = [(f"a{i}", "s_l0", 100 * G) for i in range(per_leaf)] + [
        (f"b{i}", "s_l1", 100 * G) for i in range(per_leaf)
    ]
    for k in range(spines):
        links += [("s_l0", f"s_sp{k}", uplink_bps), ("s_l1", f"s_sp{k}", uplink_bps)]
    topo, n = build(links)
    return topo, [n[f"a{i}"] for i in range(per_leaf)], [n[f"b{i}"] for i in range(per_leaf)]


def test_oversubscribed_leaf_spine_slows_cross_leaf_traffic_4x() -> None:
    """8 x 100G hosts per leaf over one 200G uplink: cross-leaf flows get 25G, intra-leaf keep 100G."""
    topo, left, right = _two_leaves(1, 200 * G)
    size = 10**7
    cross = [Flow(i, left[i], right[i], size) for i in range(8)]
    done = run(topo, cross)
    full_rate = tx_ns(size, 100 * G)
    assert {e for _, e in done.values()} == {4 * full_rate + 4 * LAT}
    intra = [Flow(100 + i, left[i], left[(i + 1) % 8], size) for i in range(8)]
    done = run(topo, intra)
    assert {e for _, e in done.values()} == {full_rate + 2 * LAT}


def test_oversubscribed_leaf_spine_with_ecmp() -> None:
    """4 spines x 50G: a cross-leaf flow gets 50G / (flows ECMP put on its spine), capped by its 100G NIC."""
    topo, left, right = _two_leaves(4, 50 * G)
    size = 10**7
    flows = [Flow(i, left[i], right[i], size) for i in range(8)]
    spine_of = {f.id: topo.channel_ends(topo.route(f.src, f.dst, f.id)[1])[1] for f in flows}
    load = {s: list(spine_of.values()).count(s) for s in set(spine_of.values())}
    done = run(topo, flows)
    for f in flows:
        rate = min(Fraction(100 * G), Fraction(50 * G, load[spine_of[f.id]]))
        assert done[f.id][1] == tx_ns(size, rate) + 4 * LAT


def test_dependency_chain_adds_up() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G), ("h2", "s0", 100 * G)])
    a, b = 1_000_000, 3_000_001
    flows = [
        Flow(1, n["h0"], n["h1"], a),
        Flow(2, n["h1"], n["h2"], b, deps=(1,)),
        Flow(3, n["h2"], n["h0"], a, deps=(2,), delay_ns=777),
        Flow(4, n["h0"], n["h0"], 0, deps=(3,), delay_ns=500),  # marker: its delay only
    ]
    done = run(topo, flows)
    e1 = tx_ns(a, 100 * G) + 2 * LAT
    e2 = e1 + tx_ns(b, 100 * G) + 2 * LAT
    e3 = e2 + 777 + tx_ns(a, 100 * G) + 2 * LAT
    assert done == {1: (0, e1), 2: (e1, e2), 3: (e2 + 777, e3), 4: (e3 + 500, e3 + 500)}


def test_dependency_waits_for_latest_dep_and_submit_time() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G), ("h2", "s0", 100 * G)])
    sim = FlowSimulator(topo)
    sim.submit([Flow(1, n["h0"], n["h1"], 1_000_000), Flow(2, n["h1"], n["h2"], 10)], at=0)
    assert [c.flow_id for c in sim.advance(3000)] == [2]
    # Flow 3 depends on a running flow and on one already done: starts when flow 1 arrives.
    sim.submit([Flow(3, n["h1"], n["h0"], 10, deps=(1, 2))], at=3000)
    # Flow 4 has no deps but is submitted for the future.
    sim.submit([Flow(4, n["h2"], n["h0"], 0, delay_ns=5)], at=500_000)
    done = {c.flow_id: c for c in sim.drain()}
    assert done[3].start_ns == done[1].end_ns == 80_000 + 2 * LAT
    assert (done[4].start_ns, done[4].end_ns) == (500_005, 500_005)


@pytest.mark.parametrize("n_ranks", [2, 4, 8])
def test_coarse_ring_all_reduce_matches_nccl_formula(n_ranks: int) -> None:
    topo, n = build([(f"h{i}", "s0", 100 * G) for i in range(n_ranks)])
    size = 2**30
    edge = 2 * (n_ranks - 1) * size // n_ranks
    flows = [Flow(i, n[f"h{i}"], n[f"h{(i + 1) % n_ranks}"], edge) for i in range(n_ranks)]
    done = run(topo, flows)
    assert max(e for _, e in done.values()) == tx_ns(edge, 100 * G) + 2 * LAT


def test_stepped_ring_all_reduce_pays_latency_every_step() -> None:
    """One chunk per step, each step waiting on the previous arrival: 2(n-1) x (S/n / B + path latency)."""
    k = 4
    topo, n = build([(f"h{i}", "s0", 100 * G) for i in range(k)])
    size = 4_000_000
    flows, prev = [], []
    for _ in range(2 * (k - 1)):
        cur = []
        for r in range(k):
            deps = (prev[(r - 1) % k],) if prev else ()
            fid = len(flows)
            flows.append(Flow(fid, n[f"h{r}"], n[f"h{(r + 1) % k}"], size // k, deps))
            cur.append(fid)
        prev = cur
    done = run(topo, flows)
    assert max(e for _, e in done.values()) == 2 * (k - 1) * (tx_ns(size // k, 100 * G) + 2 * LAT)


def test_completions_are_ordered_and_time_queries_agree() -> None:
    """All three start at 6.25 B/ns (each shares a channel); 5 ends first, then 3 and 9 tie."""
    topo, n = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G), ("h2", "s0", 100 * G)])
    sim = FlowSimulator(topo)
    sim.submit([Flow(9, n["h0"], n["h2"], 1000), Flow(3, n["h1"], n["h2"], 1000), Flow(5, n["h0"], n["h1"], 500)], 0)
    assert sim.in_flight() == 3
    assert sim.next_event_time() == 0
    assert sim.advance(10) == []
    assert sim.now() == 10 and sim.in_flight() == 3
    assert sim.next_event_time() == 80  # 500 B at 6.25 B/ns
    out = sim.drain()
    assert [(c.flow_id, c.end_ns) for c in out] == [(5, 80 + 2 * LAT), (3, 160 + 2 * LAT), (9, 160 + 2 * LAT)]
    assert sim.in_flight() == 0 and sim.next_event_time() is None and sim.now() == 160 + 2 * LAT


def test_channel_bytes_and_busy_time() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("s0", "h1", 100 * G)])
    sim = FlowSimulator(topo)
    sim.submit([Flow(1, n["h0"], n["h1"], 1_000_000)], at=0)
    sim.drain()
    path = topo.route(n["h0"], n["h1"], 1)
    used = {c: b for c, b in enumerate(sim.channel_bytes()) if b}
    assert used == dict.fromkeys(path, 1_000_000)
    busy = sim.channel_busy_ns()
    assert [busy[c] for c in path] == [80_000, 80_000] and sum(busy) == 160_000
    rows = {u.channel: u for u in sim.channel_usage(elapsed_ns=160_000)}
    assert set(rows) == set(path) and all(u.utilisation == pytest.approx(0.5) for u in rows.values())


def test_bad_input_names_the_flow() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G)])
    sim = FlowSimulator(topo)
    h0, h1 = n["h0"], n["h1"]
    with pytest.raises(InputError, match="flow 1: duplicate"):
        sim.submit([Flow(1, h0, h1, 10), Flow(1, h0, h1, 10)], at=0)
    with pytest.raises(InputError, match="unknown flow 42"):
        sim.submit([Flow(2, h0, h1, 10, deps=(42,))], at=0)
    with pytest.raises(InputError, match="cycle"):
        sim.submit([Flow(3, h0, h1, 10, deps=(4,)), Flow(4, h0, h1, 10, deps=(3,))], at=0)
    with pytest.raises(InputError, match="cycle"):  # a self-dep in an otherwise ordered batch
        sim.submit([Flow(3, h0, h1, 10), Flow(4, h0, h1, 10, deps=(3, 4))], at=0)
    with pytest.raises(InputError, match="unknown flow 42"):  # after flows in order
        sim.submit([Flow(3, h0, h1, 10), Flow(4, h0, h1, 10, deps=(3, 42))], at=0)
    with pytest.raises(InputError, match="not an endpoint"):
        sim.submit([Flow(5, h0, n["s0"], 10)], at=0)
    with pytest.raises(InputError, match="size"):
        sim.submit([Flow(6, h0, h1, -1)], at=0)
    with pytest.raises(InputError, match="payload_efficiency"):
        FlowSimulator(topo, payload_efficiency=1.5)
    assert sim.in_flight() == 0  # rejected batches leave nothing behind


def test_unroutable_flow_is_rejected_at_submit() -> None:
    topo = Topology("split")
    a, s0, b = topo.add_node("host"), topo.add_node("switch"), topo.add_node("host")
    c, s1 = topo.add_node("host"), topo.add_node("switch")
    topo.add_link(a, s0, 100 * G, LAT)
    topo.add_link(b, s0, 100 * G, LAT)
    topo.add_link(c, s1, 100 * G, LAT)
    sim = FlowSimulator(topo)
    with pytest.raises(InputError, match="flow 7: no route"):
        sim.submit([Flow(7, a, c, 100)], at=0)


def test_time_never_goes_back() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G)])
    sim = FlowSimulator(topo)
    sim.advance(1000)
    with pytest.raises(CausalityError):
        sim.submit([Flow(1, n["h0"], n["h1"], 10)], at=999)
    with pytest.raises(AssertionError):  # CausalityError is also an AssertionError
        sim.advance(10)


def test_drain_limit() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G)])
    sim = FlowSimulator(topo)
    sim.submit([Flow(1, n["h0"], n["h1"], 10**9)], at=0)
    with pytest.raises(PhantoraError, match="did not drain by 1000 ns"):
        sim.drain(limit_ns=1000)


def test_id_set_covers_dense_sparse_and_negative_ids() -> None:
    ids = IdSet()
    for i in (0, 7, 8, 1_000_003, DENSE_LIMIT, 2**40, -5, 7):
        ids.add(i)
    assert len(ids) == 7
    assert all(i in ids for i in (0, 7, 8, 1_000_003, DENSE_LIMIT, 2**40, -5))
    assert not any(i in ids for i in (1, 9, 1_000_002, DENSE_LIMIT + 1, 2**40 + 1, -4, 10**9))


def test_deps_on_completed_flows_with_sparse_ids() -> None:
    topo, n = build([("h0", "s0", 100 * G), ("h1", "s0", 100 * G)])
    sim = FlowSimulator(topo)
    big = 2**45 + 3
    sim.submit([Flow(big, n["h0"], n["h1"], 1000)], at=0)
    first = sim.drain()[0]
    sim.submit([Flow(-1, n["h1"], n["h0"], 1000, deps=(big,))], at=first.end_ns + 10)
    assert sim.drain()[0].start_ns == first.end_ns + 10
    with pytest.raises(InputError, match="duplicate"):
        sim.submit([Flow(big, n["h0"], n["h1"], 1)], at=sim.now())


def test_chunked_ring_on_leaf_spine_is_bandwidth_plus_latency_chain() -> None:
    """NCCL-like chunked ring all-reduce over two leaves: 2(n-1)/n S/B plus the slowest chain of step latencies.

    Every NIC carries its rank's c*m concurrent chunk flows and nothing else (one cross-leaf flow per
    leaf uplink), so each step takes c*m*chunk/B exactly (40 us here, whole ns).
    """
    leaves, per_leaf, channels, chunks, chunk = 2, 8, 2, 2, 125_000
    links = [(f"h{i}", f"s_l{i // per_leaf}", 100 * G) for i in range(leaves * per_leaf)]
    links += [(f"s_l{a}", f"s_sp{b}", 100 * G) for a in range(leaves) for b in range(per_leaf)]
    topo, names = build(links)
    hosts = [names[f"h{i}"] for i in range(leaves * per_leaf)]
    k = len(hosts)
    flows: list[Flow] = []
    for ch in range(channels):
        for _ in range(chunks):
            prev: list[int] = []
            for _ in range(2 * (k - 1)):
                base = len(flows)
                for r in range(k):
                    deps = (prev[(r - 1) % k],) if prev else ()
                    flows.append(Flow(base + r, hosts[r], hosts[(r + 1) % k], chunk, deps, key=ch * 1000 + r))
                prev = list(range(base, base + k))
    edge_lat = [topo.path_latency_ns(topo.route(hosts[r], hosts[(r + 1) % k], 0)) for r in range(k)]
    chain = max(sum(edge_lat[(r + s) % k] for s in range(2 * (k - 1))) for r in range(k))
    size = k * channels * chunks * chunk
    assert tx_ns(channels * chunks * chunk, 100 * G) == 40_000
    expect = tx_ns(2 * (k - 1) * size // k, 100 * G) + chain
    assert max(e for _, e in run(topo, flows).values()) == expect
