"""Real-mode FlexAttention in query slices (phantora/runtime/flex_chunks.py): the same values as attention over the
whole score matrix, without holding it.

Closed form: causal softmax attention, softmax(q k^T / sqrt(d) + mask) v (F.scaled_dot_product_attention's math
with is_causal), and its gradients by autograd through that formula; a score_mod that adds the query index checks
that each slice sees its queries' own indices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._higher_order_ops.flex_attention import create_fw_bw_graph, sdpa_dense, sdpa_dense_backward
from torch.nn.attention.flex_attention import create_block_mask

from phantora.runtime import flex_chunks

B, H, L, D = 2, 3, 64, 8


def causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return q >= kv


def plain(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return score


def by_query(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return score + 0.01 * q  # each row shifted by its own index: softmax ignores it, its log-sum-exp does not


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))  # type: ignore[return-value]


def test_a_slice_holds_at_most_the_budget() -> None:
    assert flex_chunks.rows_per_chunk(8, 16, 2048) == 32  # 8 x 16 x 2048 x 4 B = 1 MiB a row, 32 MiB a slice
    assert flex_chunks.rows_per_chunk(1, 1, 10**9) == 1


@pytest.mark.slow  # about 15 s: FlexAttention's reference and its graphs set up on first use
@pytest.mark.parametrize(("score_mod", "shift"), [(plain, 0.0), (by_query, 0.01)])
def test_slices_give_causal_attention_and_its_gradients(
    monkeypatch: pytest.MonkeyPatch, score_mod: Callable[..., torch.Tensor], shift: float
) -> None:
    monkeypatch.setattr(flex_chunks, "CHUNK_BYTES", B * H * L * 4 * 10)  # 10 rows a slice: 7 slices
    q, k, v = inputs()
    block_mask = create_block_mask(causal, B, H, L, L, device="cpu", BLOCK_SIZE=16).as_tuple()
    scale = 1 / math.sqrt(D)
    out, lse, _ = flex_chunks.forward(sdpa_dense, (q, k, v, score_mod, block_mask, scale, {}, (), ()), {})
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    expected = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    assert torch.allclose(out, expected, atol=1e-12)
    scores = (q @ k.transpose(-2, -1)) * scale + torch.full((L, L), -math.inf).triu(1)
    scores = scores + shift * torch.arange(L, dtype=torch.float64)[:, None]
    assert torch.allclose(lse * math.log(2), scores.logsumexp(-1), atol=1e-12)  # the HOP's lse is in log2 units

    grad_out = torch.randn(B, H, L, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected.backward(grad_out)
    index = [q.new_zeros((), dtype=torch.int) for _ in range(4)]
    example = (q.new_zeros((), requires_grad=True), index[0], index[1], index[2], index[3])
    fw_graph, joint_graph = create_fw_bw_graph(score_mod, example, ())
    args: tuple[Any, ...] = (q, k, v, out, lse, grad_out, None, fw_graph, joint_graph, block_mask, scale, {}, (), ())
    dq, dk, dv, _ = flex_chunks.backward(sdpa_dense_backward, args, {})
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        assert want is not None and torch.allclose(got, want, atol=1e-10)
