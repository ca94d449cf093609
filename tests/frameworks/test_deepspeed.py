"""DeepSpeed ZeRO 1, 2 and 3 with a torch optimizer, unmodified, on the simulated CUDA device
(examples/deepspeed_zero.py).

The same script runs on gloo with DeepSpeed's CPU accelerator (`DS_ACCELERATOR=cpu`). Checks: the losses
are gloo's (ZeRO changes where the maths runs, not the maths: stage 1 to the printed digit, the others to
summation order); the communication is ZeRO's (Rajbhandari et al., 2020): stages 1 and 2 all-reduce each
gradient byte and all-gather each updated parameter byte once a step, stage 3 reduce-scatters each
gradient byte once a step and gathers the parameters for the forward and again for the backward; and
the optimizer state (Adam's two moments) is split across the ranks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phantora.launcher import RunConfig, launch
from tests.installed import needs

pytestmark = needs("deepspeed")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "deepspeed_zero.py"
STEPS, WORLD, FP32 = 4, 2, 4
REFERENCE = Path(__file__).resolve().parent / "ds_gloo_reference.py"
# The first test's budget holds the gloo reference (two processes) and a live run, at load 40
BUDGET_S = 600


def losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)$", log, flags=re.M)]


def param_bytes(log: str) -> int:
    m = re.search(r"^parameters (\d+)$", log, flags=re.M)
    assert m, log[-2000:]
    return FP32 * int(m[1])


def run(out: Path, stage: int) -> Any:
    cfg = RunConfig(str(SCRIPT), ["--stage", str(stage)], "testbed16", nproc=WORLD, out_dir=out, timeout_s=600)
    return launch(cfg)


# gloo's own teardown at exit can abort a rank (SIGABRT) after it has trained and printed every loss, and torchrun
# then ends the other rank: rarer since examples/deepspeed_zero.py leaves its groups (2f3d8086: 0 of 20 local runs),
# it still happened in a CI run on 2026-12-05 (rank 1 SIGABRT; both tests errored at this fixture).
# The reference is the losses, so a run counts once every rank printed all STEPS of them; a run that did not is
# tried again, at most ATTEMPTS times, and the failure shows each rank's own stderr.
ATTEMPTS = 3


def rank_logs(logs: Path, name: str) -> dict[int, str]:
    """Each rank's NAME (stdout.log / stderr.log) under torchrun's --log-dir."""
    return {int(f.parent.name): f.read_text() for f in logs.rglob(name)}


@pytest.fixture(scope="module")
def gloo_losses(tmp_path_factory: pytest.TempPathFactory) -> list[list[float]]:
    """Each rank's losses on gloo (ZeRO stage 1), without DeepSpeed's shared-memory op (ds_gloo_reference.py)."""
    failures = []
    for attempt in range(ATTEMPTS):
        out = tmp_path_factory.mktemp(f"gloo{attempt}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
        cmd += ["--log-dir", str(out / "logs"), "--redirects", "3", str(REFERENCE), str(SCRIPT), "--stage", "1"]
        env = dict(os.environ, DS_ACCELERATOR="cpu")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out, env=env)
        found = {rank: losses(log) for rank, log in rank_logs(out / "logs", "stdout.log").items()}
        if sorted(found) == list(range(WORLD)) and all(len(v) == STEPS for v in found.values()):
            return [found[r] for r in range(WORLD)]
        errs = rank_logs(out / "logs", "stderr.log")
        tails = "".join(f"\n--- rank {r} stderr ---\n{errs[r][-1500:]}" for r in sorted(errs))
        failures.append(f"attempt {attempt}: exit {proc.returncode}, losses {found}{tails}\n{proc.stderr[-1500:]}")
    pytest.fail("the gloo reference never printed every loss:\n" + "\n".join(failures))


def check(report: Any, gloo: list[list[float]], exact: bool) -> int:
    """Each rank's losses against its gloo twin's; returns the model's fp32 bytes."""
    for rank in range(WORLD):
        mine = losses(report.logs[f"rank {rank}"])
        assert len(mine) == STEPS and mine[-1] < mine[0] - 0.5  # it learns
        assert mine == (gloo[rank] if exact else pytest.approx(gloo[rank], rel=1e-4))
    full = param_bytes(report.logs["rank 0"])
    held = report.summary["memory"]["breakdown_at_peak"]["optimizer"]
    assert held == pytest.approx(2 * full / WORLD, rel=0.01)  # Adam's two moments, split across the ranks
    return full


@pytest.mark.timeout(BUDGET_S)
@pytest.mark.parametrize("stage", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_zero_1_2_train_as_on_gloo(gloo_losses: list[list[float]], tmp_path: Path, stage: int) -> None:
    report = run(tmp_path, stage)
    full = check(report, gloo_losses, exact=stage == 1)
    comm = report.summary["ranks"][0]["comm"]
    assert 0 <= comm["all_reduce"]["bytes"] - STEPS * full < 64  # each gradient once (+ a loss scalar)
    assert comm["all_gather"]["bytes"] == STEPS * full  # each rank's updated half, to every rank


@pytest.mark.timeout(BUDGET_S)
def test_zero_3_trains_as_on_gloo(gloo_losses: list[list[float]], tmp_path: Path) -> None:
    report = run(tmp_path, 3)
    full = check(report, gloo_losses, exact=False)
    comm = report.summary["ranks"][0]["comm"]
    assert comm["reduce_scatter"]["bytes"] == STEPS * full  # each gradient once, to its owner
    # parameters gathered for the forward, and again for the backward except those still held
    assert STEPS * full < comm["all_gather"]["bytes"] <= 2 * STEPS * full
