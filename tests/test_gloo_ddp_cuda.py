"""DDP on the simulated GPU over a plain gloo group (`init_process_group("gloo")` with cuda tensors, torch's DDP
tutorial's set-up). DDP's logger reads a group named "gloo" through its GLOO backend (its thread count), which a
phantora gloo group did not have: DDP stopped at construction with "Could not find backend type 1 for Process Group
with name gloo". The gradients must be the mean of the ranks' own (tests/scripts/gloo_ddp_cuda.py)."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "gloo_ddp_cuda.py"


def test_ddp_on_cuda_tensors_over_gloo_averages_the_gradients(tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=2, timeout_s=300))
    seen = json.loads(out.read_text())
    assert seen["backend"] == "gloo"
    assert seen["max_diff"] < 1e-5
