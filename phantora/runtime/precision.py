"""The fp32 matmul precision (TF32 or not), read from torch once per change instead of once per op.

An op's cost depends on it (an fp32 op's FLOPs run at the TF32 peak unless the precision is "highest"), so it is
part of the compute model's cache key (compute.cache_key, simcuda/fastpath.py). torch's getter,
`torch._C._get_float32_matmul_precision`, costs about a thousand instructions (a hash-table lookup and a new
string), more than a tenth of what the rest of an op's bookkeeping costs. So the value is cached here, and every
setter torch has for it (`torch._C._set_*` of a precision, TF32 or reduced-precision flag, which
`torch.set_float32_matmul_precision`, `torch.backends.cuda.matmul.allow_tf32`, `...fp32_precision` and the
`flags()` contexts all call) is wrapped, on import, so that a call drops the cached value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from phantora.perfmodel.torch_adapter import fp32_matmul_precision as _get

value: str | None = None  # the cached precision; None: read torch's at the next use


def _is_setter(name: str) -> bool:
    return name.startswith("_set_") and any(word in name for word in ("precision", "tf32", "fp32"))


def matmul_precision() -> str:
    """`torch.get_float32_matmul_precision()`, cached until a setter is called."""
    global value
    v = value
    if v is None:
        v = value = _get()
    return v


def _dropping(setter: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(setter)
    def set_and_drop(*args: Any, **kwargs: Any) -> Any:
        global value
        try:
            return setter(*args, **kwargs)
        finally:
            value = None

    set_and_drop._phantora_drops_precision = True  # type: ignore[attr-defined]
    return set_and_drop


def _install() -> None:
    """Wrap torch's precision setters (once per process)."""
    for name in dir(torch._C):
        fn = getattr(torch._C, name)
        if _is_setter(name) and callable(fn) and not getattr(fn, "_phantora_drops_precision", False):
            setattr(torch._C, name, _dropping(fn))


_install()
