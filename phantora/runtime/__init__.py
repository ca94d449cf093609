"""Live training under phantora: the `phantora` torch.distributed backend, virtual clocks, compute model.

In a script started by `phantora run`:

    import phantora.runtime as pr
    pr.report_workload(tokens_per_step=..., flops_per_step=...)  # optional: tokens/s and MFU
    for it in range(steps):
        ...forward, backward, optimizer...
        pr.step()            # end of an iteration; returns its simulated duration (ns)
    pr.now()                 # this rank's simulated time (ns)
    pr.max_memory_allocated()  # peak simulated device bytes (also pr.memory_allocated())
    with pr.traffic_class(1): dist.all_reduce(t)      # its flows in class 1 (issue 17; docs/collectives.md)
    with pr.loss_tolerant(0.01): dist.all_reduce(g)   # DLCP: up to 1% may be dropped, received as zeros
                                                      # (all-reduce and reduce-scatter, ring)

Outside a phantora run, `step` and `report_workload` do nothing and `now` is the real clock, so the
same script also runs under torchrun. The rank bootstrap of `phantora run` registers the `phantora`
torch.distributed backend before the script starts (`register_backend()` does it by hand). This
package itself imports no torch, so the launcher stays light.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any


def _current() -> Any:
    mod = sys.modules.get("phantora.runtime.session")  # loaded only inside a phantora rank
    return None if mod is None else mod.current()


def register_backend() -> None:
    """Register the `phantora` torch.distributed backend (the rank bootstrap already does)."""
    from phantora.runtime.backend import register

    register()


def active() -> bool:
    """True inside a phantora run."""
    return _current() is not None


def now() -> int:
    """This rank's simulated time in ns (the compute lane); the real clock outside a run."""
    s = _current()
    if s is None:
        return time.perf_counter_ns()
    return s.now()


def phantom() -> bool:
    """True when this rank runs in phantom mode (meta tensors: shapes without values; see phantom_mode)."""
    s = _current()
    return bool(s is not None and s.phantom)


def deferred_init() -> Any:
    """A context for building a model that is sharded before it trains (as with meta-device init).

    Build and shard inside (`fully_shard`, `parallelize_module`): tensors created inside count as
    simulated device memory only if they are still alive when it ends (the shards), as with meta
    init followed by `to_empty`. Outside a phantora run it does nothing.
    """
    s = _current()
    return contextlib.nullcontext() if s is None else s.memory.paused()


def step() -> int:
    """Mark the end of a training iteration: join every lane; return the step's simulated ns.

    In a CUDA program that phantora already steps at each optimizer step (runtime/autostep.py),
    this does nothing and returns the last step's duration."""
    s = _current()
    if s is None:
        return 0
    from phantora.runtime import autostep

    if not autostep.explicit_step():
        ends = s.step_ends
        return ends[-1] - (ends[-2] if len(ends) > 1 else 0) if ends else 0
    return s.step()


def memory_allocated() -> int:
    """Simulated device bytes allocated now on this rank (like torch.cuda.memory_allocated); 0 outside a run."""
    s = _current()
    return 0 if s is None else s.memory.current


def max_memory_allocated() -> int:
    """Peak simulated device bytes on this rank so far (like torch.cuda.max_memory_allocated); 0 outside a run."""
    s = _current()
    return 0 if s is None else s.memory.peak


@contextlib.contextmanager
def traffic_class(cls: int) -> Iterator[None]:
    """Collectives issued inside get traffic class `cls` (1..7; 1 is served first with `--set sched=strict`),
    over the run's `--set priority` policy. Outside a phantora run it does nothing."""
    if not 1 <= int(cls) <= 7:
        raise ValueError(f"traffic class must be 1..7 (0 is the control class), got {cls}")
    s = _current()
    with _pushed(None if s is None else s.traffic.class_override, int(cls)):
        yield


@contextlib.contextmanager
def loss_tolerant(bound: float = 0.01) -> Iterator[None]:
    """All-reduces and reduce-scatters issued inside are loss-tolerant (DLCP): the packet network may drop up to
    `bound` of each one's bytes under congestion, and this rank then receives zeros there (real mode). `bound=0`
    makes them lossless (over `--set dlcp`). Ring algorithm only; anything else stays lossless, and cosim.json
    says why (`kept_lossless`). Outside a phantora run: nothing."""
    if not 0.0 <= float(bound) <= 1.0:
        raise ValueError(f"loss bound must be a share in [0, 1], got {bound}")
    s = _current()
    with _pushed(None if s is None else s.traffic.loss_override, float(bound)):
        yield


@contextlib.contextmanager
def _pushed(stack: list[Any] | None, value: Any) -> Iterator[None]:
    """`value` on top of `stack` for the block (no stack outside a phantora run: nothing)."""
    if stack is None:
        yield
        return
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


def report_workload(
    tokens_per_step: int | None = None, flops_per_step: float | None = None, dtype: str | None = None
) -> None:
    """Tell phantora the job's work per iteration, summed over all ranks (any rank may call it).

    `tokens_per_step`: tokens the whole job processes per iteration (tokens/s per GPU divides it
    by the world size); `flops_per_step`: model FLOPs of one iteration for the whole job (MFU);
    `dtype`: the peak MFU is measured against (default: the dtype of most counted matmul FLOPs).
    """
    s = _current()
    if s is None:
        return
    fields: dict[str, Any] = {"tokens_per_step": tokens_per_step, "flops_per_step": flops_per_step, "dtype": dtype}
    s.workload.update({k: v for k, v in fields.items() if v is not None})


__all__ = [
    "deferred_init",
    "phantom",
    "active",
    "max_memory_allocated",
    "memory_allocated",
    "now",
    "register_backend",
    "loss_tolerant",
    "report_workload",
    "step",
    "traffic_class",
]
