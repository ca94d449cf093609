"""nll_loss's kernels touch one element a row (PyTorch's aten/src/ATen/native/cuda/Loss.cu), checked in closed form.

The forward reads each row's target and the log-probability it names; the backward zero-fills its [N, C] output,
then writes one element a row. Before, both were charged a stream over the whole [N, C] input (the backward read it
too): 2.7 and 5.5 ms a step of build-nanogpt's loss on an A100 (16,384 rows of 50,257 classes).
"""

from __future__ import annotations

import pytest

from phantora.perfmodel.gpus import get_gpu
from phantora.perfmodel.model import ComputeModel

ROWS, CLASSES = 16384, 50257  # build-nanogpt's B 16 x T 1024 tokens, GPT-2's vocabulary


@pytest.mark.parametrize("gpu", ["a100", "h100", "l40s"])
def test_the_forward_reads_one_element_a_row_not_the_input(gpu: str) -> None:
    """Under 1 % of a stream over the [N, C] fp32 input at the GPU's HBM bandwidth (1.6 ms on an A100)."""
    model = ComputeModel(gpu)
    ns = model.predict_ns("aten::nll_loss_forward", [(ROWS, CLASSES), (ROWS,)], ["float32", "int64"])
    whole_input_ns = ROWS * CLASSES * 4 / get_gpu(gpu).mem_bw * 1e9
    assert 0 < ns < 0.01 * whole_input_ns


@pytest.mark.parametrize("gpu", ["a100", "h100", "l40s"])
def test_the_backward_is_a_zero_fill_of_its_output(gpu: str) -> None:
    """`grad_input.zero_()` of [N, C] plus one scatter kernel: the fill's time, and at most one more kernel's floor."""
    model = ComputeModel(gpu)
    shapes = [(), (ROWS, CLASSES), (ROWS,), ()]
    ns = model.predict_ns("aten::nll_loss_backward", shapes, ["float32", "float32", "int64", "float32"])
    fill = model.predict_ns("aten::zero_", [(ROWS, CLASSES)], ["float32"])
    assert fill <= ns <= fill * 1.02 + 5_000
    # a bf16 input halves the bytes written
    ns16 = model.predict_ns("aten::nll_loss_backward", shapes, ["bfloat16", "bfloat16", "int64", "bfloat16"])
    assert ns16 == pytest.approx(ns / 2, rel=0.05)
