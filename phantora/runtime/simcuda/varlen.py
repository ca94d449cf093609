"""Variable-length (packed) flash attention on the simulated GPU: ``aten._flash_attention_forward`` and its backward.

`torch.nn.attention.varlen.varlen_attn` (torchtitan's `VarlenAttention`, its document-masked configs such as
`llama3_debugmodel_varlen_attn` and `gpt_oss_debugmodel`) packs a batch's sequences into (total, heads, dim) and
calls FlashAttention's varlen kernel with the cumulative sequence lengths `cum_seq_q` / `cum_seq_k`: each sequence
attends to itself only. torch has that op for CUDA (and meta) only. On a simulated-GPU tensor it runs here on the
data, one sequence at a time, as the CPU flash kernel (`_scaled_dot_product_flash_attention_for_cpu` and its
backward; grouped-query key and value heads repeated for it, their gradients summed back), with the CUDA op's
outputs: the output (total_q, heads, dim_v), the fp32 log-sum-exp (heads, total_q), the Philox state (2,) and two
empty tensors. A window (`window_size_left` / `right`, -1 unbounded) or sequences of unequal query and key lengths
take an explicit mask, aligned to the bottom right as FlashAttention's causal mask is.

The kernel is one launch over every sequence's tiles. It is charged as the compute model's batched flash kernel
(`_scaled_dot_product_flash_attention` on (batch, heads, seq, dim), and its backward) of each group of sequences that
share their lengths, summed, with one launch (`cost`): causal as the model counts an SDPA's causal pairs, a sliding
window as the pairs it keeps (perfmodel/features.py `window_pairs`): the calibrated model times those pairs, and the
FLOPs are the same kernel's without the window scaled by the pairs kept over the pairs it would keep (W / C, so a
window wider than the sequence costs what the causal kernel does); the bytes are the kernel's (every query, key and
value is read once, every output written). In phantom mode the sequence lengths are values the data may not have:
unknown lengths are taken as `max_q` each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from phantora.perfmodel.features import window_pairs
from phantora.runtime.compute import OpCost, kept_flops
from phantora.runtime.simcuda import attention

aten = torch.ops.aten
FORWARD = aten._flash_attention_forward.default
BACKWARD = aten._flash_attention_backward.default
_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _bounds(cum: torch.Tensor | None, total: int, longest: int) -> list[tuple[int, int]]:
    """Each sequence's [start, end) in the packed rows: from `cum`'s values, else (no values: phantom data, or no
    `cum`) consecutive sequences of `longest` rows."""
    if cum is not None and not cum.is_meta:
        edges = [int(v) for v in cum.tolist()]
        return list(zip(edges[:-1], edges[1:], strict=True))
    step = max(int(longest), 1)
    return [(i, min(i + step, total)) for i in range(0, total, step)]


def _mask(
    sq: int, sk: int, is_causal: bool, left: int | None, right: int | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """One sequence's additive mask for the CPU kernel (0 kept, -inf masked, in the query's dtype), aligned to the
    bottom right as FlashAttention's; None when the kernel's own `is_causal` (a square causal sequence) or no mask
    does it. `left` / `right`: keys before / after a query's diagonal it may see, -1 or None unbounded (causal:
    `right` 0)."""
    left = -1 if left is None else left
    right = -1 if right is None else right
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    if left < 0 and (right < 0 or (is_causal and right == 0 and sq == sk)):
        return None
    row = torch.arange(sq).unsqueeze(1) + (sk - sq)  # each query's diagonal key
    col = torch.arange(sk).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        keep &= col <= row + right
    if left >= 0:
        keep &= col >= row - left
    return torch.zeros(sq, sk, dtype=dtype).masked_fill(~keep, float("-inf"))


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """(rows, heads, dim) -> (1, n, rows, dim), each of the tensor's heads repeated for n / heads query heads."""
    if x.size(1) != n:
        x = x.repeat_interleave(n // x.size(1), dim=1)
    return x.transpose(0, 1).unsqueeze(0)


def _sequences(query: Any, key: Any, cum_seq_q: Any, cum_seq_k: Any, max_q: int, max_k: int) -> list[tuple]:
    bq = _bounds(cum_seq_q, query.size(0), max_q)
    bk = _bounds(cum_seq_k if cum_seq_k is not None else cum_seq_q, key.size(0), max_k)
    return list(zip(bq, bk, strict=True))


def forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    return_debug_mask: bool,
    *,
    scale: float | None = None,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
    **unused: Any,
) -> tuple[torch.Tensor, ...]:
    """The op's five outputs, each sequence computed by the CPU flash kernel (meta data: the op's meta kernel)."""
    if query.is_meta:
        metas = [None if x is None else x.to("meta") for x in (query, key, value, cum_seq_q, cum_seq_k)]
        windows = {"window_size_left": window_size_left, "window_size_right": window_size_right}
        return FORWARD(*metas, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale=scale, **windows)
    if cum_seq_q is None:
        return _four_d(query, key, value, is_causal, scale)
    heads = query.size(1)
    out = query.new_zeros(query.size(0), heads, value.size(2))
    lse = torch.full((heads, query.size(0)), float("-inf"), dtype=torch.float32)
    for (q0, q1), (k0, k1) in _sequences(query, key, cum_seq_q, cum_seq_k, max_q, max_k):
        if q1 <= q0 or k1 <= k0:
            continue
        mask = _mask(q1 - q0, k1 - k0, is_causal, window_size_left, window_size_right, query.dtype)
        q, k, v = _heads(query[q0:q1], heads), _heads(key[k0:k1], heads), _heads(value[k0:k1], heads)
        o, m = _CPU_FLASH(q, k, v, 0.0, is_causal and mask is None, attn_mask=mask, scale=scale)
        out[q0:q1] = o[0].transpose(0, 1)
        lse[:, q0:q1] = m[0]
    rng = torch.zeros(2, dtype=torch.uint64)
    return out, lse, rng, torch.empty((), dtype=torch.uint64), torch.empty(0, dtype=query.dtype)


