"""The kernels of the simulated FlashAttention packages (simflash.py): one forward and one backward op on the data.

``phantora_flash::fwd`` / ``bwd`` take FlashAttention's layout, dense (batch, seq, heads, dim) or packed (total,
heads, dim) with cumulative sequence lengths, and its arguments: softmax scale, causal (aligned to the bottom right),
a sliding window (left, right; -1 unbounded), a softcap, grouped key and value heads. On a simulated-GPU tensor
(`cuda_only.KERNELS`) they run on the data: a dense batch as packed sequences of one length, each sequence by
varlen.py's kernel (torch's CPU flash kernel with FlashAttention's masks); a softcap (scores c tanh(s / c)), which
that kernel has no argument for, by the scores written out in fp32 (forward; the backward is autograd's of them).
Outputs: the output in the query's layout and dtype, and the fp32 log-sum-exp, (batch, heads, seq) dense or
(heads, total) packed, as FlashAttention's; the backward's dq, dk, dv.

Each is charged as the compute model's flash kernel of the same shapes (varlen.py `cost`: a group of sequences of one
length as the batched ``_scaled_dot_product_flash_attention``, a window by the pairs it keeps). A forward with `fa3`
(FlashAttention 3's: simflash.py's ``flash_attn_3::fwd`` and `flash_attn_interface`'s functions) is charged by the
model's FA3 fit of FA3's published H100 forward figures (perfmodel/pubfit.py; elsewhere as the flash kernel); its
backward, of which none is published in FA3's repository, as FlashAttention 2's. A softcap's tanh is not charged
beyond it (a few elementwise operations per score, in registers).
"""

from __future__ import annotations

from typing import Any

import torch

from phantora.runtime.compute import OpCost
from phantora.runtime.simcuda import varlen

_LIB = torch.library.Library("phantora_flash", "DEF")
_LIB.define(
    "fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int? max_seqlen_q, "
    "int? max_seqlen_k, float? softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "bool fa3=False) -> (Tensor, Tensor)"
)
_LIB.define(
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, int? max_seqlen_q, int? max_seqlen_k, float? softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap) -> (Tensor, Tensor, Tensor)"
)
FORWARD: Any = torch.ops.phantora_flash.fwd.default
BACKWARD: Any = torch.ops.phantora_flash.bwd.default


def _packed(
    q: torch.Tensor, k: torch.Tensor, cu_q: Any, cu_k: Any, max_q: Any, max_k: Any
) -> tuple[Any, Any, int, int, bool]:
    """The packed view's sequence lengths: (cu_q, cu_k, max_q, max_k, dense). A dense batch is batch sequences of
    seq rows each, its cumulative lengths host values (known in phantom mode too)."""
    if q.dim() == 4:
        b, sq, sk = q.size(0), q.size(1), k.size(1)
        cum_q = torch.arange(0, b * sq + 1, sq, dtype=torch.int32)
        cum_k = torch.arange(0, b * sk + 1, sk, dtype=torch.int32)
        return cum_q, cum_k, sq, sk, True
    if cu_q is None or max_q is None:
        raise ValueError("flash attention of a 3-d (total, heads, dim) query needs cu_seqlens_q and max_seqlen_q")
    return cu_q, cu_k if cu_k is not None else cu_q, int(max_q), int(max_k if max_k is not None else max_q), False


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:]) if x.dim() == 4 else x


def _mode(causal: bool, left: int, right: int) -> tuple[bool, dict[str, int]]:
    """FlashAttention's mask as varlen.py's: (is_causal, window keywords). Causal is the window's right edge at 0,
    whatever `right` says, and a window (-1, 0) is the causal mask (no window)."""
    right = 0 if causal else right
    if right == 0:
        return True, {"window_size_left": left if left >= 0 else -1, "window_size_right": 0 if left >= 0 else -1}
    return False, {"window_size_left": left, "window_size_right": right}


def _dense_lse(lse: torch.Tensor, batch: int) -> torch.Tensor:
    """(heads, batch * seq) -> FlashAttention's dense (batch, heads, seq)."""
    return lse.unflatten(1, (batch, -1)).transpose(0, 1).contiguous()


def _packed_lse(lse: torch.Tensor) -> torch.Tensor:
    """FlashAttention's dense (batch, heads, seq) -> (heads, batch * seq)."""
    return lse.transpose(0, 1).reshape(lse.size(1), -1).contiguous()


def _scale(q: torch.Tensor, softmax_scale: float | None) -> float:
    return q.size(-1) ** -0.5 if softmax_scale is None else softmax_scale


def _masks(is_causal: bool, window: dict[str, int]) -> Any:
    """sq, sk -> one sequence's explicit additive mask (varlen.py's, bottom-right aligned), or None: no mask."""
    left, right = window["window_size_left"], 0 if is_causal else window["window_size_right"]
    return lambda sq, sk: varlen._mask(sq, sk, False, left, right, torch.float32)


