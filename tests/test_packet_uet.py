"""Ultra Ethernet transport in packet mode (issue 37), against closed forms.

- NSCC (`--cc nscc`): on a 2-to-1 incast, a flow that joins a line-rate flow converges to the fair share, each
  flow sending line rate / 2 within 5%, and together the whole port.
- REPS (`lb=reps`): a permutation over a 1:1 two-tier fabric loads every leaf-spine link within 5% (max / min).
- RUD (`rx=rud`) with trimming: every trimmed packet is retransmitted exactly once, nothing else is.
- `--set transport=uet|roce`, and determinism (the same seed, the same results).
"""

from __future__ import annotations

import pytest
from test_packet_engine import star  # n hosts on one switch

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.cc_registry import registry
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.model import Topology

pytestmark = pytest.mark.ns3

G = 10**9
US = 1000
PAYLOAD, HEADER = 1000, 48


def uet_marking(bps: int) -> list[str]:
    """--set items for htsim's UET marking (0.2..0.8 of a one-BDP queue, probability 1) at one link rate; the
    BDP of an 8 us RTT, 1000 bytes per Gb/s (transport=uet's default, packet_config.uet_switch_maps)."""
    bdp = bps // G * 1000
    return [f"kmin_map={bps} {bdp // 5}", f"kmax_map={bps} {bdp * 4 // 5}", f"pmax_map={bps} 1.0"]


# ----- NSCC ------------------------------------------------------------------------------------------------------
def port_shares(config: PacketConfig, bps: int, join_ns: int, windows: list[tuple[int, int]]) -> list[list[float]]:
    """Flow 1 (host 1 -> host 0) alone from 0, flow 2 (host 2 -> host 0) from `join_ns`, both longer than the run;
    each flow's share of the line rate over each (from, to) window, from the bytes on its host's uplink."""
    line = bps / 8 / G  # bytes per ns
    with Ns3Simulator(star(3, bps), config) as sim:
        sim.submit([Flow(1, 1, 0, 10**10)], at=0)
        sim.submit([Flow(2, 2, 0, 10**10)], at=join_ns)
        marks: dict[int, tuple[int, int]] = {}
        for t in sorted({t for w in windows for t in w}):
            sim.advance(t)
            used = {(c.src, c.dst): c.bytes for c in sim.channel_usage()}
            marks[t] = (used.get((1, 3), 0), used.get((2, 3), 0))
    return [[(marks[b][i] - marks[a][i]) / (b - a) / line for i in (0, 1)] for a, b in windows]


@pytest.mark.parametrize("gbps", [100, 400])
def test_nscc_converges_to_the_fair_share_on_a_two_to_one_incast(ns3_lib, gbps: int) -> None:
    """Flow 2 joins a line-rate flow 1 at 100 us. From 200 us after the join, over two 1 ms windows, each flow
    sends half the port within 5% (wire bytes on its uplink), and the two fill it (>= 99%)."""
    bps = gbps * G
    config = packet_config_from_flags(cc="nscc", sets=uet_marking(bps), queue_sample_ns=0)
    join = 100 * US
    windows = [(join + 200 * US, join + 1200 * US), (join + 1200 * US, join + 2200 * US)]
    for first, second in port_shares(config, bps, join, windows):
        assert first == pytest.approx(0.5, rel=0.05) and second == pytest.approx(0.5, rel=0.05)
        assert first + second >= 0.99


def test_nscc_is_registered_with_its_attributes(ns3_lib) -> None:
    known = registry()
    assert known["nscc"].typeid == "ns3::CcNscc"
    assert {"TargetQdelay", "Gamma", "QaGate", "QuickAdapt", "Fi", "Eta", "Alpha", "MaxWindow"} <= set(
        known["nscc"].attributes
    )
    assert known["nscc"].attributes["Gamma"].default == "0.8"
    config = packet_config_from_flags(cc="nscc", sets=["cc.QuickAdapt=false", "cc.TargetQdelay=3us"])
    assert config.cc_attrs == {"QuickAdapt": "false", "TargetQdelay": "3us"}


