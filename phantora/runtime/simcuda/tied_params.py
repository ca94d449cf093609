"""Tied parameters stay tied when a module moves to the simulated GPU.

GPT-2's output layer shares its weight with the token embedding (`wte.weight = lm_head.weight`). torch's
`Module._apply` (what `module.to("cuda")` runs) moves a parameter in place (`param.data = moved`) when the
two tensor types allow it, which keeps the tie: one Parameter object in both modules. In phantom mode a
host parameter is a meta tensor, and torch will not set a meta tensor's data to a simulated-GPU tensor, so
`_apply` gives each module a new Parameter of its own: the tie broke, and the program trained two copies
(nanoGPT's 124M model had 163M parameters: a second vocabulary-sized AdamW update and gradient all-reduce).
`keep_ties` wraps `Module._apply`: the outermost call notes which (module, name) slots hold one parameter
and, after the move, puts the first slot's parameter back into the others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_state = threading.local()
_patched = False


def _slots(module: torch.nn.Module) -> list[list[tuple[torch.nn.Module, str]]]:
    """The (module, name) slots of every parameter held by more than one slot."""
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((m, name))
    return [slots for slots in owners.values() if len(slots) > 1]


def _retie(groups: list[list[tuple[torch.nn.Module, str]]]) -> None:
    for (first, first_name), *rest in groups:
        p = first._parameters[first_name]
        for m, name in rest:
            if m._parameters[name] is not p:
                m._parameters[name] = p


def keep_ties() -> None:
    """Wrap `torch.nn.Module._apply` so tied parameters stay one object (idempotent)."""
    global _patched
    if _patched:
        return
    original: Callable[..., Any] = torch.nn.Module._apply

    def _apply(self: torch.nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if getattr(_state, "inner", False):  # a child's call inside the outermost one
            return original(self, fn, *args, **kwargs)
        groups = _slots(self)
        _state.inner = True
        try:
            out = original(self, fn, *args, **kwargs)
        finally:
            _state.inner = False
        if groups:
            _retie(groups)
        return out

    torch.nn.Module._apply = _apply  # type: ignore[method-assign]
    _patched = True
