"""Phantom mode on the simulated GPU: the ops whose outputs keep values, and the MoE routing it assumes.

In phantom mode device tensors are meta (shapes only), except integer data that holds values: copied from the
host (token ids), or received through the value channel (tensor_values.py). An op whose inputs all hold values
runs on them; one that mixes phantom data in runs on meta (tensor.run_op), and if it writes into a tensor with
values that tensor becomes phantom (`_phantom_writes`): never a stale value. Programs also compute index data on the
device from phantom data and read it: an MoE router takes the top-k of its phantom scores, counts each expert's
tokens and sizes its all-to-all (torchtitan) or its permutation (Megatron-Core) with them. So, explicitly:

- the routing is assumed balanced: a router's `topk` of phantom scores gives its indices WITH values, row r's j-th
  choice being expert (r k + j) mod E, the round robin of torchtitan's `--debug.moe_force_load_balance`
  (Megatron's `--moe-router-force-load-balancing` draws a random balanced one): every expert gets T k / E of T
  tokens. Its values (the scores) stay phantom. A router's top-k is one along the last dimension (the experts)
  called from an MoE module (`router_site`); any other top-k of phantom data (a sampler's over a vocabulary,
  Megatron's capacity top-k over tokens) keeps phantom indices, so reading them stops in one line. results.json's
  `moe_routing` records the routing (`routing`) and `moe_routing_sites` every top-k site of phantom scores: which
  took the balanced rule and which stayed phantom (`sites`). Group-limited routing (a router function named for
  groups: Megatron's `group_limited_topk`, torchtitan's `_get_node_limited_routing_scores`): its group top-k is
  balanced over the groups, and the final top-k picks each token's k experts within its chosen groups, balanced
  over each group's experts (grouped_routing.py);
- integer and boolean factories (zeros, ones, full, arange, ..., and the `_like` / `new_` forms) have values;
- a floating-point fill (`torch.zeros_like(logits)`) stays phantom but remembers its fill until it is written to
  (its version counter), so that its cast to integers (`.int()`, Megatron's routing map) has values;
- `masked_select` of phantom data by a mask with values is phantom, of the mask's count of elements.

Only tensors of at most `NUMEL` elements get values (index data, not a model's activations): a factory's larger
output is phantom, and so is an op's on tensors with values whose output would be larger (`too_large`, tensor.run_op;
the per-op fast paths leave such ops to it in phantom mode).
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from phantora.runtime.simcuda import grouped_routing

NUMEL = 1 << 22  # elements: a batch's routing indices (tokens x top-k), never a model's data
ROUTING = "balanced"
_CPU = torch.device("cpu")
_META = torch.device("meta")
aten = torch.ops.aten

_routed = False  # has a top-k of phantom scores been given the balanced routing on this rank?
# kind -> site -> its function's qualname; "limited": final top-k sites of group-limited routing (grouped_routing.py)
_sites: dict[str, dict[str, str]] = {"balanced": {}, "phantom": {}, "limited": {}}
# a caller is an MoE router if its module's path (last 3 parts) or its function's qualname says so
_ROUTER = re.compile(r"moe|rout(er|ing)|expert", re.IGNORECASE)
# ... or names a gate as a word (DeepSeek-V3's reference `Gate`, `MoEGate`, `TopKGate`), not "aggregate" or "Gated"
_GATE = re.compile(r"Gate(?![a-z])|(?<![A-Za-z])gate(?![a-z])")
_GROUPED = re.compile(r"group|limited", re.IGNORECASE)  # a router function that limits a token's expert groups
_SKIP = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules[__name__.split(".")[0]]) if m.__file__ is not None
)


def routing() -> str | None:
    """The routing this rank assumed (results.json's `moe_routing`), or None if no top-k needed one."""
    return ROUTING if _routed else None


def sites() -> dict[str, list[str]] | None:
    """Each top-k site of phantom scores on this rank (`file:line (function)`, results.json's `moe_routing_sites`):
    "balanced" (a router's: the balanced rule), "phantom" (not a router's: indices left phantom), "grouped"
    (routers' sites whose function limits a token's groups) and "limited" (final top-k sites that chose within
    each token's groups, grouped_routing.py); None if there was none."""
    if not any(_sites.values()):
        return None
    out = {kind: sorted(found) for kind, found in _sites.items() if found}
    grouped = sorted(s for s, name in _sites["balanced"].items() if _GROUPED.search(name))
    return {**out, "grouped": grouped} if grouped else out


def _caller() -> tuple[str, str]:
    """The site (`file:line`, its last 3 path parts) and qualname of the nearest caller outside torch and
    phantora: the program's (or framework's) line that called top-k."""
    f: FrameType | None = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_SKIP):
        f = f.f_back
    if f is None:
        return "?", ""
    parts = f.f_code.co_filename.replace(os.sep, "/").split("/")[-3:]
    return f"{'/'.join(parts)}:{f.f_lineno}", f.f_code.co_qualname