# ----- REPS, RUD and the presets ---------------------------------------------------------------------------------
def two_tier(
    leaves: int, hosts: int, spines: int, gbps: int = 100
) -> tuple[Topology, list[list[int]], list[int], list[int]]:
    """`leaves` leaves of `hosts` hosts each, every leaf linked once to each of `spines` spines; 1 us links."""
    t = Topology("two-tier")
    hs = [[t.add_node("host") for _ in range(hosts)] for _ in range(leaves)]
    ls = [t.add_node("switch") for _ in range(leaves)]
    ss = [t.add_node("switch") for _ in range(spines)]
    for leaf, group in zip(ls, hs, strict=True):
        for h in group:
            t.add_link(h, leaf, gbps * G, US)
    for leaf in ls:
        for s in ss:
            t.add_link(leaf, s, gbps * G, US)
    return t.validate(), hs, ls, ss


def run(topo: Topology, flows: list[Flow], sets: list[str]) -> dict[str, object]:
    """Completions, stats, per-flow transport counters, trims and bytes per directed channel of a run to the end."""
    with Ns3Simulator(topo, packet_config_from_flags(sets=sets, queue_sample_ns=0)) as sim:
        sim.submit(flows, 0)
        done = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
        assert sim.finish()
        return {
            "done": done,
            "stats": sim.stats(),
            "per_flow": dict(sim.flow_transport()),
            "trims": sim.trims(),
            "used": {(u.src, u.dst): u.bytes for u in sim.channel_usage()},
        }


def permutation(size: int) -> tuple[Topology, list[Flow], list[int], list[int]]:
    """2 leaves x 4 hosts, 4 spines (1:1), 100G: host i of each leaf sends `size` to host i of the other."""
    topo, hs, ls, ss = two_tier(2, 4, 4)
    pairs = list(zip(hs[0], hs[1], strict=True)) + list(zip(hs[1], hs[0], strict=True))
    return topo, [Flow(i, a, b, size) for i, (a, b) in enumerate(pairs)], ls, ss


@pytest.fixture(scope="module")
def permutation_runs(ns3_lib) -> dict[str, dict[str, object]]:
    topo, flows, _, _ = permutation(8_000_000)
    sets = {"reps": ["transport=uet"], "ecmp": ["transport=uet", "lb=ecmp"], "reps seed 2": ["transport=uet", "seed=2"]}
    return {name: run(topo, flows, s) for name, s in sets.items()} | {"reps again": run(topo, flows, sets["reps"])}


def test_reps_spreads_a_permutation_over_all_paths(permutation_runs) -> None:
    """8 flows of 8 MB across a 1:1 fabric need every spine link at line rate. REPS keeps the entropies whose ACKs
    come back unmarked, so entropies hashed onto an overloaded spine are dropped and re-drawn: every leaf-spine
    link carries the same bytes within 5% (max / min), and the flows end near line rate (within 10% of the
    closed form size x wire / payload / line + base RTT). ECMP, a path per flow, leaves spines 2:1 and idle."""
    _, flows, ls, ss = permutation(8_000_000)
    reps, ecmp = permutation_runs["reps"], permutation_runs["ecmp"]
    for r in (reps, ecmp):
        assert r["stats"]["payload_bytes_delivered"] == sum(f.size for f in flows)  # type: ignore[index]
    used = reps["used"]
    for loads in ([used[(ls[0], s)] for s in ss], [used[(s, ls[1])] for s in ss]):  # type: ignore[index]
        assert max(loads) / min(loads) <= 1.05
    assert reps["stats"]["entropies_recycled"] > 10 * reps["stats"]["entropies_explored"]  # type: ignore[index]
    line_ns = 8_000_000 * (PAYLOAD + HEADER) / PAYLOAD * 8 / 100
    assert max(end - start for _, start, end in reps["done"]) <= 1.10 * (line_ns + 10 * US)  # type: ignore[attr-defined]
    ecmp_used = ecmp["used"]
    assert max(ecmp_used[(ls[0], s)] for s in ss) / min(ecmp_used[(ls[0], s)] for s in ss) > 2  # type: ignore[index]


def test_the_same_seed_gives_identical_results_and_another_seed_others(permutation_runs) -> None:
    first, again, other = permutation_runs["reps"], permutation_runs["reps again"], permutation_runs["reps seed 2"]
    assert first["done"] == again["done"] and first["stats"] == again["stats"] and first["used"] == again["used"]
    assert first["used"] != other["used"]  # REPS draws its entropies from the seeded ns-3 streams


