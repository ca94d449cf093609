"""Which ops the compiled mode entry (`_fastop.c`) answers itself that the Python route would answer the same way.

Two kinds, each decided once per operator and per tensor type and kept here for the C code to read:

- a CUDA program's host op (`HOST`): plain tensors once a cuda tensor exists, outside an op of the simulated GPU,
  no `device=` or `pin_memory=` keyword, the target host not modelled (`PHANTORA_HOST_COMPUTE` off): the Python
  route (`ChargeMode._general`, `_charged`, `pinned.host_op`) only runs it; not the pinning ops, not a functional
  collective's;
- an op with another subclass's tensors (`OTHER`, e.g. DTensor) and no fake or simulated-GPU ones: the Python route
  answers `NotImplemented` (the subclass then runs it on its local tensors); not a collective's, not inside the
  session's own work, not under a FakeTensorMode, no `device=` keyword, the target host not modelled.

The conditions on the session and the keywords are the C code's (checked per call); here only the operator's and
the type's. Both sets are open: an operator or type not yet seen is classified by `func_flags` / `type_kind`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

HOST = 1  # the operator may run directly as a CUDA program's host op
OTHER = 2  # with another subclass's tensors, the operator is answered NotImplemented

PLAIN_TYPE = 0  # torch.Tensor, Parameter, Buffer
OTHER_TYPE = 1  # a subclass with its own __torch_dispatch__ (not fake, not the simulated GPU's)
PYTHON_TYPE = 2  # anything else: the Python route decides

FUNCS: dict[int, tuple[Any, int]] = {}  # id(operator) -> (operator, flags): an OpOverload's hash runs Python
TYPES: dict[type, int] = {}  # tensor type -> its kind
# ChargeMode's `_general` and `_charged` as dispatch.py defines them (set there): replaced on the class (a test
# counting their calls), the quick routes are off
PYTHON_ROUTE: tuple[Any, ...] = ()


def _undecided(types: tuple[type, ...]) -> str:
    return "python"  # until dispatch.py sets its own: the Python route decides


# dispatch.py's plain tensor types and its subclass classifier (set there, so that this module imports no dispatch)
PLAIN: tuple[type, ...] = ()
SUBCLASS_KIND: Callable[[tuple[type, ...]], str] = _undecided


def func_flags(func: Any) -> int:
    """`HOST | OTHER` as they apply to operator `func` (kept in `FUNCS`)."""
    from phantora.runtime.simcuda import pinned

    flags = 0
    if type(func) is torch._ops.OpOverload:
        namespace = func.namespace
        if namespace != "_c10d_functional" and func is not pinned._IS_PINNED and func is not pinned._PIN:
            flags |= HOST
        if namespace not in ("_c10d_functional", "c10d"):
            flags |= OTHER
    FUNCS[id(func)] = (func, flags)
    return flags


def type_kind(t: type) -> int:
    """`PLAIN_TYPE`, `OTHER_TYPE` or `PYTHON_TYPE` for a tensor type in an op's `types` (kept in `TYPES`)."""
    from phantora.runtime.simcuda.tensor import SimCudaTensor

    if t in PLAIN:
        kind = PLAIN_TYPE
    elif isinstance(t, type) and not issubclass(t, SimCudaTensor) and SUBCLASS_KIND((t,)) == "other":
        kind = OTHER_TYPE
    else:
        kind = PYTHON_TYPE
    TYPES[t] = kind
    return kind
