"""The public functions of the simulated FlashAttention packages (simflash.py): FA3's `flash_attn_interface` and
FA2's `flash_attn`, with their signatures and return values, over flash_kernels.py's two ops.

FA3 (hopper/flash_attn_interface.py): `flash_attn_func(q, k, v, softmax_scale, causal, qv, q/k/v_descale,
window_size, attention_chunk, softcap, num_splits, pack_gqa, deterministic, sm_margin, return_attn_probs)` returns
out, or (out, softmax_lse) with `return_attn_probs`; `flash_attn_varlen_func` adds the cumulative sequence lengths,
`seqused_q` / `seqused_k` and the longest lengths; `flash_attn_qkvpacked_func` takes (batch, seq, 3, heads, dim).
FA2 (flash_attn/flash_attn_interface.py): `flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
softcap, alibi_slopes, deterministic, return_attn_probs)` returns out, or (out, softmax_lse, None) (FlashAttention 2
returns the attention probabilities only with dropout, which is not simulated); likewise its varlen, kvpacked and
qkvpacked forms. What they do not simulate (FP8 descaling, `qv`, attention chunks, `seqused_*`, dropout, ALiBi,
paged or appended KV caches) stops the run with a `NotSimulatedError` naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from phantora.runtime.simcuda import flash_kernels
from phantora.runtime.simcuda.devices import NotSimulatedError


def _refuse(func: str, **given: Any) -> None:
    """Stop on an argument the simulation does not compute (set: not None, nonzero, not False)."""
    for name, value in given.items():
        if value is not None and value is not False and not (isinstance(value, (int, float)) and value == 0):
            raise NotSimulatedError(f"{func}: {name}={value!r} is not simulated (phantora's FlashAttention stand-in)")


class _Flash(torch.autograd.Function):
    """FlashAttention's forward and backward, dense or packed: flash_kernels.py's ops."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: Any, cu_k: Any, max_q: Any, max_k: Any,
        scale: float | None, causal: bool, window: Any, softcap: float, fa3: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
        out, lse = flash_kernels.FORWARD(
            q, k, v, cu_q, cu_k, max_q, max_k, scale, bool(causal), left, right, softcap, fa3
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.rest = (max_q, max_k, scale, bool(causal), left, right, softcap)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, *_: Any) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, *rest = ctx.rest
        dq, dk, dv = flash_kernels.BACKWARD(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, max_q, max_k, *rest)
        return dq, dk, dv, *([None] * 9)


def _scale(q: torch.Tensor, softmax_scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)


# FlashAttention 3 (`flash_attn_interface`)


def flash_attn_func(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None, causal: bool = False,
    qv: Any = None, q_descale: Any = None, k_descale: Any = None, v_descale: Any = None, window_size: Any = (-1, -1),
    attention_chunk: int = 0, softcap: float = 0.0, num_splits: int = 1, pack_gqa: Any = None,
    deterministic: bool = False, sm_margin: int = 0, return_attn_probs: bool = False,
) -> Any:  # fmt: skip
    """FA3's dense attention of (batch, seq, heads, dim) tensors: out, or (out, softmax_lse (batch, heads, seq))."""
    _refuse("flash_attn_func", qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
            attention_chunk=attention_chunk)  # fmt: skip
    out, lse = _Flash.apply(
        q, k, v, None, None, None, None, _scale(q, softmax_scale), causal, window_size, softcap, True
    )  # fmt: skip
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, seqused_q: Any = None, seqused_k: Any = None,
    softmax_scale: float | None = None, causal: bool = False, qv: Any = None, q_descale: Any = None,
    k_descale: Any = None, v_descale: Any = None, window_size: Any = (-1, -1), attention_chunk: int = 0,
    softcap: float = 0.0, num_splits: int = 1, pack_gqa: Any = None, deterministic: bool = False, sm_margin: int = 0,
    return_attn_probs: bool = False,
) -> Any:  # fmt: skip
    """FA3's packed attention of (total, heads, dim) tensors, each sequence on its own: out, or (out, softmax_lse
    (heads, total_q))."""
    _refuse("flash_attn_varlen_func", seqused_q=seqused_q, seqused_k=seqused_k, qv=qv, q_descale=q_descale,
            k_descale=k_descale, v_descale=v_descale, attention_chunk=attention_chunk)  # fmt: skip
    out, lse = _Flash.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, _scale(q, softmax_scale), causal, window_size,
        softcap, True,
    )  # fmt: skip
    return (out, lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor, softmax_scale: float | None = None, causal: bool = False, q_descale: Any = None,
    k_descale: Any = None, v_descale: Any = None, window_size: Any = (-1, -1), attention_chunk: int = 0,
    softcap: float = 0.0, deterministic: bool = False, num_heads_q: Any = None, sm_margin: int = 0,
    return_attn_probs: bool = False,
) -> Any:  # fmt: skip
    """FA3's attention of a (batch, seq, 3, heads, dim) tensor (queries, keys, values stacked)."""
    _refuse("flash_attn_qkvpacked_func", num_heads_q=num_heads_q)
    q, k, v = qkv.unbind(2)
    return flash_attn_func(
        q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale, window_size, attention_chunk, softcap,
        return_attn_probs=return_attn_probs,
    )  # fmt: skip


