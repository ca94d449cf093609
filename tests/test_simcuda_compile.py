"""torch.compile on the simulated GPU runs the program eagerly, fullgraph=True included (simcuda/device.py)."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_compile_fullgraph.py"


def test_a_fullgraph_compile_runs_eagerly(tmp_path: Path) -> None:
    """torch refuses a fullgraph function in which it compiled nothing; nothing is compiled here, so the
    demand is dropped and the function runs: 2 x (0 + 1 + 2 + 3) on cuda:0."""
    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, timeout_s=120))
    assert json.loads(out.read_text()) == {"value": 12.0, "device": "cuda:0"}