@pytest.mark.parametrize("gbps", [100, 400])
def test_rud_retransmits_every_trimmed_packet_exactly_once(ns3_lib, gbps: int) -> None:
    """An 8-to-1 incast of 2 MB flows under transport=uet: the windows start at 1.5 BDP, so the bottleneck
    queue passes the trim threshold and packets are trimmed to their headers. Every trimmed packet's header
    reaches the receiver, is NACKed, and the sender resends that packet and nothing else: per flow, the
    retransmitted packets equal the flow's trims, with no timeout (no go-back-N, no spurious resend), no drop,
    every byte delivered once, and the port busy to the end (last FCT within 3% of n x size at line rate)."""
    n, size = 8, 2_000_000
    r = run(star(n + 1, gbps * G), [Flow(i, i, 0, size) for i in range(1, n + 1)], ["transport=uet"])
    stats, per_flow = r["stats"], r["per_flow"]
    trims: dict[int, int] = {}
    for t in r["trims"]:  # type: ignore[attr-defined]
        trims[t.flow_id] = trims.get(t.flow_id, 0) + 1
    assert stats["trims"] > n  # type: ignore[index,operator]
    for flow_id, t in per_flow.items():  # type: ignore[attr-defined]
        assert t.retx_packets == trims.get(flow_id, 0), flow_id
    assert stats["retx_packets"] == stats["trims"] == stats["trim_nacks"]  # type: ignore[index]
    assert stats["timeouts"] == 0 and stats["drops"] == 0 and stats["pfc_pause"] == 0  # type: ignore[index]
    assert stats["payload_bytes_delivered"] == n * size  # type: ignore[index]
    line_ns = n * size * (PAYLOAD + HEADER) / PAYLOAD * 8 / gbps
    assert max(end for _, _, end in r["done"]) == pytest.approx(line_ns, rel=0.03)  # type: ignore[attr-defined]


def test_transport_presets_are_one_flag_apart() -> None:
    uet = apply_overrides(PacketConfig(cc="dcqcn"), ["transport=uet"])
    assert (uet.cc, uet.rx, uet.lb, uet.pfc, uet.trim_priority, uet.transport) == (
        "nscc",
        "rud",
        "reps",
        False,
        True,
        "uet",
    )
    params = dict(uet.to_params([100 * G, 400 * G]))
    assert params["switch.TrimThreshold"] == str(100 * 1000)  # one nominal BDP of the slowest link
    assert params["switch.TrimHeaderPriority"] == "true" and params["nic.LoadBalancing"] == "reps"
    assert params["switch.KminMap"] == f"{100 * G} 20000 {400 * G} 80000"
    assert params["nic.RetransmitTimeout"] == "1000000ns"  # lossy: a timeout backs the NACKs up
    roce = apply_overrides(uet, ["transport=roce"])
    assert (roce.cc, roce.rx, roce.lb, roce.pfc, roce.trim_priority) == ("none", "gbn", "ecmp", True, False)
    assert apply_overrides(PacketConfig(), ["transport=roce"]).to_params() == PacketConfig(transport="roce").to_params()
    kept = apply_overrides(PacketConfig(cc="hpcc"), ["transport=roce"])
    assert kept.cc == "hpcc"  # RoCE's CC is the user's
    assert apply_overrides(PacketConfig(cc="nscc"), ["transport=roce"]).cc == "nscc"  # --cc nscc on RoCE stays
    assert apply_overrides(PacketConfig(), ["transport=uet", "transport=roce"]).cc == "none"  # the preset's goes
    with pytest.raises(InputError) as e:
        apply_overrides(PacketConfig(), ["transport=ib"])
    assert e.value.field == "transport" and "uet, roce" in str(e.value)


