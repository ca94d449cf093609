"""On the simulated GPU a program takes torch's CUDA paths, with the kernels a GPU runs.

Dropout on a CUDA tensor is one fused kernel (`native_dropout`, and its backward), not the
bernoulli_/div_/mul of the host path; `torch._masked_softmax` (the fused mask-and-softmax kernel,
as Megatron-LM's fused scale-mask-softmax) runs in phantom mode too and costs what a softmax of the
same tensor costs: one read and one write of it (the broadcast mask stays in cache).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.launcher import RunConfig, launch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "cuda_fused_paths.py"


def compute_events(out: Path) -> list[dict]:
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "compute"]


@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_dropout_and_masked_softmax_take_the_fused_cuda_kernels(tmp_path: Path, tensors: str) -> None:
    seen_file = tmp_path / "seen.json"
    run = tmp_path / "run"
    launch(RunConfig(str(SCRIPT), [str(seen_file), tensors], "testbed16", nproc=1, tensors=tensors, out_dir=run))
    seen = json.loads(seen_file.read_text())
    assert seen["shapes"] == [[2, 4, 64, 64]] * 3
    if tensors == "real":
        assert seen["max_diff"] < 1e-6  # the fused kernel's values are softmax(masked_fill)
    names = [e["name"] for e in compute_events(run)]
    for op in ("aten.native_dropout", "aten.native_dropout_backward", "aten._masked_softmax",
               "aten._masked_softmax_backward"):  # fmt: skip
        assert names.count(op) == 1, op
    assert "aten.bernoulli_" not in names  # not the host path's three kernels
    dur = {e["name"]: e["dur"] for e in compute_events(run)}
    # The same bytes as a plain softmax of the tensor; masked_fill then softmax is two more passes.
    assert dur["aten._masked_softmax"] == pytest.approx(dur["aten._softmax"], rel=1e-9)
    assert dur["aten.masked_fill"] + dur["aten._softmax"] > 1.5 * dur["aten._masked_softmax"]


@pytest.mark.parametrize(
    ("tensors", "dtype", "kernel"),
    [
        ("real", "float32", "aten._scaled_dot_product_efficient_attention"),
        ("phantom", "float32", "aten._scaled_dot_product_efficient_attention"),
        pytest.param("real", "bfloat16", "aten._scaled_dot_product_flash_attention_for_cpu", marks=pytest.mark.slow),
    ],
)
def test_attention_on_dtensors_runs_the_fused_kernel_per_shard(
    tmp_path: Path, tensors: str, dtype: str, kernel: str
) -> None:
    """A GPU runs `F.scaled_dot_product_attention` on head-sharded DTensors as DTensor's rule for the chosen fused op
    says: one kernel per rank on its heads (forward and backward), the values of unsharded attention. The kernel is
    torch's CUDA choice (sdp_choice.py): fp32 cannot run flash (fp16/bf16 only), so memory-efficient attention;
    bf16 on the sm80+ GPU of testbed16 runs flash."""
    seen_file = tmp_path / "seen.json"
    run = tmp_path / "run"
    script = ROOT / "tests" / "scripts" / "cuda_dtensor_attention.py"
    argv = [str(seen_file), tensors, dtype]
    launch(RunConfig(str(script), argv, "testbed16", nproc=2, tensors=tensors, out_dir=run))
    seen = json.loads(seen_file.read_text())
    assert seen["placement"] == "S(1)" and seen["shape"] == [2, 4, 32, 16]
    if tensors == "real":
        tol = 1e-5 if dtype == "float32" else 2e-2  # bf16: 8 mantissa bits
        assert seen["out_diff"] < tol and seen["grad_diff"] < tol and seen["math_diff"] < tol
    names = [e["name"] for e in compute_events(run) if e["pid"] == 0]  # rank 0's kernels
    # the sharded call and the whole one, each a forward and a backward fused kernel; no unfused math path
    assert names.count(kernel) == 2
    assert names.count(f"{kernel}_backward") == 2
    fused = {"aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_flash_attention_for_cpu"}
    other = fused - {kernel}
    assert not other & set(names) and "aten._softmax" not in names