def _softcapped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[tuple], scale: float, softcap: float, mask: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp of packed (rows, heads, dim) data with capped scores c tanh(s q k^T / c), in fp32,
    one sequence at a time (`mask(sq, sk)`: its additive mask or None). Differentiable (the backward's autograd)."""
    heads = q.size(1)
    outs, lses = [], []
    for (q0, q1), (k0, k1) in bounds:
        if q1 <= q0:
            continue
        qs, ks, vs = (varlen._heads(x.float(), heads)[0] for x in (q[q0:q1], k[k0:k1], v[k0:k1]))
        scores = softcap * torch.tanh(qs @ ks.transpose(-1, -2) * (scale / softcap))
        m = mask(q1 - q0, k1 - k0)
        if m is not None:
            scores = scores + m.float()
        lse = scores.logsumexp(-1)
        outs.append(((scores - lse.unsqueeze(-1)).exp() @ vs).transpose(0, 1))
        lses.append(lse)
    return torch.cat(outs).to(q.dtype), torch.cat(lses, dim=1)


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
    max_seqlen_k: Any, softmax_scale: float | None, causal: bool, window_left: int, window_right: int, softcap: float,
    fa3: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(out, softmax_lse) of FlashAttention's forward on the data (meta in phantom mode: the shapes); `fa3` changes
    only the charge."""
    cum_q, cum_k, max_q, max_k, dense = _packed(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    fq, fk, fv = _flat(q), _flat(k), _flat(v)
    is_causal, window = _mode(causal, window_left, window_right)
    if softcap > 0 and not q.is_meta:
        bounds = varlen._sequences(fq, fk, cum_q, cum_k, max_q, max_k)
        out, lse = _softcapped(fq, fk, fv, bounds, _scale(q, softmax_scale), softcap, _masks(is_causal, window))
    else:
        out, lse = varlen.forward(
            fq, fk, fv, cum_q, cum_k, max_q, max_k, 0.0, is_causal, False, scale=softmax_scale, **window
        )[:2]
    if dense:
        return out.reshape(*q.shape[:3], v.size(-1)), _dense_lse(lse, q.size(0))
    return out, lse


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, softmax_lse: torch.Tensor,
    cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any, max_seqlen_k: Any, softmax_scale: float | None,
    causal: bool, window_left: int, window_right: int, softcap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) of FlashAttention's backward on the data, each in its input's shape and dtype."""
    cum_q, cum_k, max_q, max_k, dense = _packed(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    fq, fk, fv, fo, fg = _flat(q), _flat(k), _flat(v), _flat(out), _flat(dout)
    lse = _packed_lse(softmax_lse) if dense else softmax_lse
    is_causal, window = _mode(causal, window_left, window_right)
    if softcap > 0 and not q.is_meta:
        bounds = varlen._sequences(fq, fk, cum_q, cum_k, max_q, max_k)
        with torch.enable_grad():
            leaves = [x.detach().float().requires_grad_() for x in (fq, fk, fv)]
            o, _ = _softcapped(
                leaves[0], leaves[1], leaves[2], bounds, _scale(q, softmax_scale), softcap, _masks(is_causal, window)
            )
            grads = torch.autograd.grad(o.float(), leaves, fg.float())
        dq, dk, dv = (g.to(x.dtype) for g, x in zip(grads, (fq, fk, fv), strict=True))
    else:
        rng, unused = torch.zeros(2, dtype=torch.uint64), torch.empty(0, dtype=q.dtype)
        if q.is_meta:
            rng, unused = rng.to("meta"), unused.to("meta")
        dq, dk, dv = varlen.backward(
            fg, fq, fk, fv, fo, lse, cum_q, cum_k, max_q, max_k, 0.0, is_causal, rng, unused, scale=softmax_scale,
            **window,
        )  # fmt: skip
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def cost(model: Any, func: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> OpCost:
    """The flash kernel's charge for the same shapes (varlen.py `cost` on the packed view)."""
    named = dict(zip([a.name for a in func._schema.arguments], args, strict=False)) | kwargs
    q, k = named["q"], named["k"]
    cum_q, cum_k, max_q, max_k, _dense = _packed(
        q, k, named["cu_seqlens_q"], named["cu_seqlens_k"], named["max_seqlen_q"], named["max_seqlen_k"]
    )
    is_causal, window = _mode(named["causal"], named["window_left"], named["window_right"])
    kw = {"scale": named["softmax_scale"], **window, "flash_kernel": "fa3" if named.get("fa3") else ""}
    flat = {name: _flat(named[name]) for name in ("q", "k", "v")}
    if func is FORWARD:
        forward_args = (flat["q"], flat["k"], flat["v"], cum_q, cum_k, max_q, max_k, 0.0, is_causal, False)
        return varlen.cost(model, varlen.FORWARD, forward_args, kw, out)
    rest = (_flat(named["dout"]), flat["q"], flat["k"], flat["v"], _flat(named["out"]), named["softmax_lse"])
    backward_args = (*rest, cum_q, cum_k, max_q, max_k, 0.0, is_causal, None, None)
    return varlen.cost(model, varlen.BACKWARD, backward_args, kw, out)


for _key in ("CPU", "Meta"):  # host (and meta) tensors: the same computation, uncharged (no simulated GPU)
    _LIB.impl("fwd", forward, _key)
    _LIB.impl("bwd", backward, _key)
