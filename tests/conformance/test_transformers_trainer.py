"""transformers' own distributed Trainer script, `tests/trainer/distributed/scripts/train.py` (what transformers'
DDP, FSDP and DeepSpeed Trainer tests launch), unchanged, under `phantora run --topology testbed16 --nproc 2`.

The script trains a causal LM with `Trainer` on synthetic data (32 samples of four sentences, padded to 128
tokens; 4 per GPU on 2 GPUs: 4 optimizer steps an epoch). Its default model is a hub checkpoint
(`trl-internal-testing/tiny-Qwen2ForCausalLM-2.5`); this machine has no hub, so `--model_name` names a local
tiny Qwen2 of the same architecture (`hf_assets.make_tiny_qwen2`). The script's own `--loss_output_file`
writes the losses Trainer logged at each step.

Cases: DDP (what `Trainer` does on several GPUs with no other flag), FSDP2 through `--fsdp`, DeepSpeed ZeRO-3 and
ZeRO-2 with the script's own configs, and Trainer's checkpoints under `phantora run --storage` (the storage model).
Every run is about a minute of wall time or more, so all are slow; the vendored files' check is quick.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from conformance import PROGRAMS, Run, assert_documented, git_blob_id, provenance_blobs, run_program, workdir_for
from hf_assets import make_tiny_qwen2

from tests.installed import needs

pytestmark = needs("transformers")
UPSTREAM = "transformers"
FOLDER = "tests/trainer/distributed/scripts"
PROGRAM_DOC = f"{FOLDER}/train.py"  # its rows in docs/runtime.md
ARGS = ["--per_device_train_batch_size", "4", "--num_train_epochs", "1", "--logging_steps", "1"]
ARGS += ["--report_to", "none", "--output_dir", "./trained", "--loss_output_file", "losses.json"]
FSDP2 = ["--fsdp", "full_shard auto_wrap", "--fsdp_config"]
FSDP2 += ['{"version": 2, "transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}']
PLAIN_GLOO_LOSSES = [5.943321, 5.863466, 5.890379, 5.859511]
RUNTIME = re.compile(r"'train_runtime': '([0-9.e-]+)'")


def test_vendored_programs_are_the_upstream_files() -> None:
    blobs = provenance_blobs("huggingface/transformers")
    root = PROGRAMS / UPSTREAM
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert present == set(blobs) and "LICENSE" in blobs
    for path, blob in blobs.items():
        assert git_blob_id(root / path) == blob, path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The local tiny Qwen2 and its vocabulary size."""
    out = make_tiny_qwen2(tmp_path_factory.mktemp("hf") / "tiny-qwen2")
    return out, int(json.loads((out / "config.json").read_text())["vocab_size"])


def train(tmp: Path, model: Path, extra: list[str]) -> tuple[Run, list[float]]:
    work = workdir_for(UPSTREAM, FOLDER, tmp)
    run = run_program(work, "train.py", ["--model_name", str(model), *ARGS, *extra], tmp / "out", 2)
    assert run.returncode == 0, run.output[-3000:]
    return run, json.loads((work / "losses.json").read_text())


def collectives(run: Run) -> dict[str, Any]:
    return dict(run.results()["nccl"]["choices"])


def checks(run: Run, losses: list[float], vocab: int) -> None:
    """4 optimizer steps, each a phantora step, a loss logged at each; the first is about ln(vocabulary) (a
    randomly initialised LM); Trainer's own train_runtime is simulated time, at least its last three steps and
    at most the simulated run."""
    steps = run.steps()
    assert len(steps) == 4 and len(losses) == 4 and run.step_ms() > 0
    assert losses[0] == pytest.approx(math.log(vocab), rel=0.03)
    found = RUNTIME.search(run.log(0))
    assert found is not None, run.log(0)[-3000:]
    runtime_ns = float(found[1]) * 1e9
    assert sum(s["time_ns"] for s in steps[1:]) <= runtime_ns <= run.results()["end_ns"] * 1.001


@pytest.fixture(scope="module")
def ddp(model: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, list[float]]:
    return train(tmp_path_factory.mktemp("ddp"), model[0], [])


@pytest.mark.slow
def test_trainer_ddp(ddp: tuple[Run, list[float]], model: tuple[Path, int]) -> None:
    """DDP: gradients are all-reduced, nothing is reduce-scattered."""
    run, losses = ddp
    checks(run, losses, model[1])
    assert "all_reduce" in collectives(run) and "reduce_scatter" not in collectives(run)
    # plain torch on gloo, the same script on 2 CPU processes (`torchrun --nproc_per_node 2 train.py ... --use_cpu`,
    # docs/runtime.md): the same values in every run. Before the simulated device's torch.tensor heeded
    # `with torch.device("meta")`, the rotary embedding's buffers were left uninitialised and the losses varied
    assert losses == pytest.approx(PLAIN_GLOO_LOSSES, rel=1e-6)
    assert_documented(run.step_ms(), PROGRAM_DOC, "no parallelism flag")


