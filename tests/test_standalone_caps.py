"""The standalone FCT at the flow's own rate cap (`Flow.rate_bps`, payload bits/s), against closed forms: a capped
flow alone runs at its cap in both engines and has slowdown 1 (within one packet in ns-3); two capped flows on one
link have slowdown 1 while their caps sum under the link and max-min's shares over it; an uncapped flow is
unchanged (its path's bottleneck)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from bridge.completion_log import CompletionLog
from bridge.run import completion_alone
from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.standalone import Alone, StandaloneFct, standalone_fct_ns
from phantora.results import schema as S
from phantora.results.scenario import completion_rows
from phantora.results.write import write_flows_csv
from phantora.topology.model import Topology
from tests.test_packet_engine import US, G, star

B = 100 * G  # every link of `star` (tests/test_packet_engine.py: 100G, 1 us)
SIZE = 1_000_000


def ceil_ns(nbytes: int, bps: int) -> int:
    return -(-nbytes * 8 * G // bps)


def flows_csv(tmp_path: Path, topo: Topology, done: list[Completion], flows: list[Flow]) -> dict[int, dict[str, str]]:
    """flows.csv as the replay and live writers write it (fluid standalone), by flow id."""
    path = write_flows_csv(tmp_path / S.FLOWS_CSV, topo, done, flows={f.id: f for f in flows})
    with path.open() as fh:
        return {int(r["flow_id"]): r for r in csv.DictReader(fh)}


def run_flow(topo: Topology, flows: list[Flow]) -> list[Completion]:
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    return sorted(sim.drain(), key=lambda c: c.flow_id)


def test_the_fluid_standalone_fct_is_the_bytes_at_min_bottleneck_cap_plus_latency() -> None:
    topo = star(2)
    alone = StandaloneFct(topo)
    assert standalone_fct_ns(topo, 0, 1, SIZE, 0, rate_bps=40 * G) == ceil_ns(SIZE, 40 * G) + 2 * US == 202_000
    assert alone(0, 1, SIZE, 0, 40 * G) == 202_000
    assert alone(0, 1, SIZE, 0, 400 * G) == alone(0, 1, SIZE, 0) == ceil_ns(SIZE, B) + 2 * US == 82_000  # cap above
    # framed (netsim, HPCC's form): base RTT, then the payload at the cap when that is slower than the wire bytes
    base = 2 * 2 * US + 2 * (1000 * 8 * G // B)
    assert standalone_fct_ns(topo, 0, 1, SIZE, 0, (1000, 48), 40 * G) == base + SIZE * 8 * G // (40 * G)
    assert standalone_fct_ns(topo, 0, 1, SIZE, 0, (1000, 48), 99 * G) == base + (SIZE + 1000 * 48) * 8 * G // B
    assert standalone_fct_ns(topo, 0, 1, SIZE, 0, (1000, 48)) == base + (SIZE + 1000 * 48) * 8 * G // B


def test_a_capped_flow_alone_in_flow_mode_has_slowdown_1(tmp_path: Path) -> None:
    topo = star(2)
    flows = [Flow(1, 0, 1, SIZE, rate_bps=40 * G, delay_ns=5 * US), Flow(2, 0, 1, SIZE, deps=(1,))]
    done = run_flow(topo, flows)
    rows = flows_csv(tmp_path, topo, done, flows)
    capped, free = rows[1], rows[2]
    # the FCT starts after the flow's delay, and so does the standalone FCT: neither counts delay_ns
    assert int(capped["start_ns"]) == 5 * US
    assert int(capped["standalone_fct_ns"]) == SIZE * 8 * G // (40 * G) + 2 * US
    assert abs(int(capped["fct_ns"]) - int(capped["standalone_fct_ns"])) <= 1 and float(capped["slowdown"]) == 1.0
    # the uncapped flow after it: its path's bottleneck, as before
    assert int(free["standalone_fct_ns"]) == ceil_ns(SIZE, B) + 2 * US and float(free["slowdown"]) == 1.0
    assert (capped["rate_cap_bps"], free["rate_cap_bps"]) == (str(40 * G), "0")


def test_flows_csv_takes_caps_without_flows_and_leaves_an_unknown_cap_empty(tmp_path: Path) -> None:
    """A live run keeps completions, not flows: its caps come apart (`alone`); a producer that knows neither leaves
    `rate_cap_bps` empty and the standalone FCT at the bottleneck."""
    topo = star(2)
    done = [Completion(1, 0, 202_000, SIZE, 0, 1), Completion(2, 0, 82_000, SIZE, 0, 1)]
    for alone, want in (
        ({1: Alone(1, 40 * G)}, [(str(40 * G), 202_000), ("0", 82_000)]),
        (None, [("", 82_000), ("", 82_000)]),
    ):
        path = write_flows_csv(tmp_path / S.FLOWS_CSV, topo, done, alone=alone)
        with path.open() as fh:
            got = [(r["rate_cap_bps"], int(r["standalone_fct_ns"])) for r in csv.DictReader(fh)]
        assert got == want


@pytest.mark.parametrize(
    ("caps", "rates"),
    [
        ((40 * G, 50 * G), (40 * G, 50 * G)),  # caps sum under the link (90G): each at its cap
        ((30 * G, 90 * G), (30 * G, 70 * G)),  # over it (120G): max-min, 30G and the 70G the first leaves
        ((70 * G, 70 * G), (50 * G, 50 * G)),  # over it, neither cap binds: half the link each
    ],
)
def test_two_capped_flows_on_one_link_slow_down_only_past_their_caps_sum(
    tmp_path: Path, caps: tuple[int, int], rates: tuple[int, int]
) -> None:
    """Hosts 0 and 1 send to host 2 at once: they share the switch's 100G port to host 2."""
    topo = star(3)
    flows = [Flow(1, 0, 2, SIZE, rate_bps=caps[0]), Flow(2, 1, 2, SIZE, rate_bps=caps[1])]
    rows = flows_csv(tmp_path, topo, run_flow(topo, flows), flows)
    for fid, cap, rate in zip((1, 2), caps, rates, strict=True):
        alone = ceil_ns(SIZE, cap) + 2 * US
        assert int(rows[fid]["standalone_fct_ns"]) == alone
        fct = int(rows[fid]["fct_ns"])
        assert abs(fct - (SIZE * 8 * G / rate + 2 * US)) <= 1  # max-min's share (the first ends first: the same)
        assert float(rows[fid]["slowdown"]) == pytest.approx((SIZE * 8 * G / rate + 2 * US) / alone, abs=1e-4)
    assert [float(rows[i]["slowdown"]) == 1.0 for i in (1, 2)] == [r == c for r, c in zip(rates, caps, strict=True)]


