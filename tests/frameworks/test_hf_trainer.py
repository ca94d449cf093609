"""HF Transformers `Trainer` (through Accelerate), unmodified, on the simulated CUDA device: DDP and FSDP2.

examples/hf_trainer.py is an ordinary HF script. Under torchrun with `--use_cpu` it trains on gloo; under
`phantora run` it sees CUDA and NCCL. Checks against closed forms: the losses are gloo's, digit for digit;
DDP all-reduces each gradient byte once a step; FSDP2 reduce-scatters each gradient byte once a step and
holds half the parameters on each of two ranks; the Trainer's own throughput figures are simulated time.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from phantora.launcher import RunConfig, launch
from tests.installed import needs

pytestmark = needs("transformers", "accelerate")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"
STEPS, BATCH, WORLD, SAMPLES = 4, 4, 2, 256  # SAMPLES: the example's corpus
ARGS = [
    "--per_device_train_batch_size", str(BATCH), "--max_steps", str(STEPS), "--logging_steps", "1",
    "--report_to", "none", "--seed", "42", "--learning_rate", "1e-3", "--disable_tqdm", "true",
    "--save_strategy", "steps", "--save_steps", str(STEPS),  # a checkpoint at the end
]  # fmt: skip
FSDP = [
    "--save_strategy", "no",
    "--fsdp", "full_shard auto_wrap",
    "--fsdp_config", '{"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "version": 2}',
]  # fmt: skip


def logged(log: str) -> list[dict[str, str]]:
    """The Trainer's log dicts, as it prints them."""
    return [ast.literal_eval(m) for m in re.findall(r"^\{'.*\}$", log, flags=re.M)]


def losses(log: str) -> list[str]:
    return [d["loss"] for d in logged(log) if "loss" in d]


def epochs(log: str) -> list[float]:
    return [float(d["epoch"]) for d in logged(log) if "loss" in d]


def param_bytes() -> int:
    """fp32 bytes of the example's model, counted here from its config."""
    spec = importlib.util.spec_from_file_location("hf_trainer", SCRIPT)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(example.model_config())
    return 4 * sum(p.numel() for p in model.parameters())


def run(out: Path, extra: list[str]) -> Any:
    args = ["--output_dir", str(out / "hf"), *ARGS, *extra]
    return launch(RunConfig(str(SCRIPT), args, "testbed16", nproc=WORLD, out_dir=out, timeout_s=600))


def checkpoint(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "hf" / f"checkpoint-{STEPS}" / "model.safetensors")


@pytest.fixture(scope="module")
def gloo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gloo")


@pytest.fixture(scope="module")
def gloo_losses(gloo_out: Path) -> list[str]:
    out = gloo_out
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    cmd += [str(SCRIPT), "--output_dir", str(out / "hf"), *ARGS, "--use_cpu"]
    for _attempt in range(2):  # the reference run, plain torchrun + gloo (not phantora)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out)
        teardown_abort = "train_runtime" in proc.stdout + proc.stderr and "SIGABRT" in proc.stdout + proc.stderr
        if proc.returncode == 0 or not teardown_abort:
            break  # once in a while gloo's threads abort at interpreter exit after training finished: run it again
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert epochs(log)[-1] == STEPS * BATCH * WORLD / SAMPLES  # data-parallel over both ranks, not one
    return losses(log)


def check_simulated_throughput(report: Any) -> None:
    """The Trainer times its loop with time.time(): simulated time, so its steps/s are the simulated steps'."""
    final = next(d for d in logged(report.logs["rank 0"]) if "train_steps_per_second" in d)
    sim_s = sum(s["time_ns"] for s in report.summary["steps"]) / 1e9
    assert len(report.summary["steps"]) == STEPS
    assert float(final["train_steps_per_second"]) == pytest.approx(STEPS / sim_s, rel=0.05)


def test_hf_trainer_ddp_trains_as_on_gloo(gloo_losses: list[str], gloo_out: Path, tmp_path: Path) -> None:
    report = run(tmp_path, [])
    # its checkpoint holds the weights gloo trained, up to the gradients' summation order (Adam with lr 1e-3
    # moves each weight by about 1e-3 a step, 40 times the tolerance)
    want, got = checkpoint(gloo_out), checkpoint(tmp_path)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=1e-4, msg=name)
    assert losses(report.logs["rank 0"]) == gloo_losses
    assert epochs(report.logs["rank 0"])[-1] == STEPS * BATCH * WORLD / SAMPLES
    assert float(gloo_losses[-1]) < float(gloo_losses[0]) - 0.2  # it learns
    check_simulated_throughput(report)
    reduced = report.summary["ranks"][0]["comm"]["all_reduce"]["bytes"]
    assert 0 <= reduced - STEPS * param_bytes() < 1024  # every gradient once a step, plus the logged loss


def test_hf_trainer_fsdp2_trains_as_on_gloo(gloo_losses: list[str], tmp_path: Path) -> None:
    report = run(tmp_path, FSDP)
    assert losses(report.logs["rank 0"]) == gloo_losses  # FSDP changes where the maths runs, not the maths
    check_simulated_throughput(report)
    comm = report.summary["ranks"][0]["comm"]
    full = param_bytes()
    assert comm["reduce_scatter"]["bytes"] == STEPS * full  # each gradient byte reduce-scattered once a step
    assert STEPS * full <= comm["all_gather"]["bytes"] <= 2 * STEPS * full  # forward, and backward's re-gather
    held = report.summary["memory"]["breakdown_at_peak"]["parameters"]
    assert held == pytest.approx(full / WORLD, rel=0.01)  # each rank holds its shard
