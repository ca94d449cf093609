"""The LSTM and GRU cells' fused CUDA kernels (``aten._thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell``) and their
backwards, on the simulated GPU's data.

`nn.LSTM` (and `nn.GRU`) on a cuda tensor runs cuDNN where torch has it; this CPU build has none, so torch's own RNN
loop runs, and on a cuda tensor its cell is the fused kernel of ATen's RNN.cu (one kernel a time step after the two gate
GEMMs), which has no CPU kernel: pytorch/examples' word_language_model (`--accel`, its default LSTM) stopped with
`NotSimulatedError`. Here each is computed from its closed form (as RNN.cu's kernels), on real or meta data, and
charged as the one kernel (cuda_only.py `one_kernel`).

Forward: gates = input_gates + hidden_gates (+ both biases), split in four along dim 1 as input, forget, cell and
output gates; i, f, o = sigmoid, g = tanh; cy = f * cx + i * g; hy = o * tanh(cy). The workspace holds the four
activated gates, (batch, 4 * hidden), which the backward reads.
"""

from __future__ import annotations

import torch


def accumulation(dtype: torch.dtype) -> torch.dtype:
    """The dtype CUDA's kernels compute in: fp32 for half inputs, the input's own otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


FORWARD = torch.ops.aten._thnn_fused_lstm_cell.default
BACKWARD = torch.ops.aten._thnn_fused_lstm_cell_backward_impl.default


def forward(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    cx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hy, cy, workspace), computed in the accumulation dtype (fp32 for half inputs) and written in the input's."""
    acc = accumulation(input_gates.dtype)
    gates = input_gates.to(acc) + hidden_gates.to(acc)
    for bias in (input_bias, hidden_bias):
        if bias is not None:
            gates = gates + bias.to(acc)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx.to(acc) + i * g
    hy = o * cy.tanh()
    dtype = input_gates.dtype
    return hy.to(dtype), cy.to(dtype), torch.cat([i, f, g, o], 1).to(dtype)


def backward(
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    cx: torch.Tensor,
    cy: torch.Tensor,
    workspace: torch.Tensor,
    has_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(grad of the gates before activation, grad of cx, grad of the bias: the gates' gradient summed over the batch,
    or None without biases). A missing gradient (an output not used) is zero."""
    acc = accumulation(workspace.dtype)
    i, f, g, o = workspace.to(acc).chunk(4, 1)
    tanh_cy = cy.to(acc).tanh()
    ghy = grad_hy.to(acc) if grad_hy is not None else torch.zeros_like(tanh_cy)
    gcy = ghy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        gcy = gcy + grad_cy.to(acc)
    grads = [gcy * g * i * (1 - i), gcy * cx.to(acc) * f * (1 - f), gcy * i * (1 - g * g), ghy * tanh_cy * o * (1 - o)]
    grad_gates = torch.cat(grads, 1)
    dtype = workspace.dtype
    grad_bias = grad_gates.sum(0).to(dtype) if has_bias else None
    return grad_gates.to(dtype), (gcy * f).to(dtype), grad_bias


GRU_FORWARD = torch.ops.aten._thnn_fused_gru_cell.default
GRU_BACKWARD = torch.ops.aten._thnn_fused_gru_cell_backward.default


def gru_forward(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    hx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRU's fused cell: (hy, workspace). Reset, update and new gates r, z = sigmoid, n = tanh(i_n + r * h_n); hy =
    (1 - z) n + z hx. The workspace holds r, z, n, hx and h_n (the hidden side's new-gate chunk), (batch, 5 * hidden),
    as RNN.cu's kernel keeps them for the backward."""
    acc = accumulation(input_gates.dtype)
    ig, hg = input_gates.to(acc), hidden_gates.to(acc)
    if input_bias is not None:
        ig = ig + input_bias.to(acc)
    if hidden_bias is not None:
        hg = hg + hidden_bias.to(acc)
    i_r, i_z, i_n = ig.chunk(3, 1)
    h_r, h_z, h_n = hg.chunk(3, 1)
    r, z = (i_r + h_r).sigmoid(), (i_z + h_z).sigmoid()
    n = (i_n + r * h_n).tanh()
    h = hx.to(acc)
    hy = n + z * (h - n)
    dtype = input_gates.dtype
    return hy.to(dtype), torch.cat([r, z, n, h, h_n], 1).to(dtype)


def gru_backward(
    grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of the input gates, the hidden gates, hx and (with biases) both biases."""
    acc = accumulation(workspace.dtype)
    r, z, n, h, h_n = workspace.to(acc).chunk(5, 1)
    g = grad_hy.to(acc)
    d_n = g * (1 - z) * (1 - n * n)
    d_z = g * (h - n) * z * (1 - z)
    d_r = d_n * h_n * r * (1 - r)
    grad_input = torch.cat([d_r, d_z, d_n], 1)
    grad_hidden = torch.cat([d_r, d_z, d_n * r], 1)
    dtype = workspace.dtype
    biases = (grad_input.sum(0).to(dtype), grad_hidden.sum(0).to(dtype)) if has_bias else (None, None)
    return grad_input.to(dtype), grad_hidden.to(dtype), (g * z).to(dtype), *biases
