"""torch's symmetric memory (`torch.distributed._symmetric_memory`) on the simulated GPU: said not simulated.

Symmetric memory is a buffer each GPU of a group maps from its peers, which kernels of the program's own (async TP's
fused matmuls, a custom all-to-all such as torchtitan's MinimalAsyncEP) read and write across NVLink: no model of it
here. This CPU build of torch has no symmetric-memory backend, so `get_backend` of a cuda device answered None, and a
program that checks it stopped with its own error as if the GPU had none ("requires the symmetric-memory CUDA
backend, got None"), and `empty` with torch's "SymmetricMemory MemPool did not find backend for device type cuda".
Here `get_backend` of a cuda device answers "CUDA", as a CUDA build does by default, and `empty` on a cuda device
and `rendezvous` of a cuda tensor stop the run with phantora's one line naming the call.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch

from phantora.runtime import import_hooks
from phantora.runtime.simcuda.devices import NotSimulatedError

MODULE = "torch.distributed._symmetric_memory"
WHY = "GPU buffers mapped by a group's peers, and the kernels that read and write them, have no model"


def install() -> None:
    """Patch the module when the program imports it (torch imports it only when asked)."""
    import_hooks.after_import(MODULE, _patch)


def _is_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _patch(module: ModuleType) -> None:
    get_backend, empty = module.get_backend, module.empty

    @functools.wraps(get_backend)
    def sim_get_backend(device: Any) -> str | None:
        return "CUDA" if _is_cuda(device) else get_backend(device)

    @functools.wraps(empty)
    def sim_empty(*size: Any, dtype: Any = None, device: Any = None) -> torch.Tensor:
        target = device if device is not None else torch.get_default_device()
        if _is_cuda(target):
            raise NotSimulatedError(f"{MODULE}.empty on a GPU is not simulated by phantora: {WHY}")
        return empty(*size, dtype=dtype, device=device)

    rendezvous = module.rendezvous

    @functools.wraps(rendezvous)
    def sim_rendezvous(tensor: torch.Tensor, group: Any) -> Any:
        if _is_cuda(tensor.device):
            raise NotSimulatedError(f"{MODULE}.rendezvous of a GPU tensor is not simulated by phantora: {WHY}")
        return rendezvous(tensor, group)

    module.get_backend = sim_get_backend  # type: ignore[attr-defined]
    module.empty = sim_empty  # type: ignore[attr-defined]
    module.rendezvous = sim_rendezvous  # type: ignore[attr-defined]
