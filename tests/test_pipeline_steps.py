"""A pipeline schedule's `step()` ends a step of a program that has no optimizer (runtime/autostep.py), and only then;
DeepSpeed's ZeRO, which steps the optimizer it wraps once per parameter group, ends one step an iteration.

tests/scripts/pipeline_steps.py runs 3 iterations of a 2-stage GPipe schedule on 2 ranks; its rank 0 (the first
stage, whose last backward ends each iteration) records its own synchronised simulated clock at each iteration's
end. Each step must end there: with the schedule alone (before, the run had no step), with an optimizer step after
the schedule's (the optimizer's marks, not both: 3 steps, not 6), and with the script's own
`phantora.runtime.step()` after it. tests/scripts/deepspeed_param_groups.py's AdamW has two parameter groups, as HF
Trainer's has: ZeRO-2 made two steps an iteration (its optimizer's steps, one per group), and must make one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "pipeline_steps.py"
ITERATIONS = 3


@pytest.mark.parametrize("mode", ["schedule", "optimizer", "explicit"])
def test_each_iteration_is_one_step_ending_where_the_program_ends_it(tmp_path: Path, mode: str) -> None:
    clocks = tmp_path / "clocks.json"
    rep = launch(RunConfig(str(SCRIPT), [str(clocks), mode, str(ITERATIONS)], "testbed16", nproc=2, timeout_s=300))
    ends = [s["end_ns"] for s in rep.summary["steps"]]
    assert ends == json.loads(clocks.read_text())
    assert len(ends) == ITERATIONS
    times = [s["time_ns"] for s in rep.summary["steps"]]
    assert times[1] == times[2] > 0  # the same iteration twice, after the first (which holds the set-up)


@pytest.mark.parametrize("stage", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_deepspeed_steps_once_an_iteration_whatever_its_parameter_groups(tmp_path: Path, stage: int) -> None:
    pytest.importorskip("deepspeed")
    clocks = tmp_path / "clocks.json"
    script = SCRIPT.parent / "deepspeed_param_groups.py"
    rep = launch(RunConfig(str(script), [str(clocks), str(stage)], "testbed16", nproc=2, timeout_s=300))
    assert [s["end_ns"] for s in rep.summary["steps"]] == json.loads(clocks.read_text())
