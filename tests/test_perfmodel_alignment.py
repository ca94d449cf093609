"""Unaligned tensor-core GEMMs (phantora.perfmodel.alignment) against published per-kernel figures."""

from __future__ import annotations

import pytest

from phantora.perfmodel.alignment import is_unaligned_gemm
from phantora.perfmodel.features import compute_features, make_call
from phantora.perfmodel.model import ComputeModel

# pytorch/pytorch#181718 (2026-04-28): bf16 N x N x N matmuls on an RTX 4090 (Ada), TFLOP/s and the kernel each ran.
# N=2040 ran an aligned ampere s1688 ldg8 kernel; the odd N's ran cutlass_75_tensorop_bf16_s1688gemm_..._align1.
ALIGNED_2040 = 155.9
ALIGN1 = {2055: 115.6, 2057: 106.8, 2071: 110.9, 2073: 112.0}


def _tflops(model: ComputeModel, n: int) -> float:
    ns, _ = model.timed_call(make_call("aten::mm", [(n, n), (n, n)], ["bfloat16", "bfloat16"]))
    return 2 * n**3 / ns / 1e3


@pytest.mark.parametrize("n", sorted(ALIGN1))
def test_odd_square_bf16_gemm_matches_the_published_align1_rate(n: int) -> None:
    """On the L40S (Ada, as the issue's RTX 4090) an odd N's rate relative to N=2040 is the published one, +-10 %."""
    model = ComputeModel("l40s")
    got = _tflops(model, n) / _tflops(model, 2040)
    want = ALIGN1[n] / ALIGNED_2040
    assert got == pytest.approx(want, rel=0.10)


def test_gpt2_vocabulary_padding_makes_the_lm_head_aligned() -> None:
    """50,257 (GPT-2's vocabulary) is off the 8-element grid of bf16, 50,304 (nanoGPT's padding) on it."""
    for vocab, unaligned in ((50257, True), (50304, False)):
        for shapes in (
            [(16384, 768), (768, vocab)],  # forward: logits
            [(16384, vocab), (vocab, 768)],  # backward: input gradient
            [(vocab, 16384), (16384, 768)],  # backward: weight gradient (a transposed view: m is a leading dim)
        ):
            f = compute_features(make_call("aten::mm", shapes, ["bfloat16", "bfloat16"]))
            assert is_unaligned_gemm(f) is unaligned


def test_which_gemms_count() -> None:
    """TF32 needs 4-element rows and fp8 16; plain fp32 (SIMT) and matrix-vector products are never penalised."""

    def unaligned(shapes: list, dtype: str, tf32: bool = False) -> bool:
        return is_unaligned_gemm(compute_features(make_call("aten::mm", shapes, [dtype, dtype])), tf32)

    assert unaligned([(1024, 1024), (1024, 1026)], "float32", tf32=True)
    assert not unaligned([(1024, 1024), (1024, 1028)], "float32", tf32=True)
    assert not unaligned([(1024, 1024), (1024, 1026)], "float32")
    assert unaligned([(1024, 1024), (1024, 1032)], "float8_e4m3fn")
    assert not unaligned([(1024, 1024), (1024, 1040)], "float8_e4m3fn")
    assert not unaligned([(1, 1023), (1023, 4096)], "bfloat16")
    assert not unaligned([(4096, 1023), (1023, 1)], "bfloat16")


def test_tf32_is_part_of_the_cache_key() -> None:
    """An fp32 product asked for with TF32 after the same call without it runs at the TF32 peak, not at the
    cached fp32 time. A100: 156 TFLOP/s TF32 against 19.5 fp32, so a compute-bound GEMM is several times faster."""
    model = ComputeModel("a100")
    shapes = [(8192, 8192), (8192, 8192)]
    fp32, _ = model.timed_call(make_call("aten::mm", shapes, ["float32", "float32"]))
    tf32, _ = model.timed_call(make_call("aten::mm", shapes, ["float32", "float32"], {"tf32": True}))
    assert fp32 > 4 * tf32


def test_a_call_times_the_same_whatever_was_asked_before() -> None:
    """The cache holds a call's time under everything it depends on, the output hints too: nll_loss with
    reduction="none" writes a loss a row (its `out_shapes`), with "mean" one value, on the same inputs. Each, asked
    second in a model, equals its own time asked first in a fresh one."""
    rows = 1 << 20

    def nll(outs: list) -> object:
        extra = {"out_shapes": outs, "out_dtypes": ["float32", "float32"]}
        return make_call("aten::nll_loss_forward", [(rows, 50257), (rows,)], ["float32", "int64"], extra)

    per_row, reduced = nll([[rows], []]), nll([[], []])
    for first, second in ((reduced, per_row), (per_row, reduced)):
        model = ComputeModel("h100")
        model.timed_call(first)
        assert model.timed_call(second) == ComputeModel("h100").timed_call(second)
