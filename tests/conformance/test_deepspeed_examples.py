"""DeepSpeedExamples' `training/bf16_master_weight/train.py`, unchanged, with its own ZeRO-3 configs (and its
baseline config at stages 1 and 2), under `phantora run --topology testbed16 --nproc 2`: a transformer trained on
random tokens, DeepSpeed's FusedAdam (its CUDA extension `fused_adam`, run by the simulated GPU as torch ops:
simcuda/extensions.py).

The model is the example's with its own flags made small (hidden 128, 2 layers, 4 heads, vocabulary 1000,
sequence 64, 4 steps); the batch is the configs' 4 per GPU.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from conformance import PROGRAMS, Run, assert_documented, git_blob_id, provenance_blobs, run_program, workdir_for

from tests.installed import needs

pytestmark = needs("deepspeed")
UPSTREAM = "deepspeed-examples"
FOLDER = "training/bf16_master_weight"
PROGRAM_DOC = f"{FOLDER}/train.py"  # its rows in docs/runtime.md
VOCAB, PARAMS = 1000, 661_736  # the example prints its parameter count
ARGS = ["--hidden_dim", "128", "--num_layers", "2", "--num_heads", "4", "--vocab_size", str(VOCAB)]
ARGS += ["--seq_length", "64", "--num_steps", "4", "--warmup_steps", "1", "--log_interval", "1"]
EXTENSION = "phantora: the CUDA extension 'fused_adam' (torch.utils.cpp_extension.load) is not compiled"
SUMMARY = re.compile(r"SUMMARY: config=\S+ params=(\d+) peak_mem_bytes=(\d+) alloc_mem_bytes=(\d+)")


def test_vendored_programs_are_the_upstream_files() -> None:
    blobs = provenance_blobs("deepspeedai/DeepSpeedExamples")
    root = PROGRAMS / UPSTREAM
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert present == set(blobs) and "LICENSE" in blobs
    for path, blob in blobs.items():
        assert git_blob_id(root / path) == blob, path


def train(tmp: Path, config: str) -> Run:
    work = workdir_for(UPSTREAM, FOLDER, tmp)
    return run_program(work, "train.py", ["--deepspeed_config", f"configs/{config}", *ARGS], tmp / "out", 2)


def summary(run: Run) -> tuple[int, int, int]:
    """The example's own last line: parameters, peak and allocated bytes of torch.cuda's memory counters."""
    found = SUMMARY.search(run.log(0))
    assert found is not None, run.log(0)[-3000:]
    return int(found[1]), int(found[2]), int(found[3])


def runs(run: Run) -> None:
    """Exit 0, 4 optimizer steps, the extension said so in one line, the example's own summary, a first loss of
    about ln(vocabulary) (random labels), and its peak-memory reading equal to the simulated device's peak."""
    assert run.returncode == 0, run.output[-3000:]
    assert len(run.steps()) == 4 and run.step_ms() > 0
    assert run.log(0).count(EXTENSION) == 1
    first = float(re.search(r"Step 0: loss=([0-9.]+)", run.log(0))[1])  # type: ignore[index]
    assert first == pytest.approx(math.log(VOCAB), rel=0.03)
    params, peak, _ = summary(run)
    assert params == PARAMS and peak == run.results()["memory"]["per_rank_peak_bytes"][0]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return train(tmp_path_factory.mktemp("ds-baseline"), "baseline.json")


def test_zero3_bf16_with_fused_adam(baseline: Run) -> None:
    """configs/baseline.json: ZeRO-3, bf16, fp32 master weights and AdamW states, DeepSpeed's FusedAdam."""
    runs(baseline)
    assert_documented(baseline.step_ms(), PROGRAM_DOC, "`--deepspeed_config configs/baseline.json`")


@pytest.mark.slow
def test_bf16_master_weights_save_six_bytes_a_parameter(baseline: Run, tmp_path: Path) -> None:
    """configs/bf16_full.json (what the example demonstrates): bf16 master weights and bf16 AdamW states instead
    of fp32 save 2 + 2 x 2 bytes for each parameter of a rank's ZeRO-3 partition (half of them on 2 ranks), in
    the memory the example itself reads after training (DeepSpeed pads partitions: within 1 %)."""
    full = train(tmp_path, "bf16_full.json")
    runs(full)
    saved = summary(baseline)[2] - summary(full)[2]
    assert saved == pytest.approx(6 * PARAMS / 2, rel=0.01)
    assert_documented(full.step_ms(), PROGRAM_DOC, "`--deepspeed_config configs/bf16_full.json`")


def train_stage(tmp: Path, stage: int) -> Run:
    """The example with its baseline config at ZeRO stage `stage` (`configs/zero<stage>.json`: nothing else
    changed; the example ships ZeRO-3 configs only)."""
    work = workdir_for(UPSTREAM, FOLDER, tmp)
    config = json.loads((work / "configs" / "baseline.json").read_text())
    config["zero_optimization"]["stage"] = stage
    (work / "configs" / f"zero{stage}.json").write_text(json.dumps(config))
    return run_program(work, "train.py", ["--deepspeed_config", f"configs/zero{stage}.json", *ARGS], tmp / "out", 2)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_zero1_and_zero2_from_the_baseline_config(tmp_path: Path, stage: int) -> None:
    """ZeRO-1 (optimizer states partitioned) and ZeRO-2 (gradients too) on DeepSpeed's own engine. After training
    a rank holds every bf16 parameter (2 B each) and half of the fp32 master weights and AdamW moments (12 B / 2),
    at most plus a bf16 and an fp32 gradient partition: between 8 and 12 B a parameter, as the example reads it.
    Its peak holds the config's gradient bucket, `reduce_bucket_size` = 5e7 fp32 elements."""
    run = train_stage(tmp_path, stage)
    runs(run)
    _, peak, allocated = summary(run)
    assert 8 * PARAMS <= allocated <= 12 * PARAMS
    assert peak >= 4 * 50_000_000
    assert_documented(run.step_ms(), PROGRAM_DOC, '`configs/baseline.json` with `"stage": 1`')
