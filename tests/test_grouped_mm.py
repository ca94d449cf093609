"""`torch._grouped_mm` (an MoE layer's experts in one kernel: torchtitan's MoE models) is a matrix product: its FLOPs
are counted and it is timed as a GEMM, not as a memory-bound elementwise kernel (it was both uncounted and timed by
its bytes: DeepSeek-V3's expert GEMM below in 0.88 ms, under the 3.9 ms its FLOPs take at the H100's peak)."""

from __future__ import annotations

import math

import pytest
import torch

from phantora.errors import InputError
from phantora.perfmodel.features import compute_features, make_call
from phantora.perfmodel.gpus import get_gpu
from phantora.perfmodel.ops import op_class
from phantora.runtime.compute import build_model, op_flops

aten = torch.ops.aten
BF16 = torch.bfloat16


def meta(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_grouped_mm_is_a_gemm() -> None:
    assert op_class("aten::_grouped_mm") == "gemm"


@pytest.mark.parametrize(
    ("a", "b", "offs", "out", "flops"),
    [
        ((64, 32), (4, 32, 48), 4, (64, 48), 2 * 64 * 32 * 48),  # 2-D x 3-D: 64 rows among 4 experts
        ((4, 16, 32), (4, 32, 48), None, (4, 16, 48), 2 * 4 * 16 * 32 * 48),  # 3-D x 3-D: a batched product
        ((32, 64), (64, 48), 4, (4, 32, 48), 2 * 32 * 64 * 48),  # 2-D x 2-D: the weight gradient, k split
        ((4, 16, 32), (32, 96), 4, (16, 96), 2 * 16 * 32 * 96),  # 3-D x 2-D: b's columns split
    ],
)
def test_flops_are_the_groups_products(a: tuple, b: tuple, offs: int | None, out: tuple, flops: int) -> None:
    """2 m n k summed over the groups, whichever of torch's four forms; the output torch's meta function gives."""
    args = (meta(*a), meta(*b)) + ((meta(offs, dtype=torch.int32),) if offs else ())
    res = aten._grouped_mm.default(*args)
    assert tuple(res.shape) == out
    assert op_flops(aten._grouped_mm.default, args, {}, res) == flops
    shapes = [a, b] + ([(offs,)] if offs else [])
    f = compute_features(make_call("aten::_grouped_mm", shapes, ["bfloat16", "bfloat16", "int32"][: len(shapes)]))
    assert f.op_class == "gemm" and f.flops == flops
    assert f.writes == 2 * res.numel()


def test_equal_groups_time_as_the_batched_product() -> None:
    """G equal groups of an MoE forward take the time of the [G, m, k] x [G, k, n] batched product."""
    model = build_model("calibrated", "h100")
    g, m, k, n = 8, 1024, 256, 5760
    b = meta(g, k, n)
    grouped = model.compute(
        aten._grouped_mm.default, (meta(g * m, k), b, meta(g, dtype=torch.int32)), {}, meta(g * m, n)
    )
    bmm = model.compute(aten.bmm.default, (meta(g, m, k), b), {}, meta(g, m, n))
    assert grouped.ns == bmm.ns and grouped.flops == bmm.flops == 2 * g * m * k * n


def test_a_large_expert_gemm_is_compute_bound() -> None:
    """DeepSeek-V3's routed experts (hidden 7168, expert width 2048: gate and up as one [7168, 4096] product), 8
    experts on a GPU, 65,536 routed tokens: 3.85 TFLOP, no faster than the H100's dense bf16 peak allows."""
    model = build_model("calibrated", "h100")
    rows, k, n, g = 65536, 7168, 4096, 8
    c = model.compute(
        aten._grouped_mm.default, (meta(rows, k), meta(g, k, n), meta(g, dtype=torch.int32)), {}, meta(rows, n)
    )
    assert c.flops == 2 * rows * k * n and c.dtype == "bf16"
    assert c.ns >= c.flops / get_gpu("h100").peak("bf16") * 1e9


def test_a_2d_operand_without_offs_is_refused() -> None:
    with pytest.raises(InputError, match="offs"):
        compute_features(make_call("aten::_grouped_mm", [(64, 32), (32, 48)], ["bfloat16", "bfloat16"]))


F8 = torch.float8_e4m3fn
SCALED = aten._scaled_grouped_mm.default


def scaled_args(a: tuple, g: int, n: int, k: int) -> tuple:
    """`_scaled_grouped_mm`'s operands (fp8, b column-major as torch wants it) and row-wise fp32 scales; `offs` for a
    2-D `a` (an MoE forward: its rows split among the G experts)."""
    b = meta(g, n, k, dtype=F8).transpose(-2, -1)
    if len(a) == 2:
        return (
            meta(*a, dtype=F8),
            b,
            meta(a[0], dtype=torch.float32),
            meta(g, n, dtype=torch.float32),
            meta(g, dtype=torch.int32),
        )
    return (meta(*a, dtype=F8), b, meta(g, a[1], dtype=torch.float32), meta(g, n, dtype=torch.float32))


def test_scaled_grouped_mm_is_a_gemm() -> None:
    assert op_class("aten::_scaled_grouped_mm") == "gemm"


@pytest.mark.parametrize(("a", "g", "out"), [((64, 32), 4, (64, 48)), ((4, 16, 32), 4, (4, 16, 48))])
def test_scaled_flops_are_the_groups_products(a: tuple, g: int, out: tuple) -> None:
    """fp8 experts (`_scaled_grouped_mm`): 2 m n k over the groups, as `_grouped_mm`; its scales and `offs` add none;
    the output bf16 (torch's only one)."""
    n, k = 48, 32
    args = scaled_args(a, g, n, k)
    res = SCALED(*args)
    assert tuple(res.shape) == out and res.dtype == BF16
    flops = 2 * math.prod(a) * n
    assert op_flops(SCALED, args, {}, res) == flops
    shapes = [tuple(t.shape) for t in args]
    dtypes = ["float8_e4m3fn", "float8_e4m3fn", "float32", "float32", "int32"][: len(args)]
    f = compute_features(make_call("aten::_scaled_grouped_mm", shapes, dtypes))
    assert f.op_class == "gemm" and f.flops == flops and f.dtype == "float8_e4m3fn"
    assert f.writes == 2 * res.numel()


def test_fp8_experts_run_at_the_fp8_rate() -> None:
    """DeepSeek-V3's routed experts as above in fp8: 3.85 TFLOP at the H100's fp8 peak (1,979 TFLOP/s) in the
    roofline, to the ns (the bf16 rate is 989); the calibrated model no faster. It was 0 FLOPs, timed by its bytes."""
    rows, k, n, g = 65536, 7168, 4096, 8
    args = scaled_args((rows, k), g, n, k)
    out = SCALED(*args)
    peak = get_gpu("h100").peak("fp8")
    assert peak == 1979e12  # NVIDIA's H100 SXM datasheet, dense FP8
    roof = build_model("roofline", "h100")
    c = roof.compute(SCALED, args, {}, out)
    assert c.flops == 2 * rows * k * n and c.dtype == "fp8"
    assert c.ns == math.ceil(c.flops / peak * 1e9) + roof.launch_ns  # compute-bound: 1.94 ms against 0.37 ms of bytes
    cal = build_model("calibrated", "h100").compute(SCALED, args, {}, out)
    assert cal.flops == c.flops and cal.ns >= c.flops / peak * 1e9
