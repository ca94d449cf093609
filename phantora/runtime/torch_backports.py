"""Newer torch APIs that the pinned framework releases call, given to the pinned torch (2.13).

torchtitan 0.3.0 is written against a torch newer than 2.13: its pipeline-parallel step passes the
micro-batches it split itself (`schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)`), which
torch 2.13's `step` would take for model keyword arguments. The same run fails on a real GPU with
torch 2.13. This module gives `step` those three arguments, as newer torch has them; a torch that has
them already is left alone. Nothing here changes what is simulated.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any

from phantora.runtime.import_hooks import after_import

_MICROBATCH_ARGS = ("arg_mbs", "kwarg_mbs", "target_mbs")


def install() -> None:
    after_import("torch.distributed.pipelining.schedules", _give_step_microbatches)


def _give_step_microbatches(schedules: ModuleType) -> None:
    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        if "arg_mbs" not in inspect.signature(cls.step).parameters:
            cls.step = _step_with_microbatches(cls.step)


def _step_with_microbatches(step: Any) -> Any:
    """`step(arg_mbs=, kwarg_mbs=, target_mbs=)`: run the schedule on micro-batches already split."""

    @functools.wraps(step)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = {k: kwargs.pop(k) for k in _MICROBATCH_ARGS if k in kwargs}
        if not given:
            return step(self, *args, **kwargs)
        if args or kwargs.get("target") is not None:
            raise TypeError("schedule.step: pass either whole-batch inputs or arg_mbs/kwarg_mbs/target_mbs")
        inner = self._step_microbatches

        def on_given(_args: Any, _kwargs: Any, _targets: Any, *rest: Any, **more: Any) -> Any:
            # step() split no inputs (it got none); the micro-batches are the caller's
            return inner(given.get("arg_mbs"), given.get("kwarg_mbs"), given.get("target_mbs"), *rest, **more)

        self._step_microbatches = on_given
        try:
            return step(self, **kwargs)
        finally:
            del self._step_microbatches

    return wrapper
