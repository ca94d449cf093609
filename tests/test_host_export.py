"""`torch.export` in a rank before its program selects a GPU (torch's pipeline tracer, `pipeline()`, as torch's
pipelining tutorial runs it): the rank's charging and memory hooks stay out of export's tracing, so the exported
graph is plain torch's. Before, the saved-tensor hook counted export's fake tensors of symbolic sizes as
activations and export failed ("sources must not be empty for symbol ..."), which pipelining reports as "we cannot
capture your model as a full graph"."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from phantora.launcher import RunConfig, launch

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_export_and_the_pipeline_tracer_run_as_on_plain_torch(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(SCRIPTS))
    try:
        import host_export
    finally:
        sys.path.remove(str(SCRIPTS))
    torch.manual_seed(0)
    want = host_export.exported_ops(host_export.Decoder(), host_export.example_tokens())  # plain torch
    seen = tmp_path / "seen"
    seen.mkdir()
    launch(RunConfig(str(SCRIPTS / "host_export.py"), [str(seen)], "testbed16", nproc=1, tensors="real",
                     trace="none", out_dir=tmp_path / "run"))  # fmt: skip
    got = json.loads((seen / "rank0.json").read_text())
    assert got["stages"] == 2
    assert got["ops"] == want and len(want) > 50
