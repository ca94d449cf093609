"""Seeds and spread: `--seeds N` gives N runs and their mean and spread; a swept `seed` groups a sweep's rows."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from phantora.cli import main
from phantora.report.compare import load_and_compare
from phantora.report.spread import seed_groups, spread
from phantora.results.provenance import read_config
from phantora.sweep import SweepSpec, format_rows, run_sweep

WORKLOAD = 'name = "ar"\n[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "4MiB"\nranks = "all"\n'


def fcts(run: Path) -> np.ndarray:
    with (run / "flows.csv").open() as fh:
        return np.array([int(r["fct_ns"]) for r in csv.DictReader(fh)], dtype=float)


def test_spread_is_the_sample_statistics_of_the_measured_values() -> None:
    assert spread([1, None, 3, 2]) == {"n": 3, "mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0}
    assert spread([5]) == {"n": 1, "mean": 5.0, "std": 0.0, "min": 5.0, "max": 5.0}
    assert spread([None]) is None
    rows = [
        {"status": "ok", "cc": "a", "seed": 1, "t": 10},
        {"status": "ok", "cc": "a", "seed": 2, "t": 14},
        {"status": "failed", "cc": "a", "seed": 3, "t": None},
        {"status": "ok", "cc": "b", "seed": 1, "t": 7},
    ]
    a, b = seed_groups(rows, ["cc", "seed"], ["t"])
    assert (a["cc"], a["seeds"], a["runs"], a["failed"], a["t"], a["t_min"], a["t_max"]) == (
        "a",
        "1,2,3",
        3,
        1,
        12,
        10,
        14,
    )
    assert a["t_std"] == pytest.approx(np.std([10, 14], ddof=1))
    assert (b["t"], b["t_std"]) == (7, 0.0)


@pytest.mark.ns3
def test_seeds_give_n_runs_and_compare_shows_their_mean_and_spread(ns3_lib, tmp_path: Path, capsys) -> None:
    """DCQCN marks at random (RED) between kmin and kmax: the seeds give different runs of the same incast."""
    out = tmp_path / "dcqcn"
    assert (
        main(
            [
                "netsim",
                "--network",
                "ns3",
                "-t",
                "star8",
                "-f",
                "incast4",
                "--cc",
                "dcqcn",
                "--seeds",
                "3",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "over 3 seeds: mean ±standard deviation [min-max]" in text
    doc = json.loads((out / "seeds.json").read_text())
    assert doc["state"] == "complete" and [r["seed"] for r in doc["runs"]] == [1, 2, 3]
    dirs = [out / r["dir"] for r in doc["runs"]]
    assert [read_config(d)["packet"]["fields"]["seed"] for d in dirs] == [1, 2, 3]
    p99 = [float(np.percentile(fcts(d), 99)) for d in dirs]
    assert len(set(p99)) > 1  # the seeds are not the same run
    runs, cmp = load_and_compare([out, dirs[0]])
    assert runs[0].members is not None and len(runs[0].members) == 3
    m = cmp.metric("fct_p99_ns")
    s = m.spread[0]
    assert s is not None and m.values[0] == pytest.approx(np.mean(p99))
    assert (s["n"], s["min"], s["max"]) == (3, min(p99), max(p99))
    assert s["std"] == pytest.approx(np.std(p99, ddof=1))
    assert m.spread[1] is None and m.values[1] == p99[0]  # a single run has no spread
    assert cmp.runs[0]["settings"] == {"seed": "1,2,3"} and cmp.runs[1]["settings"] == {"seed": "1"}
    assert main(["compare", str(out), str(dirs[0]), "--out", str(tmp_path / "rep")]) == 0
    assert "dcqcn (3 seeds)" in capsys.readouterr().out
    assert (tmp_path / "rep" / "time_by_run.png").is_file() and (tmp_path / "rep" / "fct_p99_by_run.png").is_file()


def test_seeds_on_the_flow_network_are_identical_runs(tmp_path: Path, capsys) -> None:
    wl = tmp_path / "ar.toml"
    wl.write_text(WORKLOAD)
    out = tmp_path / "flow"
    assert main(["replay", str(wl), "-t", "star8", "--seeds", "2", "--seed", "5", "-o", str(out)]) == 0
    assert "the flow network is deterministic" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["seed5", "seed6", "seeds.json"]
    assert (out / "seed5" / "flows.csv").read_text() == (out / "seed6" / "flows.csv").read_text()
    _, cmp = load_and_compare([out])
    s = cmp.metric("time_ns").spread[0]
    assert s is not None and s["n"] == 2 and s["std"] == 0.0 and s["min"] == s["max"]
    assert main(["replay", str(wl), "-t", "star8", "--seeds", "2"]) == 2  # no --out, nowhere to put the runs
    assert "--seeds needs --out" in capsys.readouterr().err
    again = ["replay", str(wl), "-t", "star8", "--seeds", "1", "--seed", "7", "-o", str(out)]
    assert main(again) == 2 and "--overwrite" in capsys.readouterr().err  # a group is a run directory too
    assert main([*again, "--overwrite"]) == 0  # replaces the whole group, its seed directories included
    assert sorted(p.name for p in out.iterdir()) == ["seed7", "seeds.json"]


def test_a_swept_seed_gives_each_configuration_its_mean_and_spread(tmp_path: Path) -> None:
    wl = tmp_path / "ar.toml"
    wl.write_text(WORKLOAD)
    spec = SweepSpec(
        name="s", fixed={"workload": str(wl), "topology": "star8"}, grid={"algorithm": ["ring", "tree"], "seed": [1, 2]}
    )
    res = run_sweep(spec, tmp_path / "out", jobs=2, progress=False, plots=True, report=lambda _m: None)
    assert [r["status"] for r in res.rows] == ["ok"] * 4
    with (tmp_path / "out" / "sweep_seeds.csv").open() as fh:
        groups = list(csv.DictReader(fh))
    assert [(g["algorithm"], g["seeds"], g["runs"]) for g in groups] == [("ring", "1,2", "2"), ("tree", "1,2", "2")]
    for g in groups:  # the flow network: both seeds give the same time, so no spread
        times = [r["time_ns"] for r in res.rows if r["algorithm"] == g["algorithm"]]
        assert float(g["time_ns"]) == np.mean(times) and float(g["time_ns_std"]) == 0.0
    assert "over the seeds: mean ±standard deviation" in format_rows(spec, res.rows)
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["seed_groups"][0]["runs"] == 2
    assert (tmp_path / "out" / "time_vs_algorithm.png").is_file()