# ----- ROD -------------------------------------------------------------------------------------------------------
def test_rod_keeps_one_path_per_queue_pair(ns3_lib) -> None:
    """One 4 MB flow from a host on leaf 0 to one on leaf 1, 4 spines, REPS entropies. Under rx=rod the queue pair
    keeps one entropy, so one leaf-0 uplink carries all its data (>= size) and the other three none (its ACKs go
    the other way), and nothing arrives out of order; under rx=rud the same flow is sprayed over several."""
    topo, hs, ls, ss = two_tier(2, 1, 4)
    size = 4_000_000
    flows = [Flow(1, hs[0][0], hs[1][0], size)]
    rod = run(topo, flows, ["transport=uet", "rx=rod"])
    loads = sorted(rod["used"].get((ls[0], s), 0) for s in ss)  # type: ignore[attr-defined]
    assert loads[:3] == [0, 0, 0] and loads[3] >= size
    assert rod["stats"]["payload_bytes_delivered"] == size  # type: ignore[index]
    assert rod["stats"]["ooo_packets"] == 0  # type: ignore[index]
    rud = run(topo, flows, ["transport=uet"])
    assert sum(rud["used"].get((ls[0], s), 0) > 0 for s in ss) >= 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("gbps", [100, 400])
def test_rod_goes_back_to_each_trimmed_packet(ns3_lib, gbps: int) -> None:
    """The 8-to-1 incast of the RUD test under rx=rod: packets are trimmed; the receiver takes data in order only,
    so it NACKs each trimmed packet it expected and drops what follows a hole (out-of-order arrivals); the sender
    goes back to the NACKed packet and resends from there: more packets than were trimmed (RUD resends exactly
    the trimmed ones), no timeout, no drop, every byte delivered once, each flow's bytes in order."""
    n, size = 8, 2_000_000
    flows = [Flow(i, i, 0, size) for i in range(1, n + 1)]
    r = run(star(n + 1, gbps * G), flows, ["transport=uet", "rx=rod"])
    stats = r["stats"]
    assert stats["trims"] > n  # type: ignore[index,operator]
    assert 0 < stats["trim_nacks"] <= stats["trims"]  # type: ignore[index,operator]
    assert stats["retx_packets"] > stats["trims"]  # type: ignore[index,operator]
    assert stats["ooo_packets"] > 0  # type: ignore[index,operator]
    assert stats["timeouts"] == 0 and stats["drops"] == 0  # type: ignore[index]
    assert stats["payload_bytes_delivered"] == n * size  # type: ignore[index]
    line_ns = n * size * (PAYLOAD + HEADER) / PAYLOAD * 8 / gbps
    assert max(end for _, _, end in r["done"]) >= line_ns  # type: ignore[attr-defined]


def test_rod_is_a_receiver_mode() -> None:
    config = apply_overrides(PacketConfig(), ["transport=uet", "rx=rod"])
    assert dict(config.to_params())["nic.Receiver"] == "rod"


# ----- RCCC ------------------------------------------------------------------------------------------------------
def incast_shares(n: int, bps: int, sets: list[str], windows: list[tuple[int, int]]) -> tuple[list[list[float]], list]:
    """Hosts 1..n each send host 0 a flow longer than the run from 0: each one's share of the line rate over each
    (from, to) window (wire bytes on its uplink), and the run's trims."""
    line = bps / 8 / G
    with Ns3Simulator(star(n + 1, bps), packet_config_from_flags(sets=sets, queue_sample_ns=0)) as sim:
        sim.submit([Flow(i, i, 0, 10**10) for i in range(1, n + 1)], at=0)
        marks: dict[int, list[int]] = {}
        for t in sorted({t for w in windows for t in w}):
            sim.advance(t)
            used = {(c.src, c.dst): c.bytes for c in sim.channel_usage()}
            marks[t] = [used.get((i, n + 1), 0) for i in range(1, n + 1)]
        trims = sim.trims()
    return [[(marks[b][i] - marks[a][i]) / (b - a) / line for i in range(n)] for a, b in windows], trims


