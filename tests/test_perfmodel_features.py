"""Compute-model features against closed forms: FLOPs and bytes of GEMMs, attention, memory-bound ops."""

from __future__ import annotations

import numpy as np
import pytest

from phantora.errors import InputError
from phantora.perfmodel import compute_features, get_gpu, make_call, op_class
from phantora.perfmodel.dtypes import normalize_dtype, promote
from phantora.perfmodel.features import causal_pairs
from phantora.perfmodel.ops import canonical_op


def feats(op, shapes, dtypes, extra=None, aliased=False):
    return compute_features(make_call(op, shapes, dtypes, extra), aliased=aliased)


@pytest.mark.parametrize("m,n,k", [(1024, 4096, 512), (7, 3, 5), (1, 8192, 8192)])
def test_mm_flops_and_bytes(m, n, k):
    f = feats("aten::mm", [(m, k), (k, n)], ["bf16", "bf16"])
    assert f.op_class == "gemm"
    assert f.flops == 2 * m * n * k
    assert f.bytes == 2 * (m * k + k * n + m * n)
    assert f.dims == (1, m, n, k)


def test_addmm_reads_bias_first_argument():
    m, n, k = 64, 128, 256
    f = feats("aten::addmm.default", [(n,), (m, k), (k, n)], ["float32"] * 3)
    assert f.flops == 2 * m * n * k + m * n
    assert f.bytes == 4 * (n + m * k + k * n + m * n)


def test_bmm_and_broadcast_matmul():
    f = feats("aten::bmm", [(8, 32, 64), (8, 64, 16)], ["fp16", "fp16"])
    assert f.flops == 2 * 8 * 32 * 16 * 64
    g = feats("aten::matmul", [(4, 1, 32, 64), (3, 64, 16)], ["fp16", "fp16"])
    assert g.dims == (12, 32, 16, 64)  # batch dims broadcast to (4, 3)
    h = feats("aten::matmul", [(2, 10, 64), (64, 16)], ["fp16", "fp16"])
    assert h.dims == (1, 20, 16, 64)  # a 2-D right operand folds the batch into m


def test_linear_flops_match_perfdb_readme():
    # perfdb README: a Linear key is [X, W[N,K], bias] and its FLOPs are 2 * numel(X) * N.
    x, n, k = (2, 8192, 256), 768, 256
    f = feats("aten::linear", [x, (n, k)], ["bf16", "bf16"])
    assert f.flops == 2 * int(np.prod(x)) * n


def test_mm_shape_mismatch_is_input_error():
    with pytest.raises(InputError) as e:
        feats("aten::mm", [(16, 32), (16, 32)], ["bf16", "bf16"])
    assert e.value.field == "shapes" and "inner dimensions" in str(e.value)


@pytest.mark.parametrize("q,kv", [(1, 1), (5, 5), (7, 3), (3, 9), (64, 128)])
def test_causal_pairs_match_tril_count(q, kv):
    assert causal_pairs(q, kv) == int(np.tril(np.ones((q, kv))).sum())


def test_attention_flop_formulas():
    b, h, s, d = 2, 16, 1024, 128
    qkv = [(b, h, s, d)] * 3
    full = feats("aten::_scaled_dot_product_flash_attention", qkv, ["bf16"] * 3)
    assert full.op_class == "attention_fwd"
    assert full.flops == 4 * b * h * s * s * d
    causal = feats("aten::_scaled_dot_product_flash_attention", qkv, ["bf16"] * 3, {"causal": True})
    assert causal.flops == 4 * b * h * d * s * (s + 1) // 2
    bwd_shapes = [(b, h, s, d)] * 5 + [(b, h, s)]
    bwd = feats("aten::_scaled_dot_product_flash_attention_backward", bwd_shapes, ["bf16"] * 5 + ["fp32"])
    assert bwd.op_class == "attention_bwd"
    assert bwd.flops * 2 == 5 * full.flops  # five matmuls of the forward's two


def test_elementwise_bytes():
    n = 1 << 20
    add = feats("aten::add.Tensor", [(n,), (n,)], ["bf16", "bf16"])
    assert add.op_class == "elementwise" and add.bytes == 3 * 2 * n and add.working_set == 3 * 2 * n
    inplace = feats("aten::add_", [(n,), (n,)], ["fp32", "fp32"])
    assert inplace.bytes == 3 * 4 * n and inplace.working_set == 2 * 4 * n  # no new output buffer
    shared = feats("aten::add", [(n,), (n,)], ["bf16", "bf16"], aliased=True)
    assert shared.bytes == 2 * 2 * n  # both inputs are one buffer
    bcast = feats("aten::mul", [(64, 1024), (1024,)], ["fp32", "fp32"])
    assert bcast.bcast and bcast.bytes == 4 * (64 * 1024 * 2 + 1024)
    mixed = feats("aten::mul", [(64, 1024), ()], ["fp32", "float64"])
    assert mixed.mixed and mixed.dtype == "float32" and mixed.bytes == 4 * 64 * 1024 * 2 + 8


def test_copy_fill_foreach_noop():
    n = 1000
    conv = feats("aten::_to_copy", [(n,)], ["bf16"], {"dtype": "float32"})
    assert conv.op_class == "copy" and conv.bytes == n * (2 + 4)
    zeros = feats("aten::zeros_like", [(n,)], ["float32"])
    assert zeros.op_class == "fill" and zeros.bytes == 4 * n
    shapes = [(n,), (2 * n,)] * 3
    fe = feats("aten::_foreach_addcmul_.Scalar", shapes, ["float32"] * 6, {"list_len": 2})
    assert fe.op_class == "foreach" and fe.tensors == 2
    assert fe.bytes == 4 * (3 * 3 * n + 3 * n)  # reads three lists, writes the first
    assert feats("aten::view", [(n,)], ["float32"]).bytes == 0
    assert op_class("aten::transpose.int") == "noop"


def test_masked_fill_out_of_place_is_clone_plus_fill():
    n = 4096
    f = feats("aten::masked_fill", [(n,), (n,)], ["fp32", "bool"])
    assert f.kernels == 2
    assert f.bytes == 4 * n * 4 + n  # clone (read + write), then fill (read + write) and the mask


def test_names_and_dtypes():
    assert canonical_op("aten.add_.Tensor") == canonical_op("add_") == "aten::add_"
    assert normalize_dtype("BFloat16") == normalize_dtype("torch.bfloat16") == normalize_dtype("bf16") == "bfloat16"
    assert promote(["bfloat16", "float16"], [1, 1]) == "float32"
    assert promote(["int64", "float64"], [1, 0]) == "float32"  # a float scalar lifts ints to the default float
    with pytest.raises(InputError) as e:
        normalize_dtype("bf17")
    assert e.value.field == "dtype"


def test_gpu_table_and_errors():
    for name in ("a100", "H100", "h200", "b200", "L40S", "h100-sxm"):
        g = get_gpu(name)
        assert g.matmul_peak("bfloat16") > g.fp32_flops
    assert get_gpu("a100").matmul_peak("bfloat16") == 312e12  # REFERENCE.md section 2
    assert get_gpu("l40s").mem_bw == 864e9
    with pytest.raises(InputError) as e:
        get_gpu("v100")
    assert e.value.field == "gpu" and "a100" in str(e.value)
    with pytest.raises(InputError, match="no float8"):
        get_gpu("a100").matmul_peak("float8_e4m3fn")
    h100 = get_gpu("h100")
    assert h100.matmul_peak("float8_e4m3fn") / h100.matmul_peak("bfloat16") == pytest.approx(2, rel=0.01)