def test_the_scenario_tables_take_the_caps_too() -> None:
    topo = star(2)
    done = [Completion(1, 0, 202_000, SIZE, 0, 1), Completion(2, 0, 82_000, SIZE, 0, 1)]
    assert completion_rows(topo, done, {1: Alone(1, 40 * G)}) == [(SIZE, 202_000, 202_000), (SIZE, 82_000, 82_000)]
    assert completion_rows(topo, done)[0] == (SIZE, 202_000, 82_000)  # without the caps: what it said before


def test_a_live_runs_kept_completions_carry_their_keys_and_caps_to_the_outcome() -> None:
    """The coordinator keeps each completion with its flow's ECMP key and cap (`CompletionLog`); the outcome carries
    them beside the completions (`completion_alone`) and the parent reads back those not the defaults (a flow keyed
    by its id, without a cap)."""
    log = CompletionLog()
    log.append(Completion(5, 0, 10, 100, 0, 1, "a"), Alone(5, 40 * G))
    log.append(Completion(6, 0, 10, 100, 0, 1, "a"))
    log.append(Completion(9, 0, 10, 100, 1, 0, "b"), Alone(1 << 48, 7))
    log.append(Completion(11, 0, 10, 100, 1, 0, "b"), Alone(3 << 56 | 1 << 24))  # a keyed flow without a cap
    log.append(Completion(12, 0, 10, 100, 1, 0, "b"), Alone(12, 0, True))  # keyed by its id, through the NICs
    want = {5: Alone(5, 40 * G), 9: Alone(1 << 48, 7), 11: Alone(3 << 56 | 1 << 24, 0), 12: Alone(12, 0, True)}
    assert log.alone() == want
    outcome = {"completions": log.wire(), "completion_alone": log.alone_wire()}
    assert completion_alone(outcome) == want
    assert completion_alone({"completions": log.wire()}) == {}  # none kept: no key or cap known


