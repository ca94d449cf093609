"""Per-flow rate caps (`Flow.rate_bps`, payload bits/s: an NCCL channel's throughput limit; issue 33) in every
engine, against closed forms: the flow engine (max-min with a private pseudo-channel per capped flow, its
incremental re-solves verified), fluid NVLink beside it, the wire format, and the ns-3 packet engine."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from fractions import Fraction
from pathlib import Path

import msgpack
import pytest

from bridge.protocol import ProtocolError, flow_from_wire, flow_to_wire
from phantora.collectives.decompose import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.netsim import flow as flow_mod
from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.hybrid import FLUID, PACKET, FluidNvlinkSimulator
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from tests.test_packet_engine import G, star  # n hosts on one switch, 100G links of 1 us

LAT = 1000


def tx_ns(size: int, bps: int | Fraction) -> int:
    """Closed-form transmission time, rounded up to whole ns (exact rational arithmetic)."""
    return math.ceil(Fraction(size * 8 * G) / Fraction(bps))


def ends(done: list[Completion]) -> dict[int, tuple[int, int]]:
    return {c.flow_id: (c.start_ns, c.end_ns) for c in done}


def run(topo: Topology, flows: list[Flow], **kw: object) -> dict[int, tuple[int, int]]:
    sim = FlowSimulator(topo, **kw)
    sim.submit(flows, at=0)
    return ends(sim.drain())


# ----- the flow engine ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 1_000_000, 1_234_567])
@pytest.mark.parametrize("cap", [10 * G, 25 * G, 33_000_000_123])
def test_capped_flow_on_an_idle_link_runs_at_its_cap(size: int, cap: int) -> None:
    done = run(star(2), [Flow(1, 0, 1, size, rate_bps=cap)])
    assert done[1] == (0, tx_ns(size, cap) + 2 * LAT)


def test_cap_above_the_payload_capacity_changes_nothing() -> None:
    """The cap counts payload bits: it is compared with bandwidth x payload_efficiency (80 of 100 Gb/s here)."""
    size = 1_234_567
    free = run(star(2), [Flow(1, 0, 1, size)], payload_efficiency=0.8)
    capped = run(star(2), [Flow(1, 0, 1, size, rate_bps=90 * G)], payload_efficiency=0.8)
    assert capped == free == {1: (0, tx_ns(size, 80 * G) + 2 * LAT)}
    below = run(star(2), [Flow(1, 0, 1, size, rate_bps=70 * G)], payload_efficiency=0.8)
    assert below[1][1] == tx_ns(size, 70 * G) + 2 * LAT


def test_capped_flow_leaves_the_rest_of_the_link_to_the_other() -> None:
    """Two flows into one 100 Gb/s link, one capped at 20 < 50 Gb/s: it gets 20, the other 80 (not 50), both
    sized so each ends at its own closed form."""
    cap, size = 20 * G, 2_000_000
    sim = FlowSimulator(star(3))
    sim.submit([Flow(1, 0, 2, size, rate_bps=cap), Flow(2, 1, 2, size)], at=0)
    sim.advance(1)
    assert sim.rates() == {1: cap / 8e9, 2: 80 * G / 8e9}
    done = ends(sim.drain())
    assert done[1] == (0, tx_ns(size, cap) + 2 * LAT)
    assert done[2] == (0, tx_ns(size, 100 * G - cap) + 2 * LAT)


def test_uncapped_flow_speeds_up_when_the_capped_one_ends() -> None:
    """The capped flow (1 MB at 20 Gb/s) ends first; then the other (10 MB) gets all 100 Gb/s: 4 MB at 80, then 6 MB
    at 100."""
    sim = FlowSimulator(star(3))
    sim.submit([Flow(1, 0, 2, 1_000_000, rate_bps=20 * G), Flow(2, 1, 2, 10_000_000)], at=0)
    done = ends(sim.drain())
    t1 = tx_ns(1_000_000, 20 * G)
    assert done[1] == (0, t1 + 2 * LAT)
    assert done[2] == (0, t1 + tx_ns(6_000_000, 100 * G) + 2 * LAT)


def test_cap_below_the_fair_share_binds_only_that_flow() -> None:
    """Three flows into one 90 Gb/s link, one capped at 10: the other two share the remaining 80 (40 each)."""
    topo = star(4, bps=90 * G)
    sim = FlowSimulator(topo)
    sim.submit([Flow(1, 0, 3, 10**6, rate_bps=10 * G), Flow(2, 1, 3, 10**6), Flow(3, 2, 3, 10**6)], at=0)
    sim.advance(1)
    assert sim.rates() == {1: 10 * G / 8e9, 2: 40 * G / 8e9, 3: 40 * G / 8e9}


def random_capped_flows(topo: Topology, n: int, seed: int) -> list[tuple[int, Flow]]:
    """(submit time, flow): random endpoints, sizes, starts and deps; every other flow capped."""
    import random

    rng = random.Random(seed)
    eps = topo.endpoints
    out: list[tuple[int, Flow]] = []
    t = 0
    for i in range(n):
        src, dst = rng.sample(eps, 2)
        deps = tuple(rng.sample(range(i), min(i, rng.randint(0, 2))))
        cap = rng.choice([0, 5 * G, 12 * G, 40 * G, 250 * G]) if i % 2 else 0
        t += rng.choice([0, 0, 500, 3_000])
        out.append((t, Flow(i, src, dst, rng.randint(1, 3_000_000), deps, rng.choice([0, 200]), rate_bps=cap, key=i)))
    return out


@pytest.mark.parametrize("lb", ["ecmp", "spray", "adaptive"])
def test_capped_flows_through_the_verify_engine(lb: str) -> None:
    """verify=True checks every incremental re-solve against a full one; the results also equal the full-solve
    engine's to the ns and repeat exactly, and cap pseudo-channels are reused."""
    topo = load_topology("twoleaf8") if lb != "ecmp" else load_topology("testbed16")
    batches = random_capped_flows(topo, 160, seed=33)

    def simulate(**kw: object) -> tuple[list[tuple[int, int, int]], dict[str, object]]:
        sim = FlowSimulator(topo, lb=lb, **kw)
        done: list[Completion] = []
        for t, f in batches:
            done.extend(sim.advance(t))
            sim.submit([f], at=t)
        done.extend(sim.drain())
        return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done), sim.stats()

    verified, st = simulate(verify=True)
    full, _ = simulate(incremental=False)
    again, _ = simulate()
    assert verified == full == again
    capped = sum(1 for _, f in batches if f.rate_bps)
    assert st["capped_flows"] == capped
    assert 0 < int(st["cap_channels"]) < capped  # freed pseudo-channels are used again


