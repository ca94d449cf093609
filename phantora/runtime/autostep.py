"""Steps of programs that do not mark them: each `optimizer.step()` of a CUDA program ends one.

A script written for phantora calls `phantora.runtime.step()` at the end of each iteration. An
unmodified CUDA program (torchtitan, Megatron-Core, a Trainer) does not, so its results would have
no per-step times. Once such a program has put a tensor on the simulated GPU, the end of the first
optimizer's `step()` (the first optimizer that steps; others, e.g. one per pipeline stage, do not
count) ends an iteration. A script that calls `phantora.runtime.step()` before any automatic step
keeps its own marks; after one, its calls are ignored (they would end empty steps).
"""

from __future__ import annotations

import weakref
from typing import Any

from phantora.runtime import session as _session
from phantora.runtime.simcuda.tensor import cuda_seen

_state: dict[str, Any] = {"explicit": False, "auto": 0, "optimizer": None, "installed": False}


def explicit_step() -> bool:
    """The script marks a step itself: True if that mark counts, False if automatic steps are in use."""
    if _state["auto"]:
        return False
    _state["explicit"] = True
    return True


def _after_optimizer_step(opt: Any, args: Any, kwargs: Any) -> None:
    s = _session.current()
    if s is None or _state["explicit"] or not cuda_seen():
        return
    first = _state["optimizer"]
    if first is None:
        _state["optimizer"] = weakref.ref(opt)
    elif first() is not opt:
        return
    _state["auto"] += 1
    s.step()


def install() -> None:
    """Register the optimizer hook (once per process)."""
    if _state["installed"]:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_optimizer_step)
    _state["installed"] = True
