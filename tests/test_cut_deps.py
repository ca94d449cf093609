"""Flows with dependencies across partition workers (issue 38): a dependency completed in one worker releases its
dependent in another, keyed as one engine's start, and the windows end before any such release can land.

The default tests check the window rule (`window_end`) against its definition; the slow ones run a flow DAG whose
releases cross workers (with and without a delay, through a barrier marker of no bytes that completes in a
zero-delay chain of one ns, and a flow of no bytes between two groups) on one keyed engine and on 2 and 4 worker
processes, and a workload file through `phantora netsim`, and compare every record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phantora.cli import main
from phantora.netsim.base import Flow
from phantora.netsim.cut_windows import BEFORE, LOCKSTEP, NEVER, THROUGH, WindowStats, why_end, width_bucket, window_end
from tests.test_cut_workers import TOPO, UNTIL_NS, config, one_engine, traffic

NETSIM = ["netsim", "--network", "ns3", "--cc", "dcqcn", "-t", "hpcc/leafspine16", "-q"]
WORKLOAD = Path(__file__).resolve().parent / "data" / "workloads" / "deps_small.toml"


def test_a_window_without_releases_is_the_lookahead() -> None:
    assert window_end(5_000, 1_000, NEVER, NEVER, -1) == (6_000, BEFORE)


def test_the_workers_earliest_output_widens_the_window_past_the_lookahead() -> None:
    """No message sent from now on arrives before 7,500 (`reach`): the window runs to it; a reach inside the
    lookahead changes nothing (the lookahead bounds every send from 5,000 on); NEVER: nothing will cross, run on."""
    assert window_end(5_000, 1_000, NEVER, NEVER, -1, reach=7_500) == (7_500, BEFORE)
    assert why_end(5_000, 1_000, NEVER, NEVER, 7_500, BEFORE, 7_500) == "earliest output"
    assert window_end(5_000, 1_000, NEVER, NEVER, -1, reach=5_500) == (6_000, BEFORE)
    assert window_end(5_000, 1_000, NEVER, NEVER, -1, reach=NEVER) == (NEVER, BEFORE)
    assert window_end(5_000, 1_000, 6_500, 7_000, -1, reach=7_500) == (6_500, BEFORE)  # a release lands first
    assert window_end(5_000, 1_000, NEVER, NEVER, -1, cap=5_001, reach=7_500) == (5_001, BEFORE)


def test_a_release_after_its_completion_ns_ends_the_window_before_it_lands() -> None:
    """Released at 5,400 at the earliest, landing after that ns (a delay): every event before 5,400 may run."""
    assert window_end(5_000, 1_000, 5_400, NEVER, -1) == (5_400, BEFORE)
    assert window_end(5_000, 1_000, 7_000, NEVER, -1) == (6_000, BEFORE)  # beyond the lookahead: no effect


def test_a_release_in_its_completion_ns_lets_that_ns_run_through_its_earlier_scheduled_events() -> None:
    """A release made at 5,400 with no delay orders after every event of 5,400 scheduled before 5,400."""
    assert window_end(5_000, 1_000, NEVER, 5_400, -1) == (5_400, THROUGH)
    assert window_end(5_000, 1_000, 6_000, 5_400, -1) == (5_400, THROUGH)


def test_bounds_below_the_window_start_count_as_it() -> None:
    """Nothing runs before the least next event (5,000) anywhere, so a looser bound means 5,000."""
    assert window_end(5_000, 1_000, 4_000, NEVER, -1) == (5_000, THROUGH)
    assert window_end(5_000, 1_000, NEVER, 10, -1) == (5_000, THROUGH)


def test_the_rest_of_a_ns_run_through_goes_in_lockstep() -> None:
    """Once the events of 5,000 scheduled before it have run, a release may still come from one scheduled at
    5,000 (a zero-delay chain): the rest of that ns runs one worker at a time."""
    assert window_end(5_000, 1_000, NEVER, 5_000, 5_000) == (5_000, LOCKSTEP)
    assert window_end(5_000, 1_000, NEVER, 5_001, 5_000) == (5_001, THROUGH)  # no release in 5,000: as usual


def test_a_window_is_counted_by_what_ended_it() -> None:
    """The profile of the windows: the lookahead, a release after its completion's ns, one in it, lockstep."""
    cases = [
        ((5_000, 1_000, NEVER, NEVER, -1), "lookahead"),
        ((5_000, 1_000, 5_400, NEVER, -1), "release after"),
        ((5_000, 1_000, NEVER, 5_400, -1), "release in"),
        ((5_000, 1_000, 5_200, 5_400, -1), "release after"),
        ((5_000, 1_000, NEVER, 5_000, 5_000), "lockstep"),
    ]
    for (glob, la, later, same, through), why in cases:
        end, how = window_end(glob, la, later, same, through)
        assert why_end(glob, la, later, same, end, how) == why, (glob, later, same)