@pytest.mark.parametrize(("gbps", "cc"), [(100, "cc=rccc"), (400, "cc=rccc"), (400, "cc.ReceiverCredit=true")])
def test_rccc_grants_each_sender_its_share_of_the_receiver(ns3_lib, gbps: int, cc: str) -> None:
    """An 8-to-1 incast under receiver credits (RCCC alone, and NSCC with receiver credits): the receiving port
    grants credit in turn at credit_rate (0.99) x its line rate, so after the speculative first round trip the
    senders together send credit_rate of the port (wire bytes, within 0.5%) and each credit_rate / 8 (within 2%),
    over two 0.5 ms windows. The queue stays under the trim threshold once the speculation is over: every trim
    happens in the first 10 us (a base RTT is about 4 us)."""
    n = 8
    windows = [(100 * US, 600 * US), (600 * US, 1100 * US)]
    shares, trims = incast_shares(n, gbps * G, ["transport=uet", cc], windows)
    for window in shares:
        assert sum(window) == pytest.approx(0.99, rel=0.005)
        for share in window:
            assert share == pytest.approx(0.99 / n, rel=0.02)
    assert trims and max(t.time_ns for t in trims) <= 10 * US


def test_rccc_follows_the_credit_rate(ns3_lib) -> None:
    """The same incast with credit_rate=0.8: the senders together send 0.8 of the port (within 0.5%)."""
    shares, _ = incast_shares(4, 100 * G, ["transport=uet", "cc=rccc", "credit_rate=0.8"], [(100 * US, 600 * US)])
    assert sum(shares[0]) == pytest.approx(0.8, rel=0.005)


def test_rccc_is_registered_with_its_attributes(ns3_lib) -> None:
    known = registry()
    assert known["rccc"].typeid == "ns3::CcRccc"
    assert known["rccc"].attributes["ReceiverCredit"].default == "true"
    assert known["nscc"].attributes["ReceiverCredit"].default == "false"
    assert {"SpeculativeCredit", "MaxCredit"} <= set(known["rccc"].attributes) & set(known["nscc"].attributes)
    params = dict(apply_overrides(PacketConfig(), ["credit_rate=0.9", "credit_quantum=2"]).to_params())
    assert params["nic.CreditRate"] == "0.9" and params["nic.CreditQuantum"] == "2"


# ----- SLEEK -----------------------------------------------------------------------------------------------------
def test_sleek_recovers_drops_without_timeouts(ns3_lib) -> None:
    """The 8-to-1 incast at 100 Gb/s with trimming off and a 300 KB switch buffer: packets are dropped, and no NACK
    reports them. With SLEEK (`sleek=true`) the senders resend them once enough later packets are acknowledged (or
    at the tail, after a probe time without ACKs): no retransmission timeout, every byte delivered once, and the last
    flow ends within 3% of the line-rate closed form; without it the drops wait for the 1 ms timeout."""
    n, size, gbps = 8, 2_000_000, 100
    flows = [Flow(i, i, 0, size) for i in range(1, n + 1)]
    lossy = ["transport=uet", "trim_bytes=0", "buffer_bytes=300000"]
    line_ns = n * size * (PAYLOAD + HEADER) / PAYLOAD * 8 / gbps
    sleek = run(star(n + 1, gbps * G), flows, [*lossy, "sleek=true"])
    stats = sleek["stats"]
    assert stats["drops"] > n and stats["trims"] == 0  # type: ignore[index,operator]
    assert stats["timeouts"] == 0  # type: ignore[index]
    assert stats["retx_packets"] >= stats["drops"]  # type: ignore[index,operator]
    assert stats["payload_bytes_delivered"] == n * size  # type: ignore[index]
    assert max(end for _, _, end in sleek["done"]) == pytest.approx(line_ns, rel=0.03)  # type: ignore[attr-defined]
    plain = run(star(n + 1, gbps * G), flows, lossy)
    assert plain["stats"]["timeouts"] > 0  # type: ignore[index,operator]
    assert max(end for _, _, end in plain["done"]) > 1.5 * line_ns  # type: ignore[attr-defined]


def test_sleek_resends_nothing_without_loss(ns3_lib) -> None:
    """The REPS permutation (sprayed, reordered, nothing dropped or trimmed) under SLEEK: nothing is resent."""
    topo, flows, _, _ = permutation(8_000_000)
    r = run(topo, flows, ["transport=uet", "sleek=true"])
    assert r["stats"]["drops"] == 0 and r["stats"]["trims"] == 0  # type: ignore[index]
    assert r["stats"]["retx_packets"] == 0  # type: ignore[index]
    assert r["stats"]["ooo_packets"] > 0  # type: ignore[index,operator]
