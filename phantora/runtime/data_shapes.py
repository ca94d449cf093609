"""Phantom mode's ops whose output shape depends on the data: `nonzero` (a boolean index `x[mask]`, one-argument
`torch.where`, `argwhere`), `masked_select`, `unique` and `unique_consecutive`, `repeat_interleave` with tensor
repeats, `bincount`.

Phantom tensors have no values, so these have no size. `PHANTORA_PHANTOM_SHAPES` says what to do:

- `error` (the default): a one-line `PhantomValueError` naming the program's call and the ways out (a fixed-size
  form of the op, a `phantora.runtime.phantom()` guard, real mode, or a size assumption);
- `upper`: assume the largest output (every element selected, every value distinct): the op's output has the
  input's element count, so the time of what follows is an upper bound;
- a fraction F in (0, 1] (`0.5`): assume ceil(F n) of the n elements selected (or distinct).

`repeat_interleave` and `bincount` have no upper bound (their sizes are sums and maxima of the values): they stop
whatever the setting, naming the fixed-size form (`output_size=`, `index_add_`). An index or `masked_select` whose
mask holds values (a copy of host data) is exact in every mode (simcuda/tensor.py, kept_values.py). The assumption is
recorded per rank (`assumed`: results.json's `phantom_shapes`) and named once in the run's summary.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from phantora.errors import InputError, PhantomValueError

VAR = "PHANTORA_PHANTOM_SHAPES"
_META = torch.device("meta")
_LONG = torch.int64
_MASKS = (torch.bool, torch.uint8)

_fraction: float | None = None  # None: stop (`error`); else the share of elements assumed selected or distinct
_setting = "error"
_sites: dict[str, str] = {}  # program site (`file:line (function)`) -> the op whose size was assumed there
_LIBRARY: torch.library.Library | None = None

_NONZERO_WAYS = (
    "a fixed-size form (`torch.where(mask, x, 0)`, `x.masked_fill(~mask, 0)`, `torch.nonzero_static(mask, size=N)`)"
)
_WHAT = {
    "nonzero": ("takes the nonzero elements of phantom data (a boolean index `x[mask]`, `nonzero`, one-argument "
                "`torch.where`, `argwhere`)", _NONZERO_WAYS),
    "masked_select": ("selects elements of phantom data by a phantom mask (`masked_select`)", _NONZERO_WAYS),
    "unique": ("takes the distinct values of phantom data (`unique`, `unique_consecutive`)", ""),
}  # fmt: skip


def setting(env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[str, float | None]:
    """`PHANTORA_PHANTOM_SHAPES` parsed: ('error', None), ('upper', 1.0) or (the fraction's text, F)."""
    raw = env.get(VAR, "").strip().lower() or "error"
    if raw == "error":
        return raw, None
    if raw == "upper":
        return raw, 1.0
    try:
        f = float(raw)
    except ValueError:
        f = math.nan
    if not 0.0 < f <= 1.0:
        raise InputError(f"{raw!r}: expected error, upper, or a fraction in (0, 1] such as 0.5", field=VAR)
    return raw, f


def assumed() -> dict[str, Any] | None:
    """This rank's size assumption and the program sites it was made at (results.json's `phantom_shapes`), or None
    if no op needed one."""
    if not _sites:
        return None
    return {"assumed": _setting, "sites": sorted(f"{site} {op}" for site, op in _sites.items())}


def _count(n: int, what: str) -> int:
    """The element count assumed for an output of up to `n` elements, or the error when no size is assumed."""
    if _fraction is None:
        raise _stop(what)
    from phantora.runtime.simcuda.kept_values import _caller

    site, name = _caller()
    _sites[f"{site} ({name})" if name else site] = what
    return n if _fraction >= 1.0 else min(n, math.ceil(_fraction * n))


def _stop(what: str, unbounded: str = "") -> Exception:
    from phantora.runtime.unsupported import program_call

    said, fixed = _WHAT.get(what, (what, ""))
    where = program_call() or "a call"
    if unbounded:
        return PhantomValueError(
            f"phantom mode: {where} {said}, whose output's size has no bound without the values; use {unbounded}, "
            "guard the code with `phantora.runtime.phantom()`, or run in real mode (without --phantom)"
        )
    fixed = f"use {fixed}, " if fixed else ""
    return PhantomValueError(
        f"phantom mode: {where} {said}, whose output's size depends on the values, which phantom tensors do not have; "
        f"{fixed}guard the code with `phantora.runtime.phantom()`, run in real mode (without --phantom), or assume a "
        f"size: {VAR}=upper (every element selected or distinct) or a fraction such as 0.5"
    )  # fmt: skip


def _empty(shape: tuple[int, ...] | torch.Size | list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=_META)


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    return _empty((_count(x.numel(), "nonzero"), x.dim()), _LONG)


def _masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = math.prod(torch.broadcast_shapes(x.shape, mask.shape))
    return _empty((_count(n, "masked_select"),), x.dtype)


def _flat_unique(x: torch.Tensor, inverse: bool, counts: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = _count(x.numel(), "unique")
    return _empty((m,), x.dtype), _empty(x.shape if inverse else (0,), _LONG), _empty((m,) if counts else (0,), _LONG)


def _unique_along(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = dim % max(x.dim(), 1)
    m = _count(x.shape[d], "unique")
    shape = list(x.shape)
    shape[d] = m
    return _empty(shape, x.dtype), _empty((x.shape[d],), _LONG), _empty((m,), _LONG)


def _unique2(x: torch.Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False) -> Any:
    return _flat_unique(x, return_inverse, return_counts)


def _unique(x: torch.Tensor, sorted: bool = True, return_inverse: bool = False) -> Any:
    return _flat_unique(x, return_inverse, False)[:2]


def _unique_dim(x: torch.Tensor, dim: int, sorted: bool = True, return_inverse: bool = False,
                return_counts: bool = False) -> Any:  # fmt: skip
    return _unique_along(x, dim)


def _unique_consecutive(x: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                        dim: int | None = None) -> Any:  # fmt: skip
    return _flat_unique(x, return_inverse, return_counts) if dim is None else _unique_along(x, dim)


def _unique_dim_consecutive(x: torch.Tensor, dim: int, return_inverse: bool = False,
                            return_counts: bool = False) -> Any:  # fmt: skip
    return _unique_along(x, dim)


def _repeat_interleave(repeats: torch.Tensor, output_size: int | None = None) -> torch.Tensor:
    if output_size is not None:
        return _empty((output_size,), _LONG)
    raise _stop("repeats by phantom counts (`repeat_interleave` with tensor repeats)",
                "`output_size=` (the total, which the program knows)")  # fmt: skip


def _bincount(x: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    raise _stop("counts phantom values (`bincount`: its length is the largest value + 1)",
                "a fixed length, `torch.zeros(n, dtype=torch.long, device=x.device).index_add_(0, x, "
                "torch.ones_like(x))`")  # fmt: skip


KERNELS = {
    "nonzero": _nonzero,
    "masked_select": _masked_select,
    "_unique2": _unique2,
    "_unique": _unique,
    "unique_dim": _unique_dim,
    "unique_consecutive": _unique_consecutive,
    "unique_dim_consecutive": _unique_dim_consecutive,
    "repeat_interleave.Tensor": _repeat_interleave,
    "bincount": _bincount,
}


OPS = frozenset(getattr(getattr(torch.ops.aten, n.split(".")[0]), (n.split(".") + ["default"])[1]) for n in KERNELS)


def enable() -> None:
    """Phantom mode: these ops' meta kernels (torch's raise, or there are none) assume a size or stop in one line
    (idempotent). A boolean index reaches `nonzero` through torch's own meta kernel of `index`."""
    global _LIBRARY, _setting, _fraction
    _setting, _fraction = setting()
    if _LIBRARY is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, kernel in KERNELS.items():
        lib.impl(name, kernel, "Meta")
    _LIBRARY = lib


def exact_mask_indices(indices: list[Any]) -> list[Any]:
    """A boolean index that holds values (a copy of host data) on phantom data: the long indices of its nonzero
    elements, as torch expands a mask (one index a mask dimension), on meta, so the index is exact; others as
    they are."""
    out: list[Any] = []
    for t in indices:
        elem = getattr(t, "elem", t)
        if isinstance(elem, torch.Tensor) and not elem.is_meta and elem.dtype in _MASKS and elem.dim():
            with torch.utils._python_dispatch._disable_current_modes():
                count = int(elem.count_nonzero())
            out.extend(_empty((count,), _LONG) for _ in range(elem.dim()))
        else:
            out.append(t)
    return out