def router_site(scores: torch.Tensor, dim: int) -> str | None:
    """The site of this top-k (`file:line (function)`) if it is an MoE router's (along the last dimension, the
    experts, called from a module or function named for MoE, routing, experts or a gate), else None; every site is
    recorded (`sites`)."""
    site, name = _caller()
    last = dim % max(scores.dim(), 1) == max(scores.dim(), 1) - 1
    said = f"{site.rsplit(':', 1)[0]} {name}"
    router = last and (_ROUTER.search(said) is not None or _GATE.search(said) is not None)
    key = f"{site} ({name})"
    _sites["balanced" if router else "phantom"][key] = name
    return key if router else None


def balanced(shape: torch.Size | tuple[int, ...], k: int, dim: int = -1) -> torch.Tensor:
    """The top-k indices of balanced routing for scores of `shape` (experts along `dim`): row r's j-th choice
    is expert (r k + j) mod E (rows: the other dimensions in order), distinct within a row while k <= E."""
    dim = dim % len(shape)
    experts = shape[dim]
    rest = [n for i, n in enumerate(shape) if i != dim]
    flat = torch.arange(math.prod(rest) * k, dtype=torch.int64) % max(experts, 1)
    return flat.reshape(*rest, k).movedim(-1, dim).contiguous()


def _index_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def keeps(t: torch.Tensor) -> bool:
    """Would this (meta) output hold values: integers or booleans of at most `NUMEL` elements?"""
    return _index_dtype(t.dtype) and t.numel() <= NUMEL


def too_large(func: Any, args: tuple, kwargs: dict) -> bool:
    """Would `func` on tensors that hold values output more than `NUMEL` elements, and more than its largest input?
    Such an output is no index data: a mask over a whole attention matrix broadcast from two index vectors
    (FlexAttention's `create_block_mask`), which a GPU holds in its memory and the host would have to. It runs
    phantom then (on meta, as `args` / `kwargs` are here). Data that came with values (a host copy) keeps them
    through ops that do not grow it; an op whose output shape depends on its values (`nonzero`) cannot run on meta:
    it keeps them."""
    inputs = [t.numel() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    with torch.utils._python_dispatch._disable_current_modes():
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError):
            return False
    limit = max(NUMEL, *inputs)
    return any(type(t) is torch.Tensor and t.numel() > limit for t in tree_flatten(out)[0])


def _topk(args: tuple, kwargs: dict, out: Any) -> Any:
    """A router's `topk` of phantom scores: the balanced indices (the scores stay phantom); others' stay phantom."""
    global _routed
    values, indices = out
    if not indices.is_meta or indices.numel() > NUMEL:
        return out
    k = args[1] if len(args) > 1 else kwargs["k"]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    site = router_site(args[0], dim)
    if site is None:
        return out
    _routed = True
    shape = args[0].shape
    ids = grouped_routing.take(shape, k)  # the final top-k of group-limited routing: within the chosen groups
    if ids is not None:
        _sites["limited"][site] = _sites["balanced"][site]
    else:
        ids = balanced(shape, k, dim)
        if _GROUPED.search(_sites["balanced"][site]):  # a group top-k (or a top-k inside a group): its choice
            grouped_routing.remember(shape, ids)
    return values, ids.to(indices.dtype)


