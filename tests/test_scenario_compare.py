"""`phantora compare` of a faulty run beside a clean one (issue 36): the fault's cost and the collectives that
absorbed it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from phantora.report.compare import load_and_compare
from phantora.report.scenario_compare import absorbed

TOPO = """[generator]
kind = "leaf_spine"
leaves = 2
endpoints_per_leaf = 2
spines = 2
nic_rate = "100Gbps"
nvswitch = false
"""


def test_absorbed_ranks_increases_and_shares() -> None:
    base = {"a": 10, "b": 20, "c": 30, "d": 5}
    run = {"a": 10, "b": 26, "c": 39, "d": 4, "e": 100}  # e is not in the baseline: not compared
    rows = absorbed(base, run)
    assert [(r["name"], r["increase_ns"], r["share"]) for r in rows] == [("c", 9, 0.6), ("b", 6, 0.4)]


def replay(tmp: Path, name: str, scenario: Path | None) -> Path:
    out = tmp / name
    cmd = [sys.executable, "-m", "phantora.cli", "replay", "ddp_buckets", "--topology", str(tmp / "ls.toml")]
    cmd += ["--out", str(out), "--no-progress"] + (["--scenario", str(scenario)] if scenario else [])
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def test_compare_reports_the_fault_cost(tmp_path: Path) -> None:
    """Both uplinks of leaf0 at 50G from 20 ms on: the buckets that run after 20 ms slow down, the earlier ones do
    not; the cost is the makespan difference and the ops that absorbed it are the slowed ones."""
    (tmp_path / "ls.toml").write_text(TOPO)
    sc = tmp_path / "sc.toml"
    sc.write_text(
        "".join(
            f'[[events]]\nkind = "link_degrade"\nat = "20ms"\nlink = ["leaf0", "{s}"]\nrate = "50Gbps"\n'
            for s in ("spine0", "spine1")
        )
    )
    clean, faulty = replay(tmp_path, "clean", None), replay(tmp_path, "faulty", sc)
    _, cmp = load_and_compare([clean, faulty])
    (cost,) = cmp.fault_costs
    res = [json.loads((d / "results.json").read_text()) for d in (clean, faulty)]
    assert cost["time_cost_ns"] == res[1]["makespan_ns"] - res[0]["makespan_ns"] > 0
    ops = [{o["name"]: o for o in r["ops"]} for r in res]
    slowed = {n for n, o in ops[1].items() if o["end_ns"] > 20_000_000 and o["time_ns"] > ops[0][n]["time_ns"]}
    assert slowed and {a["name"] for a in cost["absorbed_by"]} <= slowed
    early = [n for n, o in ops[0].items() if o["end_ns"] <= 20_000_000]
    assert early and all(ops[1][n]["time_ns"] == ops[0][n]["time_ns"] for n in early)
    assert [e["event"] for e in cost["events"]] == ["link_degrade#0", "link_degrade#1"]