def test_window_widths_go_by_decades() -> None:
    assert [width_bucket(w) for w in (0, 1, 2, 9, 10, 99, 1_000, 9_999)] == [
        "0", "1", "2-9", "2-9", "10-99", "10-99", "1000-9999", "1000-9999"
    ]  # fmt: skip
    stats = WindowStats()
    for why, width in (("release in", 1), ("release in", 1), ("lookahead", 1_000)):
        stats.count(why, width)
    assert stats.ended_by == {"release in": 2, "lookahead": 1} and stats.widths == {"1": 2, "1000-9999": 1}


def dag() -> list[Flow]:
    """`traffic()` (ids 0-23), then: each NIC i's flow released by flow i's completion at another leaf (ids
    100-115; every other one with a 700 ns delay); a barrier marker of no bytes on NIC 2 after all of them (200,
    no delay: it completes in the ns of the last); 16 flows after the marker, started by it in that very ns across
    groups (300-315); a flow of no bytes from NIC 0 to NIC 15 after flow 300 (400), and NIC 15's flow after it
    (401)."""
    eps = TOPO.endpoints
    n = len(eps)
    flows = traffic()
    flows += [
        Flow(100 + i, eps[(i + 8) % n], eps[(i + 3) % n], 100_000, deps=(i,), delay_ns=0 if i % 2 else 700)
        for i in range(n)
    ]
    flows.append(Flow(200, eps[2], eps[2], 0, deps=tuple(100 + i for i in range(n))))
    flows += [Flow(300 + i, eps[i * 5 % n], eps[(i * 5 + 9) % n], 50_000, deps=(200,)) for i in range(n)]
    flows += [Flow(400, eps[0], eps[15], 0, deps=(300,)), Flow(401, eps[15], eps[0], 20_000, deps=(400,))]
    return flows


def records(res: Any) -> dict[str, Any]:
    return {
        "completions": sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions),
        "fct": res.fct,
        "pfc": res.pfc,
        "marks": res.marks,
        "cnps": res.cnps,
        "transport": res.transport,
        "channels": res.channels,
        "trims": res.trims,
    }


@pytest.mark.slow
@pytest.mark.ns3
def test_a_dag_across_workers_gives_one_engines_records() -> None:
    from bridge.cut_pool import run_partitioned

    cfg = config("dcqcn", None)
    want = one_engine(cfg, dag())
    assert len(want["completions"]) == len(dag()) and want["pfc"] and want["marks"]
    starts = {fid: start for fid, start, _ in want["completions"]}
    ends = {fid: end for fid, _, end in want["completions"]}
    assert starts[200] == max(ends[100 + i] for i in range(16))  # the barrier: in the ns of its last dependency
    assert all(starts[300 + i] == ends[200] for i in range(16))  # ... and its dependents in that ns too
    for n in (2, 4):
        res = run_partitioned(TOPO, cfg.with_updates(partition=n), dag(), until=UNTIL_NS)
        got = records(res)
        for name, value in want.items():
            assert got[name] == value, (n, name)
        assert any(w["lockstep_rounds"] > 0 for w in res.workers)  # the zero-delay chain ran in lockstep


@pytest.mark.slow
def test_a_workload_on_two_workers_writes_one_keyed_engines_files(tmp_path: Path) -> None:
    """A workload (one flow DAG with compute markers) through `phantora netsim`: every file byte for byte."""
    from tests.test_netsim_partition import KEYED, SAME_FILES

    wl = WORKLOAD
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*NETSIM, "-f", str(wl), *KEYED, "--queue-sample-ns", "0", "--out", str(one)]) == 0
    assert main([*NETSIM, "-f", str(wl), *KEYED, "--set", "partition=2", "--out", str(two)]) == 0
    for name in SAME_FILES:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert len((one / "fct.txt").read_text().splitlines()) > 500
