"""The simulated GPU's sdpa backend is torch's CUDA choice (sdp_utils.cpp `select_sdp_backend`), and each backend is
timed as its own kernel.

Each expected backend below is read off torch's constraints for that case (flash: fp16/bf16, no mask, head dim
<= 256, sm80+, causal only with equal lengths; efficient: fp16/fp32/bf16 on sm80+, head dim a multiple of the GEMM
alignment, masks allowed; math otherwise), not from an earlier run.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from phantora.perfmodel.gpus import get_gpu
from phantora.perfmodel.model import ComputeModel
from phantora.runtime.simcuda import sdp_choice
from phantora.runtime.simcuda.sdp_choice import CUDNN, EFFICIENT, FLASH, MATH, SdpParams, choose

SM80, SM86, SM90, SM70 = (8, 0), (8, 6), (9, 0), (7, 0)


def params(
    dtype: torch.dtype = torch.bfloat16,
    *,
    b: int = 2,
    hq: int = 8,
    hk: int = 8,
    sq: int = 128,
    sk: int = 128,
    d: int = 64,
    dv: int | None = None,
    mask: bool = False,
    causal: bool = False,
    gqa: bool = False,
    grad: bool = False,
    dropout: float = 0.0,
) -> SdpParams:
    q = torch.empty(b, hq, sq, d, dtype=dtype, device="meta", requires_grad=grad)
    k = torch.empty(b, hk, sk, d, dtype=dtype, device="meta")
    v = torch.empty(b, hk, sk, dv or d, dtype=dtype, device="meta")
    m = torch.empty(sq, sk, dtype=torch.bool, device="meta") if mask else None
    return SdpParams(q, k, v, m, dropout, causal, gqa)


@pytest.mark.parametrize(
    ("case", "capability", "expected"),
    [
        (params(torch.bfloat16), SM90, FLASH),
        (params(torch.float16), SM80, FLASH),
        (params(torch.float32), SM90, EFFICIENT),  # flash takes fp16/bf16 only
        (params(torch.bfloat16, mask=True), SM90, EFFICIENT),  # flash takes no attn_mask
        (params(torch.bfloat16, causal=True, sq=64, sk=128), SM90, EFFICIENT),  # causal needs sq == sk for flash
        (params(torch.bfloat16, causal=True), SM90, FLASH),
        (params(torch.bfloat16, d=320), SM90, EFFICIENT),  # flash head dim <= 256; efficient has no bound
        (params(torch.float32, d=30), SM90, MATH),  # fp32 efficient needs head dim % 4
        (params(torch.bfloat16, d=36), SM90, FLASH),  # flash pads the head dim to 8 (attention.cpp pad_last_dim)
        (params(torch.bfloat16, d=36, mask=True), SM80, MATH),  # 16-bit efficient needs head dim % 8
        (params(torch.bfloat16, hk=2), SM90, MATH),  # different heads without enable_gqa: no fused kernel
        (params(torch.bfloat16, hk=2, gqa=True), SM90, FLASH),
        # efficient has no GQA (torch's sdpa docs: "works only for Flash_attention and math kernel"): fp32 GQA is math
        (params(torch.float32, hk=2, gqa=True), SM90, MATH),
        (params(torch.float32, gqa=True), SM90, EFFICIENT),  # enable_gqa with equal heads: no grouping to refuse
        (params(torch.bfloat16, hk=2, gqa=True, mask=True), SM90, MATH),  # masked GQA: neither flash nor efficient
        (params(torch.bfloat16, hk=3, gqa=True), SM90, MATH),  # 3 kv heads do not divide 8
        (params(torch.bfloat16, d=200, grad=True), SM86, EFFICIENT),  # sm86 flash backward: head dim <= 192
        (params(torch.bfloat16, d=200, grad=True), SM90, FLASH),
        (params(torch.bfloat16), SM70, MATH),  # V100: no flash, no bf16 efficient
        (params(torch.float16), SM70, EFFICIENT),
        (params(torch.bfloat16, sq=0), SM90, MATH),  # zero sequence length
    ],
)
def test_default_choice_is_torchs(case: SdpParams, capability: tuple[int, int], expected: str) -> None:
    assert choose(case, capability) == expected


def test_three_dim_inputs_take_the_math_path() -> None:
    q = torch.empty(4, 128, 64, dtype=torch.bfloat16, device="meta")
    assert choose(SdpParams(q, q, q, None, 0.0, False, False), SM90) == MATH


def test_efficient_needs_aligned_storage_offsets_on_sm80() -> None:
    base = torch.empty(2 * 8 * 128 * 64 + 2, dtype=torch.bfloat16, device="meta")
    q = base[2:].view(2, 8, 128, 64)  # offset 2 elements: not a multiple of 8
    case = SdpParams(q, q, q, torch.empty(128, 128, device="meta"), 0.0, False, False)
    assert choose(case, SM90) == MATH
    assert sdp_choice.gemm_alignment(torch.bfloat16, SM80) == 8 and sdp_choice.gemm_alignment(torch.float32, SM80) == 4


@pytest.mark.parametrize(
    ("backends", "case", "expected"),
    [
        (SDPBackend.MATH, params(torch.bfloat16), MATH),
        (SDPBackend.EFFICIENT_ATTENTION, params(torch.bfloat16), EFFICIENT),
        ([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], params(torch.float32), EFFICIENT),
        (SDPBackend.CUDNN_ATTENTION, params(torch.bfloat16), CUDNN),
        (SDPBackend.CUDNN_ATTENTION, params(torch.bfloat16, d=256), None),  # cuDNN 9.1: head dim <= 128
        (SDPBackend.FLASH_ATTENTION, params(torch.float32), None),
        (SDPBackend.FLASH_ATTENTION, params(torch.bfloat16, mask=True), None),
    ],
)
def test_sdpa_kernel_contexts_are_honoured(backends: object, case: SdpParams, expected: str | None) -> None:
    with sdpa_kernel(backends):  # type: ignore[arg-type]
        if expected is None:
            with pytest.warns(UserWarning, match="not used because"), pytest.raises(RuntimeError) as err:
                choose(case, SM90)
            assert str(err.value) == "No available kernel. Aborting execution."
        else:
            assert choose(case, SM90) == expected


def test_priority_order_is_honoured() -> None:
    order = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]
    with sdpa_kernel(order, set_priority=True):
        assert choose(params(torch.bfloat16), SM90) == EFFICIENT


def test_every_backend_off_is_torchs_no_viable_backend() -> None:
    cuda = torch.backends.cuda
    saved = [cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()]
    saved.append(cuda.cudnn_sdp_enabled())
    try:
        for enable in (cuda.enable_flash_sdp, cuda.enable_mem_efficient_sdp, cuda.enable_math_sdp):
            enable(False)
        cuda.enable_cudnn_sdp(False)
        with pytest.raises(RuntimeError, match="^No viable backend for scaled_dot_product_attention was found"):
            choose(params(), SM90)
    finally:
        cuda.enable_flash_sdp(saved[0])
        cuda.enable_mem_efficient_sdp(saved[1])
        cuda.enable_math_sdp(saved[2])
        cuda.enable_cudnn_sdp(saved[3])


def test_efficient_fp32_is_timed_at_three_tf32_products() -> None:
    """fp32 memory-efficient attention on sm80+ runs its GEMMs as 3 TF32 tensor-core products (CUTLASS
    OpMultiplyAddFastF32): its compute term is FLOPs / (TF32 peak / 3), against the fp32 CUDA-core peak flash would
    have been charged."""
    a100 = get_gpu("a100")
    assert a100.fast_f32_peak() == pytest.approx(a100.tensor_flops["tf32"] / 3)
    assert dataclasses.replace(a100, capability=(7, 0)).fast_f32_peak() == a100.fp32_flops  # no TF32 before sm80
    shapes = [(8, 16, 4096, 128)] * 3
    model = ComputeModel("a100")
    eff = model.predict_ns("aten::_scaled_dot_product_efficient_attention", shapes, ["float32"] * 3)
    slow = model.predict_ns("aten::_scaled_dot_product_flash_attention", shapes, ["float32"] * 3)
    flops = 2 * 8 * 16 * 4096 * 4096 * (128 + 128)
    assert eff >= flops / a100.fast_f32_peak() * 1e9  # no faster than its peak
    # compute-bound at this size: the ratio of the two kernels is the ratio of their peaks
    assert slow / eff == pytest.approx(a100.fast_f32_peak() / a100.fp32_flops, rel=0.05)
