"""DeepSpeed's `quantizer` extension as the simulated GPU provides it (phantora/runtime/simcuda/ds_quantizer.py),
against values worked out by hand from the kernels' formulas (csrc/includes/quantization_utils.h)."""

from __future__ import annotations

import pytest
import torch

from phantora.runtime.simcuda.devices import NotSimulatedError
from phantora.runtime.simcuda.extensions import provided

Q = provided("quantizer")


def test_symmetric_8_bit_by_hand() -> None:
    """Two groups: max |x| 2 gives scale 256 / 4 = 64, stored 1 / 64; the second group's max 0.5 gives 256; 0.75 x 64
    = 48 exactly, 2 x 64 = 128 clamps to 127, -2 x 64 = -128; the all-zero group's scale is 1."""
    x = torch.tensor([0.75, -2.0, 2.0, 0.0, 0.5, -0.25, 0.125, 0.0], dtype=torch.float16)
    q, params = Q.quantize(x, 2, 8, Q.Symmetric)
    assert q.dtype == torch.int8 and q.shape == (8,)
    assert q.tolist() == [48, -128, 127, 0, 127, -64, 32, 0]  # 0.5 x 256 = 128 -> 127
    assert params.shape == (2, 1) and params.dtype == torch.float32
    assert params.flatten().tolist() == [1 / 64, 1 / 256]
    back = Q.dequantize(q, params, 2, 8, Q.Symmetric)
    assert back.dtype == torch.float16
    assert back.tolist() == [0.75, -2.0, 127 / 64, 0.0, 127 / 256, -0.25, 0.125, 0.0]
    zeros, p0 = Q.quantize(torch.zeros(4, dtype=torch.float16), 1, 8, Q.Symmetric)
    assert zeros.tolist() == [0, 0, 0, 0] and p0.tolist() == [[1.0]]


def test_rounding_is_half_to_even() -> None:
    """max 4 gives scale 32: 0.015625 x 32 = 0.5 -> 0, 0.046875 x 32 = 1.5 -> 2 (CUDA's __float2int_rn)."""
    x = torch.tensor([4.0, 0.015625, 0.046875, -0.046875], dtype=torch.float16)
    q, _ = Q.quantize(x, 1, 8, Q.Symmetric)
    assert q.tolist() == [127, 0, 2, -2]


def test_asymmetric_8_bit_by_hand() -> None:
    """min 1, max 3: scale 256 / 2 = 128, offset 2; 1 -> -128, 3 -> 128 clamped to 127, 2.5 -> 64."""
    x = torch.tensor([1.0, 3.0, 2.5, 2.0], dtype=torch.float16)
    q, params = Q.quantize(x, 1, 8, Q.Asymmetric)
    assert q.tolist() == [-128, 127, 64, 0]
    assert params.tolist() == [[1 / 128, 2.0]]
    assert Q.dequantize_fp32(q, params, 1, 8, Q.Asymmetric).tolist() == [1.0, 2 + 127 / 128, 2.5, 2.0]


def test_4_bit_packs_the_even_element_high() -> None:
    """max 1: scale 16 / 2 = 8; 1 -> 8 clamps to 7, -1 -> -8, 0.25 -> 2, -0.125 -> -1; bytes 0x78 and 0x2F."""
    x = torch.tensor([[1.0, -1.0, 0.25, -0.125]], dtype=torch.float16)
    q, params = Q.quantize(x, 1, 4, Q.Symmetric)
    assert q.shape == (1, 2)
    assert [b & 0xFF for b in q.flatten().tolist()] == [0x78, 0x2F]
    assert Q.dequantize(q, params, 1, 4, Q.Symmetric).tolist() == [[7 / 8, -1.0, 0.25, -0.125]]


def test_bf16_weights_round_trip_within_half_a_step() -> None:
    """CUDAQuantizer's use: a bf16 shard, cast to fp16, 8-bit groups: each value comes back within half a step (max /
    128) plus the fp16 output's rounding (2^-11 of max: 1/16 step), but a group's max, whose 128 steps clamp to 127."""
    torch.manual_seed(0)
    x = torch.randn(4096, dtype=torch.bfloat16).float().reshape(4, -1)
    q, params = Q.quantize(x.to(torch.float16), 4, 8, Q.Symmetric)
    back = Q.dequantize(q, params, 4, 8, Q.Symmetric).float().reshape(4, -1)
    top = x.abs().amax(dim=1, keepdim=True)
    step, err = top / 128, (back - x).abs()
    inner = x.abs() < top
    assert bool((err[inner] <= (step / 2 + step / 16).expand_as(x)[inner]).all())
    assert bool((err[~inner] <= (step + step / 16).expand_as(x)[~inner]).all())


def test_quantized_gradients_stop_in_one_line() -> None:
    with pytest.raises(NotSimulatedError, match="zero_quantized_gradients"):
        Q.swizzle_quant(torch.zeros(8, dtype=torch.float16), 1, 4, Q.Symmetric, 1, 1, 2)
