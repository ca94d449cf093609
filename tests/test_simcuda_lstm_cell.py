"""The LSTM and GRU cells' fused CUDA kernels on the simulated GPU (simcuda/lstm_cell.py).

`nn.LSTM` on a cuda tensor without cuDNN (this CPU build has none) steps torch's RNN loop, whose cell is
``aten._thnn_fused_lstm_cell`` (CUDA only): pytorch/examples' word_language_model stopped there. Closed forms, in
fp64: gates = input_gates + hidden_gates + biases; i, f, o = sigmoid, g = tanh of the four chunks; cy = f cx + i g;
hy = o tanh(cy); the backward is autograd's of those, the bias gradient the gates' summed over the batch. Each is one
charged kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session

aten = torch.ops.aten
B, H = 3, 5


@pytest.fixture(params=[False, True], ids=["real", "phantom"])
def charged(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    yield from charged_session(monkeypatch, request.param, Roofline(get_gpu("h100"), launch_ns=DEFAULT_LAUNCH_NS))


def _closed_form(xg: torch.Tensor, hg: torch.Tensor, cx: torch.Tensor, bi: torch.Tensor, bh: torch.Tensor) -> tuple:
    i, f, g, o = (xg + hg + bi + bh).chunk(4, 1)
    cy = f.sigmoid() * cx + i.sigmoid() * g.tanh()
    return o.sigmoid() * cy.tanh(), cy


def test_the_cell_forward_and_backward_are_one_kernel_each_with_the_closed_form(
    charged: tuple[RankSession, list],
) -> None:
    s, seen = charged
    torch.manual_seed(0)
    host = [torch.randn(B, 4 * H), torch.randn(B, 4 * H), torch.randn(B, H), torch.randn(4 * H), torch.randn(4 * H)]
    sims = [SimCudaTensor(t.to("meta") if s.phantom else t, 0) for t in host]
    grads = [torch.randn(B, H), torch.randn(B, H)]
    with ChargeMode(s):
        hy, cy, workspace = aten._thnn_fused_lstm_cell(*sims)
        g_hy, g_cy = (SimCudaTensor(t.to("meta") if s.phantom else t, 0) for t in grads)
        grad_gates, grad_cx, grad_bias = aten._thnn_fused_lstm_cell_backward_impl(
            g_hy, g_cy, sims[2], cy, workspace, True
        )
    assert [n for n, _ in seen] == ["aten._thnn_fused_lstm_cell", "aten._thnn_fused_lstm_cell_backward_impl"]
    assert [tuple(t.shape) for t in (hy, cy, workspace, grad_gates, grad_cx, grad_bias)] == [
        (B, H), (B, H), (B, 4 * H), (B, 4 * H), (B, H), (4 * H,),
    ]  # fmt: skip
    assert hy.device == torch.device("cuda", 0)
    if s.phantom:
        return
    leaves = [t.double().requires_grad_() for t in host]
    want_hy, want_cy = _closed_form(*leaves)
    torch.testing.assert_close(hy.elem.double(), want_hy)
    torch.testing.assert_close(cy.elem.double(), want_cy)
    (want_hy * grads[0].double() + want_cy * grads[1].double()).sum().backward()
    assert leaves[0].grad is not None and leaves[2].grad is not None and leaves[3].grad is not None
    torch.testing.assert_close(grad_gates.elem.double(), leaves[0].grad)  # d/d input_gates = d/d gates
    torch.testing.assert_close(grad_cx.elem.double(), leaves[2].grad)
    torch.testing.assert_close(grad_bias.elem.double(), leaves[3].grad)


def test_without_gradients_of_cy_and_biases(charged: tuple[RankSession, list]) -> None:
    """Only hy used (grad_cy undefined) and no biases: the bias gradient is None, cy's gradient taken as zero."""
    s, _ = charged
    if s.phantom:
        pytest.skip("values only")
    torch.manual_seed(1)
    host = [torch.randn(B, 4 * H), torch.randn(B, 4 * H), torch.randn(B, H)]
    sims = [SimCudaTensor(t, 0) for t in host]
    grad = torch.randn(B, H)
    with ChargeMode(s):
        hy, cy, workspace = aten._thnn_fused_lstm_cell(*sims)
        grad_gates, _, grad_bias = aten._thnn_fused_lstm_cell_backward_impl(
            SimCudaTensor(grad, 0), None, sims[2], cy, workspace, False
        )
    assert grad_bias is None
    leaves = [t.double().requires_grad_() for t in host]
    zero = torch.zeros(4 * H, dtype=torch.float64)
    want_hy, _ = _closed_form(*leaves, zero, zero)
    (want_hy * grad.double()).sum().backward()
    torch.testing.assert_close(grad_gates.elem.double(), leaves[0].grad)


def _gru_closed_form(xg: torch.Tensor, hg: torch.Tensor, hx: torch.Tensor, bi: torch.Tensor, bh: torch.Tensor) -> Any:
    """r, z = sigmoid, n = tanh(i_n + r h_n), hy = (1 - z) n + z hx (torch's GRU)."""
    i_r, i_z, i_n = (xg + bi).chunk(3, 1)
    h_r, h_z, h_n = (hg + bh).chunk(3, 1)
    r, z = (i_r + h_r).sigmoid(), (i_z + h_z).sigmoid()
    n = (i_n + r * h_n).tanh()
    return (1 - z) * n + z * hx


def test_the_gru_cell_forward_and_backward_are_one_kernel_each_with_the_closed_form(
    charged: tuple[RankSession, list],
) -> None:
    s, seen = charged
    torch.manual_seed(2)
    host = [torch.randn(B, 3 * H), torch.randn(B, 3 * H), torch.randn(B, H), torch.randn(3 * H), torch.randn(3 * H)]
    sims = [SimCudaTensor(t.to("meta") if s.phantom else t, 0) for t in host]
    grad = torch.randn(B, H)
    with ChargeMode(s):
        hy, workspace = aten._thnn_fused_gru_cell(*sims)
        g = SimCudaTensor(grad.to("meta") if s.phantom else grad, 0)
        grads = aten._thnn_fused_gru_cell_backward(g, workspace, True)
    assert [n for n, _ in seen] == ["aten._thnn_fused_gru_cell", "aten._thnn_fused_gru_cell_backward"]
    assert [tuple(t.shape) for t in (hy, workspace, *grads)] == [
        (B, H), (B, 5 * H), (B, 3 * H), (B, 3 * H), (B, H), (3 * H,), (3 * H,),
    ]  # fmt: skip
    if s.phantom:
        return
    leaves = [t.double().requires_grad_() for t in host]
    want = _gru_closed_form(*leaves)
    torch.testing.assert_close(hy.elem.double(), want)
    (want * grad.double()).sum().backward()
    for got, leaf in zip(grads, leaves, strict=True):
        assert leaf.grad is not None
        torch.testing.assert_close(got.elem.double(), leaf.grad)
