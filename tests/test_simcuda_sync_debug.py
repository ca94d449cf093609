"""`torch.cuda.set_sync_debug_mode` on the simulated GPU (`simcuda/api.py`): the level a program sets is read back
as torch's numbers (default 0, warn 1, error 2), torch's own check refuses a wrong name, and the rank says once that
synchronising calls are not reported. Before, the call ended the program with `AttributeError: module 'torch._C' has
no attribute '_cuda_set_sync_debug_mode'` (the CPU build has no CUDA)."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_sync_debug.py"


def test_the_sync_debug_level_is_kept_and_named_once(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    report = launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, tensors="real", trace="none",
                              out_dir=tmp_path / "run"))  # fmt: skip
    seen = json.loads(out.read_text())
    assert (seen["warn"], seen["error"], seen["default"]) == (1, 2, 0)
    assert "expected one of `default`, `warn`, `error`" in seen["refused"]
    assert seen["sum"] == 4.0
    assert report.logs["rank 0"].count("set_sync_debug_mode is kept but not acted on") == 1
