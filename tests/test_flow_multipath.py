"""Flow-mode multipath (lb=spray|adaptive|flowlet) against closed forms on small leaf-spines."""

from __future__ import annotations

import random

import pytest

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.multipath import multipath
from phantora.topology.model import Topology
from tests.test_flow_engine import LAT, G, build, run, tx_ns

SIZE = 12_500_000  # bytes: 1 ms at 100 Gb/s


def _leaf_spine(per_leaf: int, spines: int, uplink: int) -> tuple[Topology, dict[str, int]]:
    """2 leaves (sl0, sl1) of `per_leaf` hosts at 100G, `spines` spines (ss0..) with `uplink` links."""
    links = [(f"h{leaf}{i}", f"sl{leaf}", 100 * G) for leaf in (0, 1) for i in range(per_leaf)]
    links += [(f"sl{leaf}", f"ss{s}", uplink) for leaf in (0, 1) for s in range(spines)]
    return build(links)


def _colliding_keys(topo: Topology, ids: dict[str, int]) -> tuple[int, int]:
    """ECMP keys that put h00->h10 and h01->h11 on the same spine."""
    spine_of = {k: topo.route(ids["h00"], ids["h10"], k)[1] for k in range(64)}
    for k2 in range(64):
        up = topo.route(ids["h01"], ids["h11"], k2)[1]
        for k1, ch in spine_of.items():
            if topo.channel_ends(ch)[1] == topo.channel_ends(up)[1]:
                return k1, k2
    raise AssertionError("no colliding keys")


def test_collision_under_ecmp_full_rate_under_spray() -> None:
    topo, ids = _leaf_spine(2, 2, 100 * G)
    k1, k2 = _colliding_keys(topo, ids)
    flows = [Flow(1, ids["h00"], ids["h10"], SIZE, key=k1), Flow(2, ids["h01"], ids["h11"], SIZE, key=k2)]
    lat = 4 * LAT
    ecmp = run(topo, flows)
    assert ecmp[1] == ecmp[2] == (0, tx_ns(SIZE, 50 * G) + lat)  # one spine, half rate each
    for lb in ("spray", "spray_rr", "adaptive"):
        got = run(topo, flows, lb=lb)
        assert got[1] == got[2] == (0, tx_ns(SIZE, 100 * G) + lat), lb  # both spines: line rate


@pytest.mark.parametrize("lb", ["spray", "adaptive"])
def test_fct_is_size_over_sum_of_path_shares(lb: str) -> None:
    """4 hosts per leaf at 100G, 2 spines at 100G (2:1): each of 4 cross flows gets 2 paths x 25G = 50G."""
    topo, ids = _leaf_spine(4, 2, 100 * G)
    flows = [Flow(i, ids[f"h0{i}"], ids[f"h1{i}"], SIZE) for i in range(4)]
    got = run(topo, flows, lb=lb)
    assert set(got.values()) == {(0, tx_ns(SIZE, 50 * G) + 4 * LAT)}


def test_spraying_spreads_bytes_evenly() -> None:
    """An all-to-all between 2 leaves over 4 spines: every spine channel carries the same bytes (within 2 %)."""
    topo, ids = _leaf_spine(4, 4, 100 * G)
    hosts = [ids[f"h{leaf}{i}"] for leaf in (0, 1) for i in range(4)]
    pairs = [(a, b) for a in hosts for b in hosts if a != b]
    flows = [Flow(i, a, b, SIZE) for i, (a, b) in enumerate(pairs)]
    spine_ch = [
        c for c in range(topo.num_channels) if all(topo.nodes[n].kind == "switch" for n in topo.channel_ends(c))
    ]
    for lb, bound in (("spray", 1.02), ("ecmp", None)):
        sim = FlowSimulator(topo, lb=lb)
        sim.submit(flows, at=0)
        sim.drain()
        used = [sim.channel_bytes()[c] for c in spine_ch]
        assert sum(used) == 2 * 32 * SIZE  # 32 cross-leaf flows, each up and down once
        if bound:
            assert max(used) / min(used) <= bound
        else:
            assert max(used) / max(min(used), 1) > 1.02  # ECMP moves whole flows: uneven here