def _four_d(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool, scale: float | None
) -> tuple[torch.Tensor, ...]:
    """No sequence lengths: a (batch, seq, heads, dim) batch, as the CPU flash kernel's (batch, heads, seq, dim)."""
    t = [x.transpose(1, 2) for x in (query, key, value)]
    heads = query.size(2)
    if t[1].size(1) != heads:
        t[1], t[2] = (x.repeat_interleave(heads // x.size(1), dim=1) for x in t[1:])
    o, lse = _CPU_FLASH(t[0], t[1], t[2], 0.0, is_causal, scale=scale)
    rng = torch.zeros(2, dtype=torch.uint64)
    return o.transpose(1, 2), lse, rng, torch.empty((), dtype=torch.uint64), torch.empty(0, dtype=query.dtype)


def backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: torch.Tensor,
    cum_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    rng_state: torch.Tensor,
    unused: torch.Tensor,
    *,
    scale: float | None = None,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of query, key and value, each sequence's by the CPU flash kernel's backward (a grouped key or
    value head's gradient summed over its query heads)."""
    if query.is_meta:
        metas = [x.to("meta") for x in (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k)]
        windows = {"window_size_left": window_size_left, "window_size_right": window_size_right}
        rest = (max_q, max_k, dropout_p, is_causal, rng_state.to("meta"), unused.to("meta"))
        return BACKWARD(*metas, *rest, scale=scale, **windows)
    heads, kv_heads = query.size(1), key.size(1)
    dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    for (q0, q1), (k0, k1) in _sequences(query, key, cum_seq_q, cum_seq_k, max_q, max_k):
        if q1 <= q0 or k1 <= k0:
            continue
        mask = _mask(q1 - q0, k1 - k0, is_causal, window_size_left, window_size_right, query.dtype)
        rows = [_heads(x[q0:q1], heads) for x in (grad_out, query)]
        cols = [_heads(x[k0:k1], heads) for x in (key, value)]
        lse = logsumexp[:, q0:q1].unsqueeze(0).contiguous()
        o = _heads(out[q0:q1], heads)
        g = _CPU_FLASH_BACKWARD(*rows, *cols, o, lse, 0.0, is_causal and mask is None, attn_mask=mask, scale=scale)
        dq[q0:q1] = g[0][0].transpose(0, 1)
        for grad, dest in ((g[1], dk), (g[2], dv)):
            per_head = grad[0].transpose(0, 1)  # (rows, heads, dim)
            if kv_heads != heads:
                per_head = per_head.unflatten(1, (kv_heads, heads // kv_heads)).sum(2)
            dest[k0:k1] = per_head
    return dq, dk, dv


def cost(model: Any, func: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> OpCost:
    """The op's charge: the compute model's batched flash kernel for each group of sequences of the same (query,
    key) lengths, summed, with one launch. `args` are the op's own (the data: CPU tensors, or meta)."""
    query, key = args[1:3] if func is BACKWARD else args[0:2]
    kernel = _kernel(func, kwargs)
    if query.dim() != 3:  # no sequence lengths: already the batched kernel
        return model.cost(func, args, {k: v for k, v in kwargs.items() if k != "flash_kernel"} | kernel, out)
    cum_q, cum_k, max_q, max_k = args[6:10] if func is BACKWARD else args[3:7]
    groups = Counter((q1 - q0, k1 - k0) for (q0, q1), (k0, k1) in _sequences(query, key, cum_q, cum_k, max_q, max_k))
    window = _active_window(kwargs)
    # FlashAttention's causal mask is the window (-1, 0): torch's varlen_attn passes is_causal=False with a window of
    # right 0 (torchtitan's gpt_oss: (127, 0)), a causal kernel whose window may bind
    causal = bool(args[11] if func is BACKWARD else args[8]) or window.get("window_size_right") == 0
    flops = nbytes = ns = 0
    dtype, tier = "", "roofline"
    for (sq, sk), n in sorted(groups.items()):
        if sq <= 0 or sk <= 0:
            continue
        op, a, kw = _batched(func, args, kwargs, n, sq, sk)
        c = model.cost(op, a, {**kw, **window, **kernel}, None)
        f = c.flops
        if window:  # the kernel's FLOPs without the window, times the share of its pairs the window keeps
            kept = window_pairs(sq, sk, causal, window["window_size_left"], window["window_size_right"])
            f = kept_flops(f, kept, window_pairs(sq, sk, causal, -1, -1))
        flops, nbytes, ns = flops + f, nbytes + c.nbytes, ns + c.ns - model.launch_ns
        dtype, tier = c.dtype or dtype, c.tier
    return OpCost(flops, nbytes, dtype, ns + model.launch_ns if ns or flops else 0, tier)


def _kernel(func: Any, kwargs: dict[str, Any]) -> dict[str, str]:
    """The model's keyword marking a forward as FlashAttention 3's ({"flash_kernel": "fa3"}), else {}: as the caller
    says (flash_kernels.py: "fa3" or ""), else FA3 when torch's FA3 implementation is active, which on a real GPU
    runs this op as FA3's kernel (torch.nn.attention's `activate_flash_attention_impl("FA3")`, torchtitan's on SM
    9.0). A backward is FlashAttention 2's either way (FA3's repository publishes no backward figures)."""
    if func is not FORWARD:
        return {}
    kernel = kwargs["flash_kernel"] if "flash_kernel" in kwargs else "fa3" if _torch_fa3_active() else ""
    if kernel != "fa3":
        return {}
    _charged["fa3"] = True
    return {"flash_kernel": "fa3"}


_charged = {"fa3": False}


def charged_as_fa3() -> bool:
    """Has a forward been charged as FlashAttention 3's (simflash.py: FA3's package then counts as used)?"""
    return _charged["fa3"]


def _torch_fa3_active() -> bool:
    """Is torch's FlashAttention 3 implementation the active one (torch.nn.attention's registry)?"""
    try:
        from torch.nn.attention import current_flash_attention_impl
    except ImportError:  # a torch without the registry
        return False
    return current_flash_attention_impl() == "FA3"


def _active_window(kwargs: dict[str, Any]) -> dict[str, int]:
    """The op's sliding window as keywords for the compute model, if one side is bounded (>= 0), else {}."""
    left, right = kwargs.get("window_size_left"), kwargs.get("window_size_right")
    if (left is None or left < 0) and (right is None or right < 0):
        return {}
    return {"window_size_left": -1 if left is None else left, "window_size_right": -1 if right is None else right}


def _batched(func: Any, args: tuple, kwargs: dict[str, Any], n: int, sq: int, sk: int) -> tuple[Any, tuple, dict]:
    """The batched flash kernel of n sequences of sq queries and sk keys as the compute model knows it,
    ``_scaled_dot_product_flash_attention`` (or its backward) on (n, heads, seq, dim): the op, meta arguments and
    keywords. Grouped key and value heads are counted as the query's (their FLOPs; their reads a little over)."""
    kw = {"scale": kwargs.get("scale")}
    q = args[1] if func is BACKWARD else args[0]
    heads = q.size(1)

    def meta(x: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.empty(n, heads, rows, x.size(2), dtype=x.dtype, device="meta")

    if func is FORWARD:
        query, key, value, dropout, causal = args[0], args[1], args[2], args[7], args[8]
        return attention.FLASH, (meta(query, sq), meta(key, sk), meta(value, sk), dropout, causal, False), kw
    grad, query, key, value, out = args[0:5]
    lse = torch.empty(n, heads, sq, dtype=torch.float32, device="meta")
    seed = torch.empty(2, dtype=torch.uint64, device="meta")
    offset = torch.empty((), dtype=torch.uint64, device="meta")
    shapes = (meta(grad, sq), meta(query, sq), meta(key, sk), meta(value, sk), meta(out, sq), lse)
    return attention.FLASH_BACKWARD, (*shapes, None, None, sq, sk, args[10], args[11], seed, offset), kw


def _windows(window_size: Any) -> dict[str, Any]:
    left, right = (-1, -1) if window_size is None else window_size
    return {"window_size_left": left, "window_size_right": right}


def _op_forward(
    query: Any, key: Any, value: Any, cu_seq_q: Any, cu_seq_k: Any, max_q: int, max_k: int, is_causal: bool = False,
    scale: float | None = None, window_size: Any = None, *_: Any, **__: Any,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """``torch_attn::_varlen_attn`` (what `varlen_attn` calls): its FlashAttention call, on the data."""
    out, lse, rng, _unused, _mask = forward(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, 0.0, is_causal, False, scale=scale, **_windows(window_size)
    )
    return out, lse, rng


def _op_backward(
    grad_out: Any, query: Any, key: Any, value: Any, out: Any, lse: Any, cu_seq_q: Any, cu_seq_k: Any, max_q: int,
    max_k: int, is_causal: bool, rng_state: Any, scale: float | None = None, window_size: Any = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """``torch_attn::_varlen_attn_backward``: its FlashAttention backward call, on the data."""
    unused = torch.empty(0, device=query.device)
    left, right = _windows(window_size).values()
    return backward(
        grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, 0.0, is_causal, rng_state, unused,
        scale=scale, window_size_left=left, window_size_right=right,
    )  # fmt: skip


def _op_cost(custom: Any) -> Callable[..., OpCost]:
    """The charge of the custom op `custom`: the FlashAttention call it makes (`cost`)."""
    names = [a.name for a in custom._schema.arguments]
    backward_op = custom.name().endswith("_backward")

    def charge(model: Any, func: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> OpCost:
        named = dict(zip(names, args, strict=False)) | kwargs
        kw = {"scale": named.get("scale"), **_windows(named.get("window_size"))}
        keys: tuple[str, ...]
        if backward_op:
            keys = ("grad_out", "query", "key", "value", "out", "lse", "cu_seq_q", "cu_seq_k", "max_q", "max_k")
            flat = (*(named[k] for k in keys), 0.0, named["is_causal"], named["rng_state"], None)
            return cost(model, BACKWARD, flat, kw, out)
        keys = ("query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k")
        return cost(model, FORWARD, (*(named[k] for k in keys), 0.0, named.get("is_causal", False), False), kw, out)

    return charge


try:  # torch's public varlen_attn (torch 2.10+) wraps the FlashAttention calls in custom ops of its own
    import torch.nn.attention.varlen  # registers torch_attn::_varlen_attn

    TORCH_FORWARD: Any = torch.ops.torch_attn._varlen_attn.default
    TORCH_BACKWARD: Any = torch.ops.torch_attn._varlen_attn_backward.default
except (ImportError, AttributeError):  # pragma: no cover - an older torch
    TORCH_FORWARD = TORCH_BACKWARD = None

CUSTOM_OPS: dict[Any, tuple[Any, Any, Any]] = (
    {
        TORCH_FORWARD: (FORWARD, _op_forward, _op_cost(TORCH_FORWARD)),
        TORCH_BACKWARD: (BACKWARD, _op_backward, _op_cost(TORCH_BACKWARD)),
    }
    if TORCH_FORWARD
    else {}
)
"""torch's custom ops around the FlashAttention calls: the aten op each is charged as, and its kernel on the data.
A custom op on simulated-GPU tensors runs its own implementation on their data, whose FlashAttention call would
then meet CPU tensors; these run the call here instead, and charge it (`_op_cost`)."""
