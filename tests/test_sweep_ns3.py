"""A CC sweep on the packet-level (ns-3) engine: 4 algorithms on a 7-to-1 incast, a small switch buffer.

Expected (issue 7): the table has 4 rows, their PFC paused times all differ, and `none` (no congestion
control, senders at line rate) pauses the most. Each run is its own process and pays ns-3's start-up,
so one sweep takes a minute or two on 2 cores. The replay variant needs `phantora replay --set`
(PacketConfig fields) and the PFC trace in replay's run directory; until replay has `--set`, the same
sweep runs through `phantora netsim` on the equivalent HPCC flow file.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from phantora.report.compare import load_and_compare
from phantora.report.fabric import pause_intervals
from phantora.results.read import load_run
from phantora.sweep import SweepSpec, run_sweep

pytestmark = [pytest.mark.ns3, pytest.mark.timeout(1200)]  # 4 ns-3 start-ups; slow on a busy machine
ROOT = Path(__file__).resolve().parents[1]
CCS = ["none", "dcqcn", "hpcc", "dctcp"]
BUFFER = 1_000_000  # bytes per switch: small enough that a 7-to-1 incast reaches the PFC threshold


def _replay_has_set() -> bool:
    from phantora.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return "--set" in sub.choices["replay"]._option_string_actions


def _check_cc_table(rows: list[dict]) -> None:
    assert len(rows) == 4
    assert [r["cc"] for r in rows] == CCS
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    paused = {r["cc"]: r["pfc_paused_ns"] for r in rows}
    assert all(v is not None for v in paused.values()), "PFC paused time not measured"
    assert len(set(paused.values())) == 4, paused
    assert max(paused, key=paused.get) == "none", paused
    assert paused["none"] > 0


def _skip_without_ns3() -> None:
    pytest.importorskip("ns3", reason="the ns3 wheel is not installed")
    from phantora.netsim.packet import library_path, needs_build

    if needs_build() and not library_path().exists():
        pytest.skip("the ns-3 fabric library is not built (scripts/build_ns3.sh)")


# Slow (~48 s, one packet-mode replay per congestion control); run with -m slow.
@pytest.mark.slow
@pytest.mark.skipif(not _replay_has_set(), reason="phantora replay has no --set yet (PacketConfig fields)")
def test_cc_sweep_incast_replay(tmp_path: Path) -> None:
    _skip_without_ns3()
    spec = SweepSpec(
        name="cc-incast",
        fixed={
            "workload": str(ROOT / "workloads" / "incast_heavy.toml"),
            "topology": "star8",
            "network": "ns3",
            "set.buffer_bytes": BUFFER,
        },
        grid={"cc": CCS},
        timeout_s=600,
    )
    res = run_sweep(spec, tmp_path / "sweep", jobs=2, progress=False)
    _check_cc_table(res.rows)
    assert (tmp_path / "sweep" / "time_vs_cc.png").stat().st_size > 10_000
    assert (tmp_path / "sweep" / "pfc_paused_vs_cc.png").stat().st_size > 10_000


def _incast_flow_file(path: Path) -> None:
    """The incast as an HPCC flow file: hosts 1-7 send 1 MB to host 0 at 0 and again at 500 us."""
    lines = [f"{s} 0 3 100 1000000 {burst * 0.0005:.9f}" for burst in range(2) for s in range(1, 8)]
    path.write_text(f"{len(lines)}\n" + "\n".join(lines) + "\n")


@pytest.mark.skipif(_replay_has_set(), reason="the replay variant covers the CC sweep")
def test_cc_sweep_incast_netsim(tmp_path: Path) -> None:
    _skip_without_ns3()
    flows = tmp_path / "incast.txt"
    _incast_flow_file(flows)
    spec = SweepSpec(
        name="cc-incast",
        command=("netsim", "--topology", "{topology}", "--flows", "{flows}", "--out", "{out}"),
        fixed={
            "topology": "star8",
            "flows": str(flows),
            "network": "ns3",
            "set.buffer_bytes": BUFFER,
            "set.queue_sample_ns": 5000,
        },
        grid={"cc": CCS},
        timeout_s=600,
    )
    out = tmp_path / "sweep"
    res = run_sweep(spec, out, jobs=2, progress=False)
    _check_cc_table(res.rows)
    for run in res.runs:
        # Two independent accounts of paused time: pause/resume frame pairs vs the C++ per-port counters.
        data = load_run(run.out)
        spans = pause_intervals(data.pfc, data.end_ns)
        with (run.out / "links.csv").open() as fh:
            counted = sum(int(r["paused_ns"]) for r in csv.DictReader(fh))
        assert sum(b - a for lst in spans.values() for a, b in lst) == pytest.approx(counted, rel=0.01)
    for name in ("time_vs_cc", "pfc_paused_vs_cc", "fct_cdf"):
        assert (out / f"{name}.png").stat().st_size > 10_000
    runs, cmp = load_and_compare([r.out for r in res.runs])
    assert cmp.metric("pfc_paused_ns").diff_pct[3] < 0  # dctcp pauses less than none
    assert all(v is not None for v in cmp.metric("queue_max_bytes").values)


def test_sweep_csv_counts_each_runs_engine_warnings(tmp_path: Path, capsys) -> None:
    """sweep.csv's `warnings` counts the warnings each run's engine gave (engine.json): on hpcc/star8 (one switch of 8
    ports, 3 x 100 Gb/s x 1 us / 8 = 37,500 B of PFC headroom and 4,096 B of reserve each: 332,768 B) a 300 KB
    buffer leaves no shared pool (1), 2 MB does (0); the printed table has the column and the warning under it with
    the run that gave it; the sweep told it while the run ran, tagged with the run."""
    import pandas as pd

    from phantora.sweep import format_rows

    _skip_without_ns3()
    spec = SweepSpec(
        name="buffers",
        command=("netsim", "--topology", "hpcc/star8", "--flows", "{flows}", "--out", "{out}"),
        fixed={"flows": str(ROOT / "workloads" / "incast4.flows.txt"), "network": "ns3", "cc": "dcqcn"},
        grid={"set.buffer_bytes": [300_000, 2_000_000]},
        timeout_s=600,
    )
    res = run_sweep(spec, tmp_path / "sweep", jobs=2, progress="lines", plots=False)
    told = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(told) == 1 and told[0].startswith("run 0 (") and f"take {8 * 37_500 + 8 * 4_096:,} B" in told[0]
    df = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert df["status"].tolist() == ["ok", "ok"] and df["warnings"].tolist() == [1, 0]
    table = format_rows(spec, res.rows).splitlines()
    assert table[0].split()[-1] == "warnings" and [line.split()[-1] for line in table[2:4]] == ["1", "0"]
    assert table[4] == "warning (run 0): " + told[0].split(": warning: ", 1)[1]
    quiet = format_rows(spec, [{**r, "warnings": 0} for r in res.rows]).splitlines()  # no run warned: no column
    assert quiet[0].split()[-1] == "ecn" and len(quiet) == 4
