"""The scenario's results (issue 36): slowdown buckets, before/during/after phases, and a replay's results.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from phantora.results.scenario import fct_slowdown_buckets, phases


def test_buckets_and_phases_closed_forms() -> None:
    rows = [(5_000, 200, 100), (5_000, 400, 100), (50_000, 1000, 1000), (20_000_000, 3000, 1000), (1, 5, 0)]
    b = {r["bucket"]: r for r in fct_slowdown_buckets(rows)}
    assert b["<10KB"]["flows"] == 2 and b["<10KB"]["median"] == 3.0 and b["<10KB"]["mean"] == 3.0
    assert b["10KB-100KB"]["p99"] == 1.0 and b[">=10MB"]["median"] == 3.0 and b["1MB-10MB"]["flows"] == 0
    spans = [(0, 10), (10, 30), (30, 40), (40, 46)]
    assert phases(spans, 15, 35) == {
        "before": {"count": 1, "mean_ns": 10.0},
        "during": {"count": 2, "mean_ns": 15.0},
        "after": {"count": 1, "mean_ns": 6.0},
    }
    assert phases(spans, 35, None)["during"] == {"count": 2, "mean_ns": 8.0}


def test_replay_with_a_scenario_writes_its_section(tmp_path: Path) -> None:
    topo = tmp_path / "ls.toml"
    topo.write_text(
        '[generator]\nkind = "leaf_spine"\nleaves = 2\nendpoints_per_leaf = 2\nspines = 2\nnic_rate = "100Gbps"\n'
        "nvswitch = false\n"
    )
    sc = tmp_path / "sc.toml"
    sc.write_text(
        'reconvergence = "10us"\n[[events]]\nkind = "link_down"\nat = "11ms"\nduration = "3ms"\n'
        'link = ["leaf0", "spine0"]\n[[events]]\nkind = "background"\nat = "0ns"\nduration = "5ms"\n'
        'cdf = "hadoop"\nload = 0.2\n'
    )
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "phantora.cli", "replay", "ddp_buckets", "--topology", str(topo)]
    cmd += ["--scenario", str(sc), "--out", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    res = json.loads((out / "results.json").read_text())["scenario"]
    assert [a["op"] for a in res["applied"][:2]] == ["down", "reroute"]
    assert res["applied"][1]["t_ns"] == 11_010_000 and res["applied"][0]["links"] == ["leaf0-spine0"]
    ph = res["events"][0]["ops"]
    assert ph["before"]["count"] + ph["during"]["count"] + ph["after"]["count"] == 12
    assert res["background"]["flows"] > 0 and any(r["flows"] for r in res["fct_slowdown_background"])
    assert (out / "scenario_steps.png").exists() and (out / "scenario_steps.svg").exists()
