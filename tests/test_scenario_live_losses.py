"""A fault delays a live run but drops no data (issue 36, "nothing is lost"): real-tensor training under a
scenario (a failed uplink, 30% WebSearch background, a x2 slow GPU) completes with exactly the clean run's losses,
parameters and gradients, and longer steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.live_scenario_setup import ROOT, TWO_LEAF_TOPO

pytestmark = pytest.mark.slow

TOPO = TWO_LEAF_TOPO
SCENARIO = """seed = 2
reconvergence = "50us"
[[events]]
kind = "link_down"
at = "0ns"
link = ["leaf0", "spine0"]
[[events]]
kind = "background"
at = "0ns"
duration = "20ms"
cdf = "websearch"
load = 0.3
[[events]]
kind = "gpu_slow"
rank = 1
factor = 2.0
at_step = 1
"""


def _run(tmp: Path, name: str, scenario: bool) -> tuple[list[str], list[int], dict[str, np.ndarray]]:
    out = tmp / name
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", str(tmp / "ls.toml"), "--nproc", "2"]
    cmd += ["--tensors", "real", "--out", str(out), "--no-progress"]
    cmd += ["--scenario", str(tmp / "sc.toml")] if scenario else []
    cmd += [str(ROOT / "examples" / "gpt_ddp.py"), "--steps", "3", "--save", str(tmp / f"{name}-state")]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
    losses = [line.split("time")[0] for line in proc.stdout.splitlines() if line.startswith("step ") and "loss" in line]
    steps = [json.loads(line)["time_ns"] for line in (out / "steps.jsonl").read_text().splitlines()]
    state = {}
    for r in range(2):
        with np.load(tmp / f"{name}-state.rank{r}.npz") as z:
            state.update({f"{r}/{k}": z[k] for k in z.files})
    return losses, steps, state


def test_a_faulty_real_run_trains_exactly_as_the_clean_one(tmp_path: Path) -> None:
    (tmp_path / "ls.toml").write_text(TOPO)
    (tmp_path / "sc.toml").write_text(SCENARIO)
    clean_loss, clean_steps, clean_state = _run(tmp_path, "clean", False)
    loss, steps, state = _run(tmp_path, "faulty", True)
    assert len(clean_loss) == 3 and loss == clean_loss
    assert state.keys() == clean_state.keys() and all(np.array_equal(state[k], clean_state[k]) for k in state)
    assert steps[1] > clean_steps[1] and steps[2] > clean_steps[2]  # the faults did cost time
    res = json.loads((tmp_path / "faulty" / "results.json").read_text())["scenario"]
    assert res["background"]["flows"] > 0 and res["slowed_ns"]["1"] > 0
