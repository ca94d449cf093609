"""TP's `loss_parallel` on the simulated GPU: a vocabulary-sharded cross entropy runs unchanged.

Inside DTensor's loss handler (below autograd) torch calls `Tensor.to(other)` on the local tensors; the op reaches the
simulated GPU as the composite `aten.to.device`, which it runs as a CUDA tensor does, through its parts
(simcuda/composite.py). Before, it reached torch's own CUDA backend and the run stopped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "cuda_loss_parallel.py"


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_loss_parallel_cross_entropy_runs_with_its_all_reduces(tmp_path: Path, tensors: str) -> None:
    seen_file, run = tmp_path / "seen.json", tmp_path / "run"
    launch(RunConfig(str(SCRIPT), [str(seen_file), tensors], "testbed16", nproc=2, tensors=tensors, out_dir=run))
    seen = json.loads(seen_file.read_text())
    assert seen["placement"] == "S(1)" and seen["loss_type"] == "DTensor"
    if tensors == "real":  # the closed form: mean over the 6 kept rows of logsumexp(z) - z[target]
        assert seen["loss"] == pytest.approx(seen["closed_form"], rel=1e-6)
        assert seen["grad_diff"] < 1e-6
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    comms = [e["name"].split("#")[0] for e in events if e.get("cat") == "comm" and e["pid"] == 0]
    assert comms == ["scatter"] + ["all_reduce"] * 3  # the weight's distribution (parallelize_module), then the loss's
    comms = [e for e in events if e.get("cat") == "comm" and e["pid"] == 0 and e["name"].startswith("all_reduce")]
    # torch's handlers: the rows' max and their sum of exponentials (log_softmax), then the target's logit (nll_loss),
    # each an all-reduce over the TP group of one fp32 per row (8 rows); the backward is local
    assert [e["args"]["bytes"] for e in comms] == [32] * 3
    assert all(e["args"]["group"] == [0, 1] for e in comms)
    assert [e["args"].get("redop") for e in comms] == ["max", None, None]
