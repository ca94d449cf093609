"""The memory-efficient attention kernel the simulated GPU runs on its data (simcuda/attention.py) gives the values and
gradients of attention's closed form, softmax(Q K^T * scale + bias) V, against torch's autograd of that form in
float64 on the same fp32 inputs (the bias's gradient included: torch lets the efficient kernel train a bias)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import attention
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, causal: bool) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5 + bias
    if causal:
        scores = scores.masked_fill(torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias_shape", [(2, 3, 40, 40), (1, 1, 40, 40), (40, 40)])
def test_efficient_kernel_values_and_gradients_are_attentions(causal: bool, bias_shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))  # fp32: a dtype the efficient kernel takes
    bias = torch.randn(bias_shape)
    grad_out = torch.randn(2, 3, 40, 16)
    out, lse, seed, offset = attention.efficient_forward(q, k, v, bias, True, 0.0, causal)
    assert lse.shape == (2, 3, 64)  # 40 query rows padded to the kernel's 32-row tiles
    grads = attention.efficient_backward(
        grad_out, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, True], causal
    )
    leaves = [t.double().requires_grad_() for t in (q, k, v, bias)]
    ref = _reference(*leaves, causal)
    ref.backward(grad_out.double())
    assert (out - ref.detach()).abs().max() < 1e-5  # fp32 rounding
    for got, leaf in zip(grads, leaves, strict=True):
        assert got is not None and got.shape == leaf.shape
        assert (got.double() - leaf.grad).abs().max() < 1e-4


def test_no_bias_gradient_unless_asked() -> None:
    q = torch.randn(1, 2, 8, 8)
    bias = torch.zeros(8, 8)
    out, lse, seed, offset = attention.efficient_forward(q, q, q, bias, True)
    grads = attention.efficient_backward(q, q, q, q, bias, out, lse, seed, offset, 0.0, [True, True, True, False])
    assert grads[3] is None


@pytest.fixture
def charged(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    yield from charged_session(monkeypatch, False, Roofline(get_gpu("h100"), launch_ns=DEFAULT_LAUNCH_NS))


def test_flash_with_dropout_runs_on_the_data_without_it(charged: tuple[RankSession, list]) -> None:
    """SDPA's flash choice with dropout 0.1 (GPT-2's attention, which stopped with the CPU kernel's "Currently do not
    support dropout > 0"): the data is attention's closed form without dropout, forward and backward, and each op is
    charged as called, with its dropout_p."""
    s, seen = charged
    torch.manual_seed(0)
    host = [torch.randn(2, 3, 40, 16) for _ in range(4)]
    q, k, v, grad_out = (SimCudaTensor(x, 0) for x in host)
    cpu_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    with ChargeMode(s):
        out, lse = cpu_flash(q, k, v, 0.1, True)
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
            grad_out, q, k, v, out, lse, 0.1, True
        )
    leaves = [t.double().requires_grad_() for t in host[:3]]
    ref = _reference(*leaves, torch.zeros(40, 40, dtype=torch.float64), True)
    ref.backward(host[3].double())
    assert (out.elem.double() - ref.detach()).abs().max() < 1e-5
    for got, leaf in zip(grads, leaves, strict=True):
        assert (got.elem.double() - leaf.grad).abs().max() < 1e-4
    assert len(seen) == 2
    meta = [x.to("meta") for x in host]
    outs = (out.elem.to("meta"), lse.elem.to("meta"))
    fwd = s.model.cost(cpu_flash, (*meta[:3], 0.1, True), {}, outs)  # timed as the GPU's flash (compute.py)
    assert seen[0][1] == fwd and seen[0][1].flops == 2 * 2 * 3 * 40 * 40 * 16 * 2  # torch's formula: every pair
