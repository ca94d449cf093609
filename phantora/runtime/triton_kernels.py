"""Triton kernels on the simulated GPU: charged by an estimate, listed in results.json, run on the host.

A triton kernel launched from Python (`kernel[grid](...)`) goes to the GPU driver, not through
torch's dispatcher, so the compute model never sees it (and triton has no driver on a machine
without a GPU). Under the simulated device each launch is instead:

- charged a memory-bound estimate: its tensor arguments' bytes at the GPU's HBM bandwidth, plus the
  launch overhead (a kernel's FLOPs cannot be read from its arguments);
- listed in results.json's `untimed_kernels`, with that rule;
- in real mode, run by triton's interpreter on the tensors' host data, so the program's values are
  right; in phantom mode, not run (there are no values).

`triton.autotune` takes each kernel's first config without benchmarking: the estimate does not depend
on the config, and the benchmark's launches would all be charged to the simulated clock.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import torch

from phantora.runtime import session as _session
from phantora.runtime.compute import OpCost, tensors_in
from phantora.runtime.import_hooks import after_import
from phantora.runtime.simcuda import device as simcuda

ESTIMATE = "memory-bound estimate: its tensor arguments' bytes at HBM bandwidth, + launch (triton kernel)"


def install() -> None:
    after_import("triton.runtime.jit", _patch_launch)
    after_import("triton.runtime.autotuner", _patch_autotune)


def _patch_launch(jit: ModuleType) -> None:
    launch = jit.JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        s = _session.current()
        if warmup or s is None or not simcuda.active():
            return launch(self, *args, grid=grid, warmup=warmup, **kwargs)
        return _simulated_launch(s, self, args, grid, kwargs)

    jit.JITFunction.run = run


def _simulated_launch(s: Any, kernel: Any, args: tuple, grid: Any, kwargs: dict) -> None:
    name = f"triton::{kernel.fn.__name__}"
    nbytes = sum(t.numel() * t.element_size() for t in tensors_in((args, kwargs)))
    ns = math.ceil(nbytes / s.model.gpu.mem_bw * 1e9) + s.model.launch_ns
    s.charge_untimed(name, OpCost(0, nbytes, "", ns, "estimate"), ESTIMATE)
    if s.phantom:
        return None
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    host_args, host_kwargs = simcuda.unwrap(args), simcuda.unwrap(kwargs)
    call = JITFunction.__call__
    JITFunction.__call__ = _device_call  # the kernel's own @triton.jit helpers, interpreted with it
    try:
        with s.internal(), torch.no_grad():  # the interpreter's host copies are not GPU work
            InterpretedFunction(kernel.fn)[grid](*host_args, **host_kwargs)
    finally:
        JITFunction.__call__ = call
    return None


def _device_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A @triton.jit function called inside an interpreted kernel: interpreted too, as under TRITON_INTERPRET=1
    (where `triton.jit` makes every function an `InterpretedFunction`). Outside the interpreter torch's JITFunction
    refuses such a call ("Cannot call @triton.jit'd outside of the scope of a kernel"), and so the interpreter did."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(self.fn)(*args, **kwargs)


def _patch_autotune(autotuner: ModuleType) -> None:
    bench = autotuner.Autotuner._bench

    def first_config(self: Any, *args: Any, config: Any, **meta: Any) -> list[float]:
        if _session.current() is None or not simcuda.active():
            return bench(self, *args, config=config, **meta)
        # equal timings: the autotuner keeps the first config it tried
        return [float(self.configs.index(config)) if config in self.configs else 0.0] * 3

    autotuner.Autotuner._bench = first_config
