"""FlexAttention's reference in query chunks: real-mode attention without the whole score matrix.

In real mode a rank computes FlexAttention with PyTorch's eager reference (flex_attention.py), which builds the
score matrix of every query against every key, B x H x Lq x Lkv in fp32, and several more like it (the masked
scores, the probabilities; the backward about eight at once). A GPU's fused kernel holds none of them: at
torchtitan's llama3_debugmodel as its docs run it (batch 8, 16 heads, sequence 2048) one such matrix is 2 GiB,
and a real-mode rank grew past 12 GB of host memory. Here the reference runs on slices of the queries, each small
enough that one of its matrices stays under `CHUNK_BYTES`:

- softmax is per query row, so the forward's output, log-sum-exp and row maxima are the slices' concatenated;
- in the backward the queries' gradients are the slices' concatenated, and the keys', values' and captured
  buffers' gradients are the sums of the slices' (their order of summation differs from the whole call's);
- the score and mask functions see each query's own index: they are called with the slice's offset added.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._higher_order_ops.flex_attention import _permute_strides

CHUNK_BYTES = 32 * 2**20  # one fp32 score matrix of a slice: B x H x rows x Lkv x 4 bytes at most
# score-sized matrices the reference holds at once at its peak (the backward's): 212 MB over 33.5 MB matrices at
# sequence 512, 879 MB over 134 MB at 1024 (torchtitan llama3_debugmodel, batch 2, 16 heads: glibc's mmapped
# bytes at the rank's peak, before slicing), so 6.3 and 6.6
LIVE_MATRICES = 6.5
_largest = 0  # bytes of the largest score matrix of a slice this rank's FlexAttention calls held (or would hold)


def rows_per_chunk(batch: int, heads: int, kv_len: int, budget: int = CHUNK_BYTES) -> int:
    """How many query rows a slice takes so that one fp32 score matrix of it fits in `budget` bytes."""
    return max(1, budget // max(1, batch * heads * kv_len * 4))


def note(query: torch.Tensor, kv_len: int) -> None:
    """Count a FlexAttention call's slice matrix (its shapes alone: phantom mode counts what real mode would hold)."""
    global _largest
    batch, heads, q_len = query.shape[0], query.shape[1], query.shape[2]
    rows = min(q_len, rows_per_chunk(batch, heads, kv_len, CHUNK_BYTES))
    _largest = max(_largest, batch * heads * rows * kv_len * (8 if query.dtype == torch.float64 else 4))


def workspace_bytes() -> int:
    """Host memory real mode's FlexAttention reference holds at its peak, beyond its outputs."""
    return int(LIVE_MATRICES * _largest)


def _shifted(fn: Callable[..., Any], position: int, offset: int) -> Callable[..., Any]:
    """`fn` with the argument at `position` (the query index) moved by `offset`."""

    def call(*args: Any) -> Any:
        return fn(*args[:position], args[position] + offset, *args[position + 1 :])

    return call


def _slices(query: torch.Tensor, kv_len: int) -> list[tuple[int, int]]:
    batch, heads, q_len = query.shape[0], query.shape[1], query.shape[2]
    step = rows_per_chunk(batch, heads, kv_len, CHUNK_BYTES)
    return [(start, min(start + step, q_len)) for start in range(0, q_len, step)]


def _mask(block_mask: tuple, offset: int) -> tuple:
    return (*block_mask[:-1], _shifted(block_mask[-1], 2, offset))  # mask_mod(b, h, q_idx, kv_idx, ...)


def forward(reference: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """`reference(query, key, value, score_mod, block_mask, scale, kernel_options, *buffers)` over query slices."""
    query, key, value, score_mod, block_mask, *rest = args
    slices = _slices(query, key.shape[2])
    if len(slices) == 1:
        return reference(*args, **kwargs)
    parts = []
    for start, end in slices:
        q = query[:, :, start:end]
        parts.append(reference(q, key, value, _shifted(score_mod, 3, start), _mask(block_mask, start), *rest, **kwargs))
    out, lse, max_scores = (torch.cat([p[i] for p in parts], dim=2) for i in range(3))
    return _permute_strides(out, query.stride()), lse, max_scores  # the output's layout follows the query's


def _summed(total: list[Any], part: list[Any]) -> list[Any]:
    """Captured buffers' gradients added slice by slice (None: the buffer needs none)."""
    return [b if a is None else (a if b is None else a.add_(b)) for a, b in zip(total, part, strict=True)]


def backward(reference: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """`reference(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph, block_mask,
    scale, kernel_options, score_buffers, mask_buffers)` over query slices."""
    query, key, value, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, *rest = args
    slices = _slices(query, key.shape[2])
    if len(slices) == 1 or joint_graph is None:
        return reference(*args, **kwargs)
    grad_q, grad_k, grad_v, grad_captured = [], None, None, None
    for start, end in slices:

        def rows(t: torch.Tensor | None, start: int = start, end: int = end) -> torch.Tensor | None:
            return None if t is None else t[:, :, start:end]

        dq, dk, dv, captured = reference(
            rows(query), key, value, rows(out), rows(lse), rows(grad_out), rows(grad_lse),
            _shifted(fw_graph, 3, start), _shifted(joint_graph, 3, start), _mask(block_mask, start), *rest, **kwargs,
        )  # fmt: skip
        grad_q.append(dq)
        grad_k = dk if grad_k is None else grad_k.add_(dk)
        grad_v = dv if grad_v is None else grad_v.add_(dv)
        grad_captured = list(captured) if grad_captured is None else _summed(grad_captured, list(captured))
    return _permute_strides(torch.cat(grad_q, dim=2), query.stride()), grad_k, grad_v, tuple(grad_captured or ())
