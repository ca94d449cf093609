"""Steps of programs that do not mark them: each `optimizer.step()` of a CUDA program ends one.

A script written for phantora calls `phantora.runtime.step()` at the end of each iteration. An
unmodified CUDA program (torchtitan, Megatron-Core, a Trainer) does not, so its results would have
no per-step times. Once such a program has put a tensor on the simulated GPU, the end of the first
optimizer's `step()` (the first optimizer that steps; others, e.g. one per pipeline stage, do not
count) ends an iteration. A script that calls `phantora.runtime.step()` before any automatic step
keeps its own marks; after one, its calls are ignored (they would end empty steps).

A program with no optimizer (a pipeline run forward and backward only, as torch's pipelining tutorial does)
still has a natural boundary: its pipeline schedule's `step()` (`torch.distributed.pipelining`), which runs one
iteration's micro-batches. The first schedule to step owns the marks (another, e.g. for validation, does not
count). Its mark is held, not made: it is made when that schedule steps again, or when the script ends, unless an
optimizer stepped in between, which then owns the steps from that iteration on. So a program with both
(torchtitan's pipeline: the schedule's `step()`, then the optimizer's) is stepped by its optimizer alone, as
before, and a program without one gets a step per iteration, each ending where the next one starts. (A profiler's
`step()` is not a mark: it is called at an iteration's end or at its start, as the program likes, so a held mark
made at its next call would end a step an iteration late.)

DeepSpeed's ZeRO-1/2/3 optimizers step the optimizer they wrap once per parameter group (stage 1-2) or sub-group
(stage 3), swapping its `param_groups` for each: HF Trainer's two groups (with and without weight decay) made two
steps an iteration. The optimizer steps inside DeepSpeed's engine taking its model step (`_take_model_step`, which
both its engine and its pipeline engine call once an iteration): there the optimizer's steps make one mark, at its
end.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from phantora.runtime import import_hooks
from phantora.runtime import session as _session
from phantora.runtime.simcuda.tensor import cuda_seen

_state: dict[str, Any] = {
    "explicit": False,
    "auto": 0,
    "optimizer": None,
    "installed": False,
    "owner": None,  # weakref to the first pipeline schedule that stepped, if no optimizer has
    "held": False,  # the schedule's last step ended an iteration whose mark is not made yet
    "depth": 0,  # nested calls of a schedule's step (a subclass calling its base's step)
    "model_step": 0,  # inside DeepSpeed's model step (its optimizer may step once per parameter group)
    "stepped": False,  # the first optimizer stepped inside it: one mark at its end
}


def explicit_step() -> bool:
    """The script marks a step itself: True if that mark counts, False if automatic steps are in use."""
    if _state["auto"]:
        return False
    _state["explicit"] = True
    _state["held"] = False
    return True


def _after_optimizer_step(opt: Any, args: Any, kwargs: Any) -> None:
    s = _session.current()
    if s is None or _state["explicit"] or not cuda_seen():
        return
    first = _state["optimizer"]
    if first is None:
        _state["optimizer"] = weakref.ref(opt)
        _state["held"] = False  # the optimizer's step ends the iteration the held mark stood for
    elif first() is not opt:
        return
    if _state["model_step"]:
        _state["stepped"] = True
        return
    _state["auto"] += 1
    s.step()


def _one_mark(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap DeepSpeed's `_take_model_step`: the first optimizer's steps inside it make one mark, at its end."""

    @functools.wraps(original)
    def take_model_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        _state["model_step"] += 1
        try:
            out = original(self, *args, **kwargs)
        finally:
            _state["model_step"] -= 1
        if not _state["model_step"] and _state["stepped"]:
            _state["stepped"] = False
            s = _session.current()
            if s is not None:
                _state["auto"] += 1
                s.step()
        return out

    return take_model_step


def _patch_deepspeed(module: ModuleType) -> None:
    engine = module.DeepSpeedEngine
    engine._take_model_step = _one_mark(engine._take_model_step)


def _make_held() -> None:
    """Make the held mark of the schedule's last step, now."""
    if not _state["held"]:
        return
    _state["held"] = False
    s = _session.current()
    if s is None or _state["explicit"] or _state["optimizer"] is not None:
        return
    _state["auto"] += 1
    s.step()


def _owns(obj: Any) -> bool:
    """Schedule `obj` marks steps: the first schedule to step, while no optimizer has (nor the script)."""
    if _state["explicit"] or _state["optimizer"] is not None or _session.current() is None or not cuda_seen():
        return False
    owner = _state["owner"]
    if owner is None:
        _state["owner"] = weakref.ref(obj)
        return True
    return owner() is obj


def boundary(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a schedule's `step`: it makes the held mark of its last call, runs the iteration, then holds one."""

    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = _state["depth"] == 0
        if outer and _owns(self):
            _make_held()
        _state["depth"] += 1
        try:
            out = original(self, *args, **kwargs)
        finally:
            _state["depth"] -= 1
        if outer and _owns(self):
            _state["held"] = True
        return out

    step._phantora_boundary = True  # type: ignore[attr-defined]
    return step


def _wrap_step(cls: Any) -> None:
    if not getattr(cls.step, "_phantora_boundary", False):
        cls.step = boundary(cls.step)


def _patch_schedules(module: ModuleType) -> None:
    """Every torch pipeline schedule's `step()` (the two bases define it; the schedules inherit it)."""
    _wrap_step(module.PipelineScheduleSingle)
    _wrap_step(module.PipelineScheduleMulti)


def finish() -> None:
    """The script ended: make a held mark (its last iteration's step ends here)."""
    try:
        _make_held()
    except _session.StepLimitReached:  # the job's last step: it ends here anyway
        pass


def install() -> None:
    """Register the optimizer hook and the schedules' patch, applied when the program imports them (once)."""
    if _state["installed"]:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_optimizer_step)
    import_hooks.after_import("torch.distributed.pipelining.schedules", _patch_schedules)
    import_hooks.after_import("deepspeed.runtime.engine", _patch_deepspeed)
    _state["installed"] = True