_FILLS: dict[Any, Callable[[tuple, dict], Any]] = {
    aten.zeros_like.default: lambda a, k: 0,
    aten.ones_like.default: lambda a, k: 1,
    aten.full_like.default: lambda a, k: a[1] if len(a) > 1 else k["fill_value"],
    aten.new_zeros.default: lambda a, k: 0,
    aten.new_ones.default: lambda a, k: 1,
    aten.new_full.default: lambda a, k: a[2] if len(a) > 2 else k["fill_value"],
}
# factories given a cuda device (dispatch.ChargeMode): made on the host when their output keeps values
FACTORIES = frozenset(
    {
        aten.zeros.default,
        aten.ones.default,
        aten.full.default,
        aten.scalar_tensor.default,
        aten.arange.default,
        aten.arange.start,
        aten.arange.start_step,
        aten.range.default,
        aten.eye.default,
        aten.eye.m,
        *_FILLS,
    }
)
TO_COPY = aten._to_copy.default
MASKED_SELECT = aten.masked_select.default
TOPK = aten.topk.default
OPS = frozenset({TOPK, MASKED_SELECT, TO_COPY, *_FILLS})  # tensor.run_op looks at these in phantom mode


def casts_to_index(kwargs: dict) -> bool:
    """Does this `_to_copy` cast to integers or booleans (the only casts `after` looks at)?"""
    dtype = kwargs.get("dtype")
    return dtype is not None and _index_dtype(dtype)


def _version(t: Any) -> int | None:
    """`t`'s version counter (bumped by every write into it or a view of it); None for an inference tensor."""
    try:
        return int(t._version)
    except RuntimeError:  # inference mode's tensors keep no version counter
        return None


def _fill(t: Any) -> Any:
    """The fill of a phantom wrapper made by a fill op and not written to since, else None."""
    mark = getattr(t, "_phantora_fill", None)
    if mark is None or mark[1] is None or mark[1] != _version(t):
        return None
    return mark[0]


def after(func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """An op of `OPS` in phantom mode (its `out` as computed, on meta if any input was phantom): its output with
    values where they are known."""
    if func is TOPK:
        return _topk(args, kwargs, out)
    if type(out) is not torch.Tensor or not out.is_meta:
        return out
    fill = _FILLS.get(func)
    if fill is not None:
        return torch.full(out.shape, fill(args, kwargs), dtype=out.dtype, device=_CPU) if keeps(out) else out
    if func is TO_COPY:
        value = _fill(args[0])
        return out if value is None or not keeps(out) else torch.full(out.shape, value, dtype=out.dtype, device=_CPU)
    return out


def mark_fill(func: Any, args: tuple, kwargs: dict, wrapper: Any) -> None:
    """A phantom floating-point fill remembers its value until written to (its version counter)."""
    fill = _FILLS.get(func)
    if fill is not None and wrapper.elem.is_meta:
        wrapper._phantora_fill = (fill(args, kwargs), _version(wrapper))


def masked_select_as_gather(data: torch.Tensor, mask: torch.Tensor) -> tuple[Any, tuple, dict] | None:
    """`masked_select` of phantom data by a mask with values, whose output size torch's meta kernel cannot know:
    the same gather as an `index_select` of the mask's count of elements (broadcast over the data's shape), on
    meta. None if the mask is phantom too (torch's own error then)."""
    if mask.is_meta or not data.is_meta:
        return None
    with torch.utils._python_dispatch._disable_current_modes():
        shape = torch.broadcast_shapes(data.shape, mask.shape)
        count = int(mask.expand(shape).sum())
        flat = data.to(_META).expand(shape).reshape(-1)
        return aten.index_select.default, (flat, 0, torch.empty(count, dtype=torch.int64, device=_META)), {}


def on_host(func: Any, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype of this factory's output if, given a cuda device in phantom mode, it has values (dispatch.ChargeMode
    then makes it on the host, with that dtype: `torch.full(n, 7)` infers it), else None."""
    if func not in FACTORIES:
        return None
    dtype = kwargs.get("dtype")
    if dtype is not None and not _index_dtype(dtype):  # a floating-point factory: no need to probe
        return None
    with torch.utils._python_dispatch._disable_current_modes():
        plain = tuple(getattr(x, "elem", x) for x in args)
        probe = func(*plain, **{**kwargs, "device": _META})
    return probe.dtype if type(probe) is torch.Tensor and keeps(probe) else None


_WRITES: dict[Any, tuple[tuple[int, ...], tuple[str, ...]]] = {}


def written(func: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The positions and names of the arguments `func` writes into (from its schema), cached per op."""
    known = _WRITES.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        arguments = schema.arguments if schema is not None else []
        pos = tuple(i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write)
        known = _WRITES[func] = (pos, tuple(arguments[i].name for i in pos))
    return known
