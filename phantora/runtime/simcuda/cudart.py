"""`torch.cuda.cudart()`, the CUDA runtime calls torch's Python makes, answered for the simulated GPU.

This torch build has no CUDA runtime, so `torch.cuda.cudart()` returned None and a program that calls through it
stopped with an AttributeError: DCP's pinned-memory stager (`torch.cuda._pin_memory_utils.pin_memory`, torchtitan's
`--checkpoint.async_mode async_with_pinned_mem`) registers host memory with `cudaHostRegister`, and
`torch.cuda.profiler.start()` calls `cudaProfilerStart`. Here they succeed and change nothing: registered host
memory is plain host memory (as `pinned.py` keeps a pinned allocation), and there is no CUDA profiler to start.
`cudaMemGetInfo` answers as `torch.cuda.mem_get_info` does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any


class CudaError(enum.IntEnum):
    """The CUDA runtime's error codes that these calls return (torch reads `_cudart.cudaError.success`)."""

    success = 0


class SimCudart:
    """The runtime module `torch.cuda.cudart()` returns: each call succeeds (`CudaError.success`)."""

    cudaError = CudaError  # noqa: N815 - the runtime module's name

    def __init__(self, mem_get_info: Callable[[Any], tuple[int, int]]) -> None:
        self._mem_get_info = mem_get_info

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> CudaError:  # noqa: N802 - CUDA's name
        """Page-lock host memory: plain host memory here, so nothing to do."""
        return CudaError.success

    def cudaHostUnregister(self, ptr: int) -> CudaError:  # noqa: N802
        return CudaError.success

    def cudaProfilerStart(self) -> CudaError:  # noqa: N802
        """No CUDA profiler to start (phantora's own trace.json has the kernels)."""
        return CudaError.success

    def cudaProfilerStop(self) -> CudaError:  # noqa: N802
        return CudaError.success

    def cudaMemGetInfo(self, device: Any) -> tuple[int, int]:  # noqa: N802
        """(free, total) bytes of the simulated device, as `torch.cuda.mem_get_info`."""
        return self._mem_get_info(device)

    def cudaGetErrorString(self, code: Any) -> str:  # noqa: N802
        return "no error" if int(code) == 0 else f"cudaError {int(code)}"
