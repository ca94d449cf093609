"""`aten.scaled_dot_product_attention` called as an op runs the kernel a GPU runs (simcuda/sdpa_op.py).

An exported graph (torch's pipeline tracer) calls the op itself; on the simulated GPU it ran torch's unfused math
path (batched matmuls and a softmax) where `F.scaled_dot_product_attention` ran the memory-efficient kernel, which
is what a CUDA build picks for fp32 on an H100 (sdp_choice.py). Now both calls are one kernel each way with the same
values, and a program that asks for the math path (`sdpa_kernel(MATH)`) still gets it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_sdpa_op.py"
EFFICIENT = "aten._scaled_dot_product_efficient_attention"


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_the_aten_op_runs_the_fused_kernel_as_the_function_does(tmp_path: Path, tensors: str) -> None:
    seen_file, run = tmp_path / "seen.json", tmp_path / "run"
    launch(RunConfig(str(SCRIPT), [str(seen_file), tensors], "testbed16", nproc=1, tensors=tensors, out_dir=run))
    seen = json.loads(seen_file.read_text())
    assert seen["math_shape"] == [2, 4, 64, 64]
    if tensors == "real":
        assert seen["out_diff"] < 1e-5 and seen["grad_diff"] < 1e-4 and seen["math_diff"] < 1e-5
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "compute"]
    assert names.count(EFFICIENT) == 2 and names.count(EFFICIENT + "_backward") == 2  # the function's and the op's
    assert names.count("aten._safe_softmax") == 1  # the math path once: the call under sdpa_kernel(MATH)
    assert names.count("aten.bmm") == 2  # its two matmuls (no backward)