@pytest.mark.ns3
def test_a_capped_flow_alone_in_ns3_has_slowdown_1_within_one_packet(ns3_lib, tmp_path: Path) -> None:
    """The NIC paces the payload at the cap: packet k leaves at k x payload x 8 / cap, so the last byte arrives
    within one packet at the cap of size x 8 / cap (plus two hops of the last packet and both delays)."""
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig

    topo = star(3)
    cfg = PacketConfig()
    payload, header = cfg.payload_bytes, cfg.header_bytes
    one_pkt = payload * 8 * G / (40 * G)
    flows = [Flow(1, 0, 2, SIZE, rate_bps=40 * G), Flow(2, 1, 2, SIZE, rate_bps=50 * G)]  # sum under the link
    with Ns3Simulator(topo, cfg) as sim:
        sim.submit(flows, at=0)
        done = sorted(sim.drain(), key=lambda c: c.flow_id)
        assert sim.finish()
        fct = {r.flow_id: r for r in sim.fct_records()}
    rows = flows_csv(tmp_path, topo, done, flows)
    for f in flows:
        # HPCC's form (fct.txt, netsim): base RTT + the payload at the cap; the C++ fabric's value is Python's
        base = 2 * 2 * US + 2 * (payload * 8 * G // B)
        assert fct[f.id].standalone_ns == base + SIZE * 8 * G // f.rate_bps
        assert fct[f.id].standalone_ns == standalone_fct_ns(
            topo, f.src, f.dst, SIZE, f.id, (payload, header), f.rate_bps
        )
        assert abs(fct[f.id].fct_ns - fct[f.id].standalone_ns) <= one_pkt
        # the fluid form (flows.csv of replays and live runs): size x 8 / cap + the path's latency
        assert int(rows[f.id]["standalone_fct_ns"]) == SIZE * 8 * G // f.rate_bps + 2 * US
        assert abs(int(rows[f.id]["fct_ns"]) - int(rows[f.id]["standalone_fct_ns"])) <= one_pkt
        assert float(rows[f.id]["slowdown"]) == pytest.approx(1.0, abs=one_pkt / (SIZE * 8 * G / f.rate_bps))


def test_compare_marks_a_run_whose_flows_csv_predates_the_caps(tmp_path: Path) -> None:
    """A flows.csv without `rate_cap_bps` (written before 2026-12-02) took no cap: compare says so for that run
    only, and a run's loaded flows carry each flow's cap (the NCCL model caps a replay's network flows)."""
    from phantora.cli import main
    from phantora.report.compare import OLD_SLOWDOWNS, format_table, load_and_compare
    from phantora.results.read import load_run

    wl = tmp_path / "ar.toml"
    wl.write_text('name = "ar"\n[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "64MiB"\nranks = "all"\n')
    new = tmp_path / "new"
    assert main(["replay", str(wl), "--topology", "twoleaf8", "--network", "flow", "--out", str(new)]) == 0
    caps = load_run(new).flows.cap_bps  # type: ignore[union-attr]
    assert (caps >= 0).all() and (caps > 0).any()
    old = tmp_path / "old"
    shutil.copytree(new, old)
    with (new / S.FLOWS_CSV).open(newline="") as fh:
        rows = list(csv.reader(fh))
    with (old / S.FLOWS_CSV).open("w", newline="") as fh:
        cut = rows[0].index("rate_cap_bps")
        csv.writer(fh).writerows(r[:cut] for r in rows)  # the columns as they were: none from rate_cap_bps on
    assert (load_run(old).flows.cap_bps == -1).all()  # type: ignore[union-attr]
    _, cmp = load_and_compare([new, old], None)
    assert [r["line_rate_slowdowns"] for r in cmp.runs] == [False, True]
    text = format_table(cmp)
    assert text.count(OLD_SLOWDOWNS) == 1 and f"old: replay, network flow, cc -, complete; {OLD_SLOWDOWNS}" in text
