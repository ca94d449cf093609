"""Megatron-Core, unmodified, on the simulated CUDA device: TP x DP with its distributed optimizer, and PP
with its 1F1B schedule (examples/mcore_gpt.py).

Megatron-Core cannot run on gloo (it calls CUDA for its RNG tracker and attention), so the checks are
closed forms: tensor parallelism is exact, so TP 2 trains as TP 1 does; the tensor-parallel all-reduces
are those of Megatron's algorithm (Shoeybi et al., 2019); the distributed optimizer reduce-scatters each
gradient byte once a step; the pipeline sends one activation forward and one gradient back per
microbatch; the loss starts at ln(vocab) and falls.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from phantora.launcher import RunConfig, launch
from tests.installed import needs

pytestmark = needs("megatron.core")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "mcore_gpt.py"
STEPS, SEQ, MB, HIDDEN, LAYERS, VOCAB = 4, 64, 2, 128, 2, 512  # the example's defaults
FP32 = 4


def run(out: Path, nproc: int, *args: str) -> Any:
    return launch(RunConfig(str(SCRIPT), list(args), "testbed16", nproc=nproc, out_dir=out, timeout_s=600))


def losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)$", log, flags=re.M)]


def parameters(log: str) -> int:
    m = re.search(r"^parameters (\d+)$", log, flags=re.M)
    assert m, log[-2000:]
    return int(m[1])


@pytest.fixture(scope="module")
def tp1(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return run(tmp_path_factory.mktemp("tp1"), 2, "--tp", "1")


def test_megatron_tp_dp_trains_as_tp1(tp1: Any, tmp_path: Path) -> None:
    microbatches = 2
    report = run(tmp_path, 4, "--tp", "2", "--dist-opt", "--microbatches", str(microbatches))
    want = losses(tp1.logs["rank 0"])
    assert len(want) == STEPS and abs(want[0] - math.log(VOCAB)) < 0.15 and want[-1] < want[0] - 0.3
    # TP splits each matmul over two GPUs: the same sums, in another order
    assert losses(report.logs["rank 0"]) == pytest.approx(want, rel=1e-3)

    comm = report.summary["ranks"][0]["comm"]
    act = MB * SEQ * HIDDEN * FP32  # one micro-batch's activations
    per_microbatch = 2 * 2 * LAYERS * act + 2 * act + 3 * MB * SEQ * FP32
    # 2 forward (attention, MLP outputs) + 2 backward (their inputs' gradients) per layer; the vocabulary-
    # parallel embedding forward and the output layer's input gradient; cross-entropy's max, target logit
    # and sum of exponentials (one float per token each). Plus one grad-norm float per step.
    assert comm["all_reduce"]["bytes"] == STEPS * (microbatches * per_microbatch + FP32)
    # the distributed optimizer: gradients reduce-scattered, parameters all-gathered, once a step each
    shard = parameters(report.logs["rank 0"]) * FP32  # this TP rank's parameters (its buffer pads a little)
    assert STEPS * shard <= comm["reduce_scatter"]["bytes"] <= 1.01 * STEPS * shard
    assert STEPS * shard <= comm["all_gather"]["bytes"] <= 1.01 * STEPS * shard + 1024


def test_megatron_pipeline_1f1b_trains(tmp_path: Path) -> None:
    microbatches = 4
    report = run(tmp_path, 4, "--tp", "1", "--pp", "2", "--microbatches", str(microbatches))
    last = losses(report.logs["rank 2"])  # ranks 2, 3: the last stage (Megatron orders tp, dp, then pp)
    assert losses(report.logs["rank 0"]) == []  # the first stage has no loss
    assert len(last) == STEPS and abs(last[0] - math.log(VOCAB)) < 0.15 and last[-1] < last[0] - 0.3
    for r in report.summary["ranks"]:
        # each micro-batch: its activations forward to the next stage, their gradient back
        assert r["comm"]["send"]["bytes"] == STEPS * microbatches * MB * SEQ * HIDDEN * FP32
        assert r["comm"]["recv"]["bytes"] == r["comm"]["send"]["bytes"]
    # 1F1B keeps the pipeline busy: a step takes less than the two stages' compute run back to back
    steady = report.summary["step_time_ns"]["mean"]
    busy = [r["compute_busy_ns"] / STEPS for r in report.summary["ranks"][:3:2]]
    assert max(busy) < steady < sum(busy)


@pytest.mark.slow
def test_megatron_pipeline_4_stages_phantom(tmp_path: Path) -> None:
    """--pp 4 with phantom tensors: Megatron's grad norm (`torch.tensor` of per-parameter norms, as it runs
    without apex) reads each phantom scalar as `.item()` does, and the run ends; the pipeline's bytes as above."""
    steps, microbatches = 2, 2
    report = launch(RunConfig(str(SCRIPT), ["--tp", "1", "--pp", "4", "--steps", str(steps)], "testbed16", nproc=4,
                              out_dir=tmp_path, timeout_s=600, tensors="phantom"))  # fmt: skip
    assert (
        re.findall(r"^step \d+ loss (.*)$", report.logs["rank 3"], flags=re.M)
        == ["n/a (phantom tensors hold no values)"] * steps
    )
    act = steps * microbatches * MB * SEQ * HIDDEN * FP32  # one direction's activations (or their gradients)
    sent = [r["comm"]["send"]["bytes"] for r in report.summary["ranks"]]
    assert sent == [act, 2 * act, 2 * act, act]  # the end stages send one way, the middle ones both
