"""A one-kernel op (simcuda/cuda_only.py `one_kernel`: torch's fused RMSNorm) reading an all-gather's output on a side
stream (tests/scripts/one_kernel_gather.py) must read it after the gather, as a GPU's stream order makes it. Its ops
ran as the session's own, which skipped the wait for the collective still writing their input: it normalised the
empty buffer (zeros), as d312bb91 found for DeepSpeed's quantizer."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "one_kernel_gather.py"


def test_rms_norm_reads_the_gathered_rows(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=2, timeout_s=300))
    assert json.loads(out.read_text())["max_diff"] < 1e-6  # +-(k + 1) / sqrt((k + 1)^2 + eps): 1 - 6e-8 at most