@pytest.mark.slow
def test_trainer_fsdp2_trains_as_ddp(ddp: tuple[Run, list[float]], model: tuple[Path, int], tmp_path: Path) -> None:
    """FSDP2 through `--fsdp` (Accelerate's fully_shard of each decoder layer): the same model, data and optimizer
    as DDP, so the same losses to float rounding; parameters all-gathered, gradients reduce-scattered."""
    run, losses = train(tmp_path, model[0], FSDP2)
    checks(run, losses, model[1])
    assert losses == pytest.approx(ddp[1], rel=1e-3)
    assert {"all_gather", "reduce_scatter"} <= set(collectives(run))
    assert "fsdp.all_gather_copy_in" in run.kernels(0)  # FSDP2's copy-in before each all-gather
    assert_documented(run.step_ms(), PROGRAM_DOC, '`--fsdp "full_shard auto_wrap"')


@pytest.mark.slow
def test_trainer_deepspeed_zero3(ddp: tuple[Run, list[float]], model: tuple[Path, int], tmp_path: Path) -> None:
    """DeepSpeed ZeRO-3 with the script's own config (its WarmupLR starts at learning rate 0, so only the first
    loss, before any update, is DDP's): parameters all-gathered, gradients reduce-scattered."""
    run, losses = train(tmp_path, model[0], ["--deepspeed", "ds_config_zero3.json"])
    checks(run, losses, model[1])
    assert losses[0] == pytest.approx(ddp[1][0], rel=1e-3)
    assert {"all_gather", "reduce_scatter"} <= set(collectives(run))
    assert_documented(run.step_ms(), PROGRAM_DOC, "`--deepspeed ds_config_zero3.json`")


@pytest.mark.slow
def test_trainer_deepspeed_zero2(ddp: tuple[Run, list[float]], model: tuple[Path, int], tmp_path: Path) -> None:
    """DeepSpeed ZeRO-2 with the script's own config: the same first loss as DDP, and on top of DDP's memory the
    gradient bucket ZeRO-2 allocates on the GPU, `reduce_bucket_size` elements (DeepSpeed's default 5e8) of fp32."""
    run, losses = train(tmp_path, model[0], ["--deepspeed", "ds_config_zero2.json"])
    checks(run, losses, model[1])
    assert losses[0] == pytest.approx(ddp[1][0], rel=1e-3)
    bucket = 500_000_000 * 4
    peak, ddp_peak = (r.results()["memory"]["per_rank_peak_bytes"][0] for r in (run, ddp[0]))
    assert bucket < peak < bucket + ddp_peak
    assert_documented(run.step_ms(), PROGRAM_DOC, "`--deepspeed ds_config_zero2.json`")


RANK0_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "training_args.bin")


@pytest.mark.slow
def test_trainer_checkpoint_costs_its_bytes_over_the_storage_bandwidth(model: tuple[Path, int], tmp_path: Path) -> None:
    """`--save_steps 2` under `phantora run --storage 2`: Trainer saves checkpoint-2 right after its second
    optimizer step, so in the third step line (a phantora step ends at an optimizer step), and checkpoint-4 after
    the last. Rank 0 writes the model (safetensors), optimizer, scheduler, its RNG state and the arguments; rank 1
    its RNG state. The host's link is 2 GB/s (2 B a ns), shared with rank 1 only while its small file is in flight:
    rank 0's files take no less than their bytes / 2 (the link alone) and no more than both ranks' bytes / 2 (plus a
    ns of rounding a file); the old fixed half-link share, rank 0's bytes / 1, is more than that."""
    work = workdir_for(UPSTREAM, FOLDER, tmp_path)
    args = ["--model_name", str(model[0]), *ARGS, "--save_strategy", "steps", "--save_steps", "2"]
    run = run_program(work, "train.py", args, tmp_path / "out", 2, options=("--storage", "2"))
    assert run.returncode == 0, run.output[-3000:]
    ckpt = work / "trained" / "checkpoint-2"
    rank0 = sum((ckpt / f).stat().st_size for f in RANK0_FILES)
    rank1 = (ckpt / "rng_state_1.pth").stat().st_size
    lines = [json.loads(line) for line in (run.out / "steps.jsonl").read_text().splitlines()]
    stall = lines[2].get("storage_ns", 0)
    files = len(RANK0_FILES)
    assert rank0 / 2 <= stall <= (rank0 + rank1) / 2 + files
    assert [x.get("storage_ns", 0) for i, x in enumerate(lines) if i != 2] == [0, 0, 0]
    assert [x.get("storage_bytes", 0) for x in lines] == [0, 0, rank0 + rank1, 0]
    assert lines[2]["time_ns"] >= lines[3]["time_ns"] + stall  # the step with the save stalls for it
    totals = run.results()["storage"]["write"]
    assert totals["bytes"] == 2 * (rank0 + rank1)  # checkpoint-2 and checkpoint-4
    assert rank0 <= totals["max_rank_ns"] <= rank0 + rank1 + 2 * files
    assert "checkpoint I/O" in run.output
