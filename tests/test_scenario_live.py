"""`phantora run --scenario` (issue 36): slow GPUs in live ranks and events at a step boundary, in results.json and
trace.json, against the clean run (closed forms: the slowed steps' compute is k times the clean one's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.report.scenario_plot import plot_scenario_steps
from tests.live_scenario_setup import SCRIPT, TWO_LEAF_TOPO

pytestmark = pytest.mark.slow

TOPO = TWO_LEAF_TOPO
K = 3.0
SCENARIO = f"""reconvergence = "5us"
[[events]]
kind = "gpu_slow"
rank = 1
factor = {K}
at_step = 2
[[events]]
kind = "link_down"
at_step = 1
link = ["leaf0", "spine0"]
duration = "50us"
"""


def run(tmp: Path, name: str, scenario: Path | None) -> tuple[list[dict], dict, list[dict]]:
    out = tmp / name
    topo = tmp / "ls.toml"
    cfg = RunConfig(str(SCRIPT), ["--steps", "4"], str(topo), nproc=2, out_dir=out,
                    engine=EngineSpec(scenario=None if scenario is None else str(scenario)))  # fmt: skip
    launch(cfg)
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    res = json.loads((out / "results.json").read_text())
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert not (out / "scenario_steps.png").exists()  # drawn by `phantora run` after the launch, not by the launch
    if scenario is not None:  # the step-time plot, events marked
        plot_scenario_steps(out, res["scenario"])
        assert (out / "scenario_steps.png").stat().st_size > 0 and (out / "scenario_steps.svg").exists()
    return steps, res, trace


def test_slow_gpu_and_step_events_in_a_live_run(tmp_path: Path) -> None:
    (tmp_path / "ls.toml").write_text(TOPO)
    sc = tmp_path / "sc.toml"
    sc.write_text(SCENARIO)
    clean, _, _ = run(tmp_path, "clean", None)
    slow, res, trace = run(tmp_path, "slow", sc)
    # steps 0-1 as the clean run; from step 2 rank 1 computes K times slower, every rank waits for it at the
    # all-reduce: the step's compute is exactly K x the clean one, its time grows by (K - 1) x that compute
    for i in (0, 1):
        assert slow[i]["time_ns"] == clean[i]["time_ns"]
    for i in (2, 3):
        assert slow[i]["compute_ns"] == pytest.approx(K * clean[i]["compute_ns"], abs=64)
        assert slow[i]["time_ns"] == pytest.approx(clean[i]["time_ns"] + (K - 1) * clean[i]["compute_ns"], abs=64)
    s = res["scenario"]
    step1 = clean[0]["end_ns"]  # step 1 starts as step 0 ends (the link event fires then: no fault before it)
    assert s["steps_started"]["1"] == step1
    assert [(a["op"], a["t_ns"]) for a in s["applied"]] == [
        ("down", step1),
        ("reroute", step1 + 5_000),
        ("up", step1 + 50_000),
        ("reroute", step1 + 55_000),
    ]
    (w,) = s["gpu_slow"]
    assert w["rank"] == 1 and w["factor"] == K and w["start_ns"] == slow[1]["end_ns"]
    assert s["slowed_ns"]["1"] == pytest.approx((K - 1) * (clean[2]["compute_ns"] + clean[3]["compute_ns"]), abs=128)
    by_event = {e["event"]: e for e in s["events"]}
    assert by_event["gpu_slow#0"]["steps"]["before"]["count"] == 2
    assert by_event["gpu_slow#0"]["steps"]["during"]["count"] == 2
    marks = [e for e in trace if e.get("cat") == "scenario" and e["ph"] == "i"]
    assert [(m["args"]["op"], m["ts"]) for m in marks if "op" in m["args"]][0] == ("down", step1 / 1000)
    assert any(e.get("cat") == "scenario" and e["ph"] == "X" and e["args"]["rank"] == 1 for e in trace)
