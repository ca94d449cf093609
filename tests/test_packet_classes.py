"""Traffic classes and DLCP in the packet engine, against closed forms: strict priority gives the high class the
line rate, wrr 3:1 splits a bottleneck 3:1, and a loss-tolerant flow trimmed under congestion completes without
retransmission, its lost ranges exactly the trimmed packets' payloads."""

from __future__ import annotations

import pytest
from test_packet_engine import star  # n hosts on one switch, 100 Gb/s, 1 us

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig, apply_overrides

pytestmark = pytest.mark.ns3

G = 10**9
US = 1000
PAYLOAD, HEADER = 1000, 48


def wire_ns(packets: float, bps: int = 100 * G) -> float:
    """Time `packets` full data packets take on a link."""
    return packets * (PAYLOAD + HEADER) * 8 * G / bps


def two_senders(cfg: PacketConfig, a: Flow, b: Flow) -> dict[int, int]:
    """Hosts 0 and 1 send to host 2 through one switch, both from time 0; flow id -> end ns."""
    with Ns3Simulator(star(3), cfg) as sim:
        sim.submit([a, b], at=0)
        done = sim.drain()
        assert sim.stats()["drops"] == 0
    return {c.flow_id: c.end_ns for c in done}


def test_strict_priority_gives_the_high_class_the_line_rate() -> None:
    """Class 1 beside class 5 at one egress: class 1 ends as if alone (N packets + one hop + 2 delays),
    class 5 waits and ends when both flows' bytes have crossed the bottleneck."""
    size = 2_000_000
    n = size // PAYLOAD
    ends = two_senders(PacketConfig(sched="strict"), Flow(1, 0, 2, size, priority=1), Flow(2, 1, 2, size, priority=5))
    alone = wire_ns(n + 1) + 2 * US
    assert ends[1] == pytest.approx(alone, rel=0.002), (ends, alone)
    assert ends[2] == pytest.approx(wire_ns(2 * n) + 2 * US, rel=0.01)
    # Round robin (the default) shares the port instead: the same class-1 flow takes about twice as long.
    rr = two_senders(PacketConfig(), Flow(1, 0, 2, size, priority=1), Flow(2, 1, 2, size, priority=5))
    assert rr[1] > 1.8 * alone


def test_wrr_three_to_one_splits_the_bottleneck_three_to_one() -> None:
    """Equal flows in classes 1 (weight 3) and 2 (weight 1): class 1 ends when it sent S and class 2 S/3,
    i.e. at 4/3 S of bottleneck time; class 2 ends at 2 S."""
    size = 3_000_000
    n = size // PAYLOAD
    cfg = apply_overrides(PacketConfig(), ["sched=wrr", "sched_weights=3,1,1,1,1,1,1"])
    ends = two_senders(cfg, Flow(1, 0, 2, size, priority=1), Flow(2, 1, 2, size, priority=2))
    assert ends[1] == pytest.approx(wire_ns(n * 4 / 3) + 2 * US, rel=0.03), ends
    assert ends[2] == pytest.approx(wire_ns(2 * n) + 2 * US, rel=0.01), ends


def test_bad_class_settings_are_errors_naming_the_field() -> None:
    with pytest.raises(InputError, match="sched_weights"):
        apply_overrides(PacketConfig(), ["sched_weights=3,1"])
    with pytest.raises(InputError, match="sched"):
        apply_overrides(PacketConfig(), ["sched=fifo"])


def dlcp_run(budget: int, size: int = 2_000_000, other: int = 300_000) -> tuple[list, list, dict]:
    """Host 0 sends a loss-tolerant flow (id 1, budget bytes) and host 1 a shorter lossless one (id 2, `other`
    bytes: a burst of congestion) to host 2, in the same class, trimmed past 20 KB of egress queue; returns
    (completions, trims, stats)."""
    cfg = PacketConfig(trim_bytes=20_000)
    with Ns3Simulator(star(3), cfg) as sim:
        sim.submit([Flow(1, 0, 2, size, loss_budget=budget), Flow(2, 1, 2, other)], at=0)
        done = sim.drain()
        assert sim.finish()
        return done, sim.trims(), sim.stats()


def test_a_loss_tolerant_flow_loses_exactly_the_trimmed_payloads_and_never_retransmits() -> None:
    size = 2_000_000
    done, trims, st = dlcp_run(budget=size // 2)
    lossy = next(c for c in done if c.flow_id == 1)
    clean = next(c for c in done if c.flow_id == 2)
    assert trims and all(t.flow_id == 1 for t in trims)  # only the flagged flow is ever trimmed
    trimmed = sorted((t.seq, t.payload) for t in trims)
    assert lossy.lost_bytes == sum(p for _, p in trimmed) > 0
    # The lost ranges are the trimmed packets, merged where adjacent.
    covered = [(off + k, 1) for off, n in lossy.lost for k in range(0, n, PAYLOAD)]
    assert [s for s, _ in covered] == [s for s, _ in trimmed]
    assert clean.lost == () and st["retx_packets"] == 0 and st["nacks"] == 0 and st["drops"] == 0
    assert st["trimmed_bytes"] == lossy.lost_bytes
    assert lossy.lost_bytes < size // 2  # the budget was not reached: every trimmed packet is a hole
    # Trimmed packets cross the bottleneck as headers: the lossy flow ends before both flows' full payloads could.
    assert lossy.end_ns < wire_ns((size + 300_000) / PAYLOAD) + 2 * US


def test_the_loss_budget_bounds_what_is_lost() -> None:
    """1% budget: the receiver takes holes until the budget is spent, then NACKs and the rest arrives intact."""
    size = 2_000_000
    budget = size // 100
    done, trims, st = dlcp_run(budget=budget, size=size, other=size)
    lossy = next(c for c in done if c.flow_id == 1)
    assert 0 < lossy.lost_bytes <= budget
    assert sum(t.payload for t in trims) > lossy.lost_bytes  # more was trimmed than lost: retransmitted
    assert st["retx_packets"] > 0


def test_without_loss_budget_nothing_is_trimmed() -> None:
    done, trims, st = dlcp_run(budget=0)
    assert trims == [] and all(c.lost == () for c in done) and st["trims"] == 0
