"""torchtitan, unmodified, on the simulated CUDA device: its own train.py with llama3_debugmodel: FSDP2,
TP x FSDP2, and pipeline parallelism with its 1F1B and Interleaved1F1B schedules.

torchtitan cannot run on gloo (it calls CUDA at start-up), so the checks are against closed forms:
its own log lines (tokens/s, TFLOPs, MFU, memory) are phantora's simulated figures; the training
learns (the loss falls from about ln(vocab)); the same seed gives the same losses; tensor parallelism
trains as FSDP alone does and moves exactly the activations its sharding plan moves; the pipeline
sends one activation forward and one gradient back per micro-batch and stage boundary.
"""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from assets import make_torchtitan_assets

from phantora.launcher import RunConfig, launch
from tests.installed import needs, package_dir

pytestmark = needs("torchtitan")
TRAIN = package_dir("torchtitan") / "train.py"
SEQ, BATCH, STEPS = 256, 2, 3
DIM, LAYERS, FP32 = 256, 6, 4  # llama3_debugmodel's width and depth (torchtitan/models/llama3/__init__.py)
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


def run(
    workdir: Path,
    out: Path,
    tensors: str = "real",
    nproc: int = 2,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Any:
    shutil.rmtree(workdir / "outputs", ignore_errors=True)
    cfg = RunConfig(str(TRAIN), [*ARGS, *extra], "testbed16", nproc=nproc, tensors=tensors, out_dir=out,
                    timeout_s=600, env=dict(env or {}))  # fmt: skip
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


def sent_bytes(out: Path, src: str, dst: str, kinds: tuple[str, ...]) -> int:
    """Bytes of the network flows from `src` to `dst` of the given collective kinds (flows.csv)."""
    with open(out / "flows.csv") as f:
        return sum(
            int(r["size_bytes"])
            for r in csv.DictReader(f)
            if r["src"] == src and r["dst"] == dst and r["tag"].split("#")[0] in kinds
        )


@pytest.mark.slow  # ~45 s (4 real-tensor ranks); DTensor TP on a cuda mesh against gloo runs by default (test_simcuda)
def test_torchtitan_tensor_parallel_with_fsdp(real: Any, workdir: Path, tmp_path: Path) -> None:
    """TP 2 x FSDP 2 on 4 GPUs: the same global batch as the 2-GPU FSDP run, so the same losses (the
    initial weights differ a little: the sharded parameters draw their random values per shard)."""
    # NCCL's Simple protocol puts the payload on the wire as it is (NCCL's own choice at these sizes, LL, moves
    # 8-byte lines of which half are flags: twice the bytes), so the flows carry the bytes counted below
    report = run(workdir, tmp_path, nproc=4, extra=("--parallelism.tensor_parallel_degree", "2"),
                 env={"NCCL_PROTO": "Simple"})  # fmt: skip
    want = [x[1] for x in titan_lines(real.logs["rank 0"])]
    assert [x[1] for x in titan_lines(report.logs["rank 0"])] == pytest.approx(want, abs=0.01)
    # Sequence parallelism (torchtitan's default): activations are sharded along the sequence between the
    # blocks, all-gathered before each attention and feed-forward and before the output layer, and
    # reduce-scattered after attention's wo, the feed-forward's w2 and the embedding; backward swaps the
    # two. Selective AC recomputes the two all-gathers of each block in backward (it saves the
    # reduce-scatters' outputs). On 2 GPUs a ring moves half the full activation per collective.
    act = BATCH * SEQ * DIM * FP32
    gathers = (2 * LAYERS + 1) + 2 * LAYERS + (2 * LAYERS + 1)  # forward, recomputed, reduce-scatters' backward
    scatters = (2 * LAYERS + 1) + (2 * LAYERS + 1)  # forward, all-gathers' backward
    # ranks 0 and 1 are one TP group (torchtitan puts TP innermost); FSDP pairs them with ranks 2 and 3
    assert sent_bytes(tmp_path, "gpu0", "gpu1", ("all_gather",)) == STEPS * gathers * act // 2
    assert sent_bytes(tmp_path, "gpu0", "gpu1", ("reduce_scatter",)) == STEPS * scatters * act // 2
    # tokens/s per GPU: each TP pair shares one local batch
    tps = titan_lines(report.logs["rank 0"])[-1][3]
    assert tps == pytest.approx(BATCH * SEQ / 2 / (report.summary["steps"][-1]["time_ns"] / 1e9), rel=0.03)


@pytest.mark.parametrize(
    ("schedule", "stages_per_rank"),
    # ~30 s each: under -m slow for the suite's 15-minute budget (Megatron-Core's 1F1B test runs by default)
    [pytest.param("1F1B", 1, marks=pytest.mark.slow), pytest.param("Interleaved1F1B", 2, marks=pytest.mark.slow)],
)
def test_torchtitan_pipeline(workdir: Path, tmp_path: Path, schedule: str, stages_per_rank: int) -> None:
    micro = BATCH  # micro-batches of one sequence (torchtitan's default micro-batch size)
    extra = ("--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", schedule)
    report = run(workdir, tmp_path, extra=extra)
    assert all(x[1] == -1.0 for x in titan_lines(report.logs["rank 0"]))  # torchtitan: no loss off the last stage
    losses = [x[1] for x in titan_lines(report.logs["rank 1"])]
    assert len(losses) == STEPS and abs(losses[0] - math.log(2048)) < 1.0 and losses[-1] < losses[0] - 0.3
    # every stage boundary carries each micro-batch's activation forward and its gradient back; with two
    # ranks and 2 * stages_per_rank stages, each rank sends across 2 * stages_per_rank - 1 boundaries' worth
    act = SEQ * DIM * FP32
    boundaries = 2 * stages_per_rank - 1
    for r in report.summary["ranks"]:
        sent = r["comm"]["send"]["bytes"]
        assert STEPS * micro * boundaries * act <= sent <= STEPS * micro * boundaries * act + 1024  # + shape probes
        assert r["comm"]["recv"]["bytes"] == pytest.approx(sent, abs=1024)
    # the schedule overlaps the stages: a step is shorter than their compute run back to back (the mean
    # over all steps, the first one's start-up included), and longer than rank 0's own compute in it
    steady = report.summary["step_time_ns"]["mean"]
    busy = [r["compute_busy_ns"] / STEPS for r in report.summary["ranks"]]
    assert report.summary["steps"][-1]["compute_ns"] < steady < sum(busy)