def _loaded_spine() -> tuple[Topology, dict[str, int]]:
    """Leaves l1 (h1) and l2 (h3, h4), spines sa and sb at 100G; host x hangs off spine sa by a 50G link, so
    its flow to h4 is pinned on sa -> l2. h1 and h3/h4 have 200G NICs (one flow can fill both spines)."""
    return build(
        [
            ("h1", "sl1", 200 * G),
            ("h3", "sl2", 200 * G),
            ("h4", "sl2", 200 * G),
            ("sl1", "sa", 100 * G),
            ("sl1", "sb", 100 * G),
            ("sa", "sl2", 100 * G),
            ("sb", "sl2", 100 * G),
            ("x", "sa", 50 * G),
        ]
    )


def test_adaptive_takes_the_residual_of_a_loaded_spine() -> None:
    """Background x -> h4 runs at 50G on sa -> l2. Spraying h1 -> h3 puts half of it on sa, where 50G is left:
    2 x 50G = 100G. Ideal multipath takes all of sb and sa's residual: 100G + 50G = 150G."""
    topo, ids = _loaded_spine()
    bg = Flow(1, ids["x"], ids["h4"], 10 * SIZE)
    f = Flow(2, ids["h1"], ids["h3"], SIZE)
    ecmp_lat = 4 * LAT
    spray = run(topo, [bg, f], lb="spray")
    adaptive = run(topo, [bg, f], lb="adaptive")
    assert spray[2] == (0, tx_ns(SIZE, 100 * G) + ecmp_lat)
    assert adaptive[2] == (0, tx_ns(SIZE, 150 * G) + ecmp_lat)
    # the background flow keeps its 50G while f runs, then alone still 50G (its own link): the same end
    assert spray[1] == adaptive[1] == (0, tx_ns(10 * SIZE, 50 * G) + 3 * LAT)


def test_flowlet_is_per_flow_ecmp_and_says_so() -> None:
    topo, ids = _leaf_spine(4, 2, 100 * G)
    rng = random.Random(7)
    hosts = [v for k, v in ids.items() if k.startswith("h")]
    flows = [Flow(i, *rng.sample(hosts, 2), rng.randrange(1, 10**6)) for i in range(40)]
    assert run(topo, flows, lb="flowlet") == run(topo, flows)
    assert "lb_model" not in FlowSimulator(topo).stats()  # the default's results are as before
    stats = FlowSimulator(topo, lb="flowlet").stats()
    assert "per-flow ECMP" in str(stats["lb_model"]) and stats["approximations"]
    assert "ideal multipath" in str(FlowSimulator(topo, lb="adaptive").stats()["lb_model"])


@pytest.mark.parametrize("lb", ["spray", "adaptive"])
def test_incremental_equals_full_solve(lb: str) -> None:
    """Random staggered flows with deps: the incremental engine matches a from-scratch solve at every event."""
    topo, ids = _leaf_spine(4, 3, 100 * G)
    hosts = [ids[f"h{leaf}{i}"] for leaf in (0, 1) for i in range(4)]
    rng = random.Random(3)
    flows = []
    for i in range(60):
        a, b = rng.sample(hosts, 2)
        deps = (rng.randrange(i),) if i and rng.random() < 0.3 else ()
        flows.append(Flow(i, a, b, rng.randrange(1, 4 * 10**6), deps=deps, delay_ns=rng.randrange(0, 50_000)))
    verified = run(topo, flows, lb=lb, verify=True)
    assert verified == run(topo, flows, lb=lb, incremental=False)


def test_split_is_even_per_hop() -> None:
    topo, ids = _leaf_spine(1, 3, 100 * G)
    m = multipath(topo, ids["h00"], ids["h10"])
    assert [len(layer) for layer in m.layers] == [1, 3, 3, 1]
    assert sum(m.share) == pytest.approx(4.0)  # each layer carries the whole flow
    assert m.latency_ns == 4 * LAT


def test_unknown_lb_is_an_input_error() -> None:
    topo, _ = _leaf_spine(1, 1, 100 * G)
    with pytest.raises(InputError, match="lb"):
        FlowSimulator(topo, lb="magic")