def flash_attn_with_kvcache(*args: Any, **kwargs: Any) -> Any:
    """Inference over a KV cache (appended or paged): not simulated."""
    raise NotSimulatedError("flash_attn_with_kvcache (inference over a KV cache) is not simulated")


# FlashAttention 2 (`flash_attn`)


def fa2_func(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
    causal: bool = False, window_size: Any = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
    deterministic: bool = False, return_attn_probs: bool = False,
) -> Any:  # fmt: skip
    """FA2's dense attention of (batch, seq, heads, dim) tensors: out, or (out, softmax_lse, None)."""
    _refuse("flash_attn_func", dropout_p=dropout_p, alibi_slopes=alibi_slopes)
    out, lse = _Flash.apply(
        q, k, v, None, None, None, None, _scale(q, softmax_scale), causal, window_size, softcap, False
    )  # fmt: skip
    return (out, lse, None) if return_attn_probs else out


def fa2_varlen_func(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: float | None = None,
    causal: bool = False, window_size: Any = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
    deterministic: bool = False, return_attn_probs: bool = False, block_table: Any = None,
) -> Any:  # fmt: skip
    """FA2's packed attention of (total, heads, dim) tensors: out, or (out, softmax_lse (heads, total_q), None)."""
    _refuse("flash_attn_varlen_func", dropout_p=dropout_p, alibi_slopes=alibi_slopes, block_table=block_table)
    out, lse = _Flash.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, _scale(q, softmax_scale), causal, window_size,
        softcap, False,
    )  # fmt: skip
    return (out, lse, None) if return_attn_probs else out


def fa2_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """FA2 with keys and values stacked, (batch, seq, 2, heads_k, dim)."""
    k, v = kv.unbind(2)
    return fa2_func(q, k, v, *args, **kwargs)


def fa2_qkvpacked_func(qkv: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """FA2 with queries, keys and values stacked, (batch, seq, 3, heads, dim)."""
    q, k, v = qkv.unbind(2)
    return fa2_func(q, k, v, *args, **kwargs)


def fa2_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """FA2 packed, keys and values stacked, (total, 2, heads_k, dim)."""
    k, v = kv.unbind(1)
    return fa2_varlen_func(q, k, v, *args, **kwargs)


def fa2_varlen_qkvpacked_func(
    qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, *args: Any, **kwargs: Any
) -> Any:
    """FA2 packed, queries, keys and values stacked, (total, 3, heads, dim), one set of lengths."""
    q, k, v = qkv.unbind(1)
    return fa2_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, *args, **kwargs)


FA3: dict[str, Callable[..., Any]] = {
    "flash_attn_func": flash_attn_func,
    "flash_attn_varlen_func": flash_attn_varlen_func,
    "flash_attn_qkvpacked_func": flash_attn_qkvpacked_func,
    "flash_attn_with_kvcache": flash_attn_with_kvcache,
}
"""`flash_attn_interface`'s names (FA3)."""

FA2: dict[str, Callable[..., Any]] = {
    "flash_attn_func": fa2_func,
    "flash_attn_varlen_func": fa2_varlen_func,
    "flash_attn_kvpacked_func": fa2_kvpacked_func,
    "flash_attn_qkvpacked_func": fa2_qkvpacked_func,
    "flash_attn_varlen_kvpacked_func": fa2_varlen_kvpacked_func,
    "flash_attn_varlen_qkvpacked_func": fa2_varlen_qkvpacked_func,
    "flash_attn_with_kvcache": flash_attn_with_kvcache,
}
"""`flash_attn`'s and `flash_attn.flash_attn_interface`'s names (FA2)."""
