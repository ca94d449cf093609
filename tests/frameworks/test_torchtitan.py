"""torchtitan, unmodified, on the simulated CUDA device: its own train.py with llama3_debugmodel (FSDP2).

torchtitan cannot run on gloo (it calls CUDA at start-up), so the checks are against closed forms:
its own log lines (tokens/s, TFLOPs, MFU, memory) are phantora's simulated figures; the training
learns (the loss falls from about ln(vocab)); the same seed gives the same losses.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from assets import make_torchtitan_assets

from phantora.launcher import RunConfig, launch

torchtitan = pytest.importorskip("torchtitan")
TRAIN = Path(torchtitan.__file__).parent / "train.py"
SEQ, BATCH, STEPS = 256, 2, 3
# Needed with torch 2.13, by torchtitan's code rather than by phantora: its default spmd_types backend
# needs an FSDP2 newer than torch 2.13's, and CUDA graphs are not simulated (a clear error says so).
ARGS = [
    "--module", "llama3", "--config", "llama3_debugmodel",
    "--training.steps", str(STEPS), "--training.seq_len", str(SEQ), "--training.local_batch_size", str(BATCH),
    "--training.mixed_precision_param", "float32",  # bf16 matmuls are slow on this CPU; times are the same
    "--parallelism.spmd_backend", "partial_dtensor", "--training.disable_cuda_graphs",
    "--debug.seed", "42",
]  # fmt: skip
LINE = re.compile(
    r"step:\s+(\d+)\s+\S*loss:\s+([0-9.]+).*?memory:\s+([0-9.]+)GiB.*?tps:\s+([0-9,]+).*?tflops:\s+([0-9.]+).*?mfu:\s+([0-9.]+)%"
)


def titan_lines(log: str) -> list[tuple[int, float, float, float, float, float]]:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)
    return [
        (int(m[1]), float(m[2]), float(m[3]), float(m[4].replace(",", "")), float(m[5]), float(m[6]))
        for m in LINE.finditer(plain)
    ]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchtitan reads ./tests/assets (tokenizer, c4_test) from its working directory."""
    return make_torchtitan_assets(tmp_path_factory.mktemp("titan"))


def run(workdir: Path, out: Path, tensors: str = "real") -> Any:
    shutil.rmtree(workdir / "outputs", ignore_errors=True)
    cfg = RunConfig(str(TRAIN), ARGS, "testbed16", nproc=2, tensors=tensors, out_dir=out, timeout_s=600)
    here = os.getcwd()
    os.chdir(workdir)  # the ranks start in the launcher's working directory
    try:
        return launch(cfg)
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def real(workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return run(workdir, tmp_path_factory.mktemp("real"))


def test_torchtitan_logs_the_simulated_figures(real: Any) -> None:
    lines = titan_lines(real.logs["rank 0"])
    steps = real.summary["steps"]
    assert [x[0] for x in lines] == list(range(1, STEPS + 1)) and len(steps) == STEPS
    for (step, _, _, tps, tflops, mfu), st in zip(lines[1:], steps[1:], strict=True):
        # tokens/s per GPU = the rank's tokens over the simulated step (torchtitan times it with perf_counter)
        assert tps == pytest.approx(BATCH * SEQ / (st["time_ns"] / 1e9), rel=0.03), step
        assert mfu == pytest.approx(100 * tflops * 1e12 / 989e12, abs=0.01)  # it reads the H100's bf16 peak
    # its memory line: the caching allocator's reserved peak over the step (it resets the peak at each log
    # line), which covers what the tensors held at their peak
    mem = real.summary["memory"]
    assert lines[-1][2] == pytest.approx(mem["step_reserved_peak_bytes"][-1] / 2**30, abs=0.006)
    assert mem["step_peak_bytes"][-1] <= mem["step_reserved_peak_bytes"][-1]
    assert max(x[2] for x in lines) <= mem["reserved_peak_bytes"] / 2**30 + 0.005  # the run's peak is not reset


def test_torchtitan_learns(real: Any) -> None:
    losses = [x[1] for x in titan_lines(real.logs["rank 0"])]
    assert abs(losses[0] - math.log(2048)) < 1.0 and losses[-1] < losses[0] - 0.3  # from ~ln(vocab), falling


@pytest.mark.slow  # a second whole real-tensor run (~40 s): kept out of the default run for the 15-minute budget
def test_torchtitan_repeats_with_a_seed(real: Any, workdir: Path, tmp_path: Path) -> None:
    losses = [x[1] for x in titan_lines(real.logs["rank 0"])]
    again = [x[1] for x in titan_lines(run(workdir, tmp_path / "again").logs["rank 0"])]
    assert again == losses


def test_torchtitan_phantom_steps_match_real(real: Any, workdir: Path, tmp_path: Path) -> None:
    """Phantom mode (no tensor data): the real run's step times. Within 1%: the phantom run charges a few
    more small ops around torchtitan's end-of-step metrics (see docs/runtime.md)."""
    ph = run(workdir, tmp_path / "phantom", tensors="phantom")
    want = [s["time_ns"] for s in real.summary["steps"]][1:]
    assert [s["time_ns"] for s in ph.summary["steps"]][1:] == pytest.approx(want, rel=0.01)
    lines = titan_lines(ph.logs["rank 0"])
    assert len(lines) == STEPS and all(x[1] == 0.0 for x in lines)  # its loss reads a placeholder: 0.0
