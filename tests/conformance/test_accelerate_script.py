"""HF Accelerate's own test program (`accelerate/test_utils/scripts/test_script.py`, what `accelerate test` runs
to check an installation; from the accelerate 1.15.0 wheel of the `frameworks` extra, unchanged), under
`phantora run --topology testbed16 --nproc 2`.

It checks, with synthetic data: process execution and splitting work between processes, that the RNGs agree
across ranks, data-loader sharding (plain, shuffled, central, seedable samplers), and that training a
regression model with DDP through `Accelerator.prepare` gives the single-process model (also in bf16 and fp16
with a GradScaler), then a breakpoint trigger and a re-instantiated state. Each check asserts; the run exits 0
only if all pass, and each section prints its heading on rank 0.
"""

from __future__ import annotations

from pathlib import Path

from conformance import run_program

from tests.installed import needs, package_dir

pytestmark = needs("accelerate")
SCRIPT = str(package_dir("accelerate") / "test_utils" / "scripts" / "test_script.py")
SECTIONS = [
    "**Initialization**",
    "**Test process execution**",
    "**Test split between processes as a tensor**",
    "**Test random number generator synchronization**",
    "All rng are properly synched.",
    "**DataLoader integration test**",
    "Shuffled central dataloader passing.",
    "**Training integration test**",
    "BF16 training check.",
    "FP16 training check.",
    "**Test reinstantiated state**",
]


def test_accelerate_test_script_passes_on_two_simulated_gpus(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    run = run_program(work, SCRIPT, [], tmp_path / "out", 2)
    assert run.returncode == 0, run.output[-3000:]
    log = run.log(0)
    at = [log.find(line) for line in SECTIONS]
    assert all(i >= 0 for i in at) and at == sorted(at), list(zip(SECTIONS, at, strict=True))
    assert "Model dtype: torch.float32, torch.float32. Input dtype: torch.float32" in log
