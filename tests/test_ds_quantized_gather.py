"""ZeRO++'s quantized weight gather on the simulated GPU (tests/scripts/ds_quantized_gather.py): the dequantize of
the all-gathered int8 values must read them after the gather, as a GPU's stream order makes it. It read the empty
buffer first (the simulated extension's ops ran as one kernel's parts, which skipped the wait for the collective
still writing their input), so ZeRO++'s losses changed from run to run."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ds_quantized_gather.py"


def test_dequantize_reads_the_gathered_values(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=2, timeout_s=300))
    seen = json.loads(out.read_text())
    assert seen["dtype"] == "torch.float16"
    assert seen["max_diff"] == 0.0  # exact: q (k + 1) / 128 is an fp16 number, and so is each rank's max
