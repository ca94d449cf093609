"""nll_loss's kernels touch one element a row (PyTorch's aten/src/ATen/native/cuda/Loss.cu), checked in closed form.

The forward reads each row's target and the log-probability it names; the backward zero-fills its [N, C] output,
then writes one element a row. Before, both were charged a stream over the whole [N, C] input (the backward read it
too): 2.7 and 5.5 ms a step of build-nanogpt's loss on an A100 (16,384 rows of 50,257 classes).
"""

from __future__ import annotations

import pytest
import torch

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


def test_the_roofline_counts_the_same_bytes() -> None:
    """The runtime's byte count (`--compute-model roofline`'s time, the bytes results report under either model, the
    host model's CPU kernels, which work alike: LossNLL.cpp): the forward reads a target and the element it names
    a row and writes the loss and total weight; the backward reads its grad_output, total_weight and the targets,
    zero-fills its [N, C] output and writes one element a row. Not the [N, C] input, which it takes for its shape."""
    from phantora.runtime.compute import Roofline, op_bytes

    aten = torch.ops.aten
    x = torch.empty(ROWS, CLASSES, device="meta")
    target = torch.empty(ROWS, dtype=torch.int64, device="meta")
    fwd_args = (x, target, None, 1, -100)
    loss, total = aten.nll_loss_forward.default(*fwd_args)
    assert op_bytes(aten.nll_loss_forward.default, fwd_args, {}, (loss, total)) == ROWS * (8 + 4) + 4 + 4
    bwd_args = (torch.empty((), device="meta"), x, target, None, 1, -100, total)
    grad = aten.nll_loss_backward.default(*bwd_args)
    want = 4 + ROWS * 8 + 4 + ROWS * CLASSES * 4 + ROWS * 4
    assert op_bytes(aten.nll_loss_backward.default, bwd_args, {}, grad) == want
    h100 = get_gpu("h100")
    fwd_ns = Roofline(h100, launch_ns=0).cost(aten.nll_loss_forward.default, fwd_args, {}, (loss, total)).ns
    assert fwd_ns == pytest.approx((ROWS * 12 + 8) / h100.mem_bw * 1e9, abs=1)