def test_caps_in_a_component_big_enough_for_the_numpy_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    """600 flows into one 100 Gb/s link (the vectorised solver's size), every other one capped at 50 Mb/s, below
    the fair share: the capped ones get 50 Mb/s, the other 300 share what is left evenly; verify=True checks it
    against the pure-Python solver. (Not carried: a component this large would be, `CARRY_GIANT`.)"""
    monkeypatch.setattr(flow_mod, "CARRY_GIANT", 10**9)
    n = 600
    sim = FlowSimulator(star(n + 1), verify=True)
    sim.submit([Flow(i, i, n, 10**6, rate_bps=(50 * 10**6 if i % 2 else 0)) for i in range(n)], at=0)
    sim.advance(1)
    rates = sim.rates()
    assert sim.stats()["numpy_resolves"] >= 1
    assert {rates[i] for i in range(1, n, 2)} == {50 * 10**6 / 8e9}
    assert {round(rates[i] * 8e9) for i in range(0, n, 2)} == {round((100 * G - 300 * 50 * 10**6) / 300)}


def test_capped_flows_beside_fluid_nvlink_keep_their_caps() -> None:
    """The nvlink=fluid split (here over two flow engines) holds flows whose deps cross sides and hands them over
    with fewer deps: the caps must survive that, so the split equals one flow engine to the ns."""
    topo = load_topology("testbed16")
    ranks = tuple(range(topo.num_ranks))
    ag = decompose(Collective("all_gather", ranks, 3 << 20), topo, AlgoOptions("ring", "chunked", 2)).flows
    flows = [dataclasses.replace(f, rate_bps=(60 * G if f.id % 3 else 7 * G)) if f.size else f for f in ag]
    one = FlowSimulator(topo)
    one.submit(flows, 0)
    want = sorted((c.flow_id, c.start_ns, c.end_ns) for c in one.drain())
    two = FluidNvlinkSimulator(FlowSimulator(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
    assert {two.side_of(f) for f in flows} == {PACKET, FLUID}
    two.submit(flows, 0)
    got = sorted((c.flow_id, c.start_ns, c.end_ns) for c in two.drain())
    assert got == want
    free = FlowSimulator(topo)
    free.submit(ag, 0)
    assert max(e for _, _, e in want) > max(c.end_ns for c in free.drain())  # the caps did slow it down


def test_negative_cap_is_refused() -> None:
    sim = FlowSimulator(star(2))
    with pytest.raises(InputError) as err:
        sim.submit([Flow(1, 0, 1, 1000, rate_bps=-1)], at=0)
    assert err.value.field == "rate_bps" and "flow 1" in str(err.value)


def test_with_deps_keeps_the_cap() -> None:
    f = Flow(1, 0, 1, 1000, (4,), 5, "t", 2, 9, 100, 25 * G)
    assert f.with_deps((), 0) == Flow(1, 0, 1, 1000, (), 0, "t", 2, 9, 100, 25 * G)


# ----- the wire ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flow", "fields"),
    [
        (Flow(7, 1, 2, 4096, (3, 4), 250, "c0/ring", 3, 5), 9),
        (Flow(7, 1, 2, 4096, (3,), 0, "x", 3, None, loss_budget=100), 10),
        (Flow(7, 1, 2, 4096, (3,), 0, "x", 3, None, rate_bps=25 * G), 11),
        (Flow(7, 1, 2, 4096, (), 0, "", 5, (1 << 63) + 5, loss_budget=64, rate_bps=(1 << 64) - 1), 11),
        (Flow(7, 1, 2, 4096, (), 0, "", 5, 64 << 56, via_nic=True), 14),  # a QP index of 64 beside the NIC route
    ],
)
def test_wire_round_trip_carries_the_cap(flow: Flow, fields: int) -> None:
    row = flow_to_wire(flow)
    assert len(row) == fields
    assert flow_from_wire(msgpack.unpackb(msgpack.packb(row))) == flow


def test_wire_accepts_old_rows_and_refuses_bad_caps() -> None:
    assert flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None]).rate_bps == 0
    assert flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 4]) == Flow(7, 1, 2, 10, loss_budget=4, priority=3)
    assert flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 0, 5]).rate_bps == 5
    with pytest.raises(ProtocolError):
        flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 0, "fast"])
    assert flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 0, 5, 6]).conn == 6  # the 12th field: the connection
    assert flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 0, 5, 6, 7]).queue == 7  # the 13th: the sender's queue
    assert flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 0, 5, 6, 7, 1]).via_nic  # the 14th: through the NICs
    with pytest.raises(ProtocolError):
        flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 0, 5, 6, 7, 8])
    with pytest.raises(ProtocolError):
        flow_from_wire([7, 1, 2, 10, [], 0, "", 3, None, 0, 5, 6, 7, 0, 0])


