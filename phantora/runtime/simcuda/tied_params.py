"""Tied parameters stay tied when a phantom module moves to the simulated GPU, as they do on a real one.

GPT-2's output layer shares its weight with the token embedding (`wte.weight = lm_head.weight`). torch's
`Module._apply` (what `module.to("cuda")` runs) moves a parameter in place (`param.data = moved`) when the
two tensor types allow it, which keeps the tie: one Parameter object in both modules. In phantom mode a
host parameter is a meta tensor standing for a host one, and torch will not set a meta tensor's data to a
simulated-GPU tensor, so `_apply` gives each module a new Parameter of its own: the tie broke, and the
program trained two copies (nanoGPT's 124M model had 163M parameters: a second vocabulary-sized AdamW update
and gradient all-reduce). `keep_ties` wraps `Module._apply`: the outermost call notes which (module, name)
slots hold one parameter and, after the move, puts the first slot's parameter back into the others where
the real run would have moved it in place: phantom mode, a meta parameter now on the simulated GPU.

Everywhere else torch's own result stands (real mode, moves to the host or to meta), and so does a tie that
torch breaks on real hardware too: `to_empty` (a module built on the meta device: each module gets an empty
Parameter of its own, and the program must tie again). A phantom program that calls `to_empty` on a module
built on the host, rare, keeps the tie on a real GPU but not here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_state = threading.local()
_patched = False
Slots = list[tuple[torch.nn.Module, str]]


def _slots(module: torch.nn.Module) -> list[Slots]:
    """The (module, name) slots of every meta parameter held by more than one slot."""
    owners: dict[int, Slots] = {}
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None and p.is_meta:
                owners.setdefault(id(p), []).append((m, name))
    return [slots for slots in owners.values() if len(slots) > 1]


def _retie(groups: list[Slots]) -> None:
    """Put each group's first slot's parameter back into its other slots if it moved to the simulated GPU."""
    for (first, first_name), *rest in groups:
        p = first._parameters[first_name]
        if p is None or p.device.type != "cuda":
            continue
        for m, name in rest:
            if m._parameters[name] is not p:
                m._parameters[name] = p


def keep_ties() -> None:
    """Wrap `torch.nn.Module._apply` (and `to_empty`, which torch lets break ties) as the module says (idempotent).
    Phantom mode's `enable` calls it: elsewhere torch's own result stands."""
    global _patched
    if _patched:
        return
    original: Callable[..., Any] = torch.nn.Module._apply
    original_to_empty: Callable[..., Any] = torch.nn.Module.to_empty

    def _apply(self: torch.nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if getattr(_state, "inner", False):  # a child's call
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

    def to_empty(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        inner = getattr(_state, "inner", False)
        _state.inner = True  # torch breaks ties here on real hardware too
        try:
            return original_to_empty(self, *args, **kwargs)
        finally:
            _state.inner = inner

    torch.nn.Module._apply = _apply  # type: ignore[method-assign]
    torch.nn.Module.to_empty = to_empty  # type: ignore[method-assign]
    _patched = True