# ----- the packet engine (ns-3) ------------------------------------------------------------------------------
@pytest.mark.ns3
def test_packet_engine_paces_a_capped_flow_at_its_cap(ns3_lib, tmp_path: Path) -> None:
    """1 MB at a 10 Gb/s cap on 100 Gb/s links: the last byte lands size x 8 / cap (less the last packet's own
    pacing gap) plus the path, within a few %; uncapped it is ~10x faster. The runner replays the recorded
    calls (SetMaxRate included) to the same FCTs."""
    from phantora.netsim.hpcc_io import format_fct_line
    from phantora.netsim.packet import Ns3Simulator, runner_path
    from phantora.netsim.packet_config import PacketConfig

    size, cap = 1_000_000, 10 * G
    calls = tmp_path / "calls.txt"
    with Ns3Simulator(star(3), PacketConfig(), calls=calls) as sim:
        sim.submit([Flow(1, 0, 2, size, rate_bps=cap), Flow(2, 1, 2, size)], at=0)
        done = ends(sim.drain())
        assert sim.finish()
        fct_lines = [format_fct_line(r, with_id=True) for r in sim.fct_records()]
    capped, free = done[1][1] - done[1][0], done[2][1] - done[2][0]
    want = size * 8 * G / cap + 2 * LAT
    assert capped == pytest.approx(want, rel=0.03)
    assert capped > 5 * free
    assert "SetMaxRate 1 10000000000" in calls.read_text().splitlines()
    out = tmp_path / "runner"
    proc = subprocess.run([str(runner_path()), str(calls), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "fct.txt").read_text().splitlines() == fct_lines


@pytest.mark.ns3
def test_packet_engine_cap_above_line_rate_changes_nothing(ns3_lib) -> None:
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig

    got = []
    for cap in (0, 400 * G):
        with Ns3Simulator(star(2), PacketConfig()) as sim:
            sim.submit([Flow(1, 0, 1, 500_000, rate_bps=cap)], at=0)
            got.append(ends(sim.drain()))
    assert got[0] == got[1]


@pytest.mark.ns3
def test_packet_engine_refuses_caps_past_64_bits(ns3_lib) -> None:
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig

    with Ns3Simulator(star(2), PacketConfig()) as sim:
        with pytest.raises(InputError) as err:
            sim.submit([Flow(1, 0, 1, 1000, rate_bps=1 << 64)], at=0)
        assert err.value.field == "rate_bps"


@pytest.mark.ns3
def test_reuse_tells_a_capped_episode_from_an_uncapped_one(ns3_lib) -> None:
    """`reuse=on` keys episodes by their flows' shape, the cap included: the same flow capped is run, not
    served from the uncapped profile; the capped one repeated is served."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import PacketConfig

    sim = make_engine(EngineSpec("ns3", PacketConfig(reuse="on")), star(2))
    took = []
    for i, cap in enumerate((0, 10 * G, 10 * G)):
        t0 = sim.now() + 50_000
        sim.advance(t0)
        sim.submit([Flow(i, 0, 1, 200_000, rate_bps=cap, key=1)], t0)
        (c,) = sim.drain()
        took.append(c.end_ns - c.start_ns)
    stats = sim.stats()
    sim.close()
    assert took[1] > 5 * took[0] and took[2] == took[1]
    assert stats["reuse_served"] == 1 and stats["reuse_recorded"] == 2
