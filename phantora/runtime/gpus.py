"""The runtime's view of the GPU table: peak FLOP/s by short dtype name, bandwidth, memory, NVLink.

Derived from `phantora.perfmodel.gpus` (the one GPU table; figures from ../shared/REFERENCE.md
section 2 and the vendor data sheets, dense, no sparsity), so the roofline, the calibrated model
and the MFU figures all use the same peaks. Keys of `peak_flops`: bf16, fp16 (tensor cores), fp32
(non-tensor), tf32 (tensor cores, used for fp32 matmuls when a script enables TF32), fp8 (tensor
cores; only GPUs that have them: not A100).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phantora.perfmodel import gpus as _table


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: peaks in FLOP/s by dtype name, bandwidths in bytes/s, memory in bytes."""

    name: str
    peak_flops: dict[str, float] = field(repr=False)
    mem_bw: float
    memory: int
    nvlink_bw: float  # per direction; 0 when the GPU has no NVLink
    key: str = ""  # short name in phantora.perfmodel.gpus.GPUS, e.g. "h100"

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a compute dtype ('bf16', 'fp16', 'fp32', 'tf32', 'fp8'); fp64 maps to fp32.

        A GPU without fp8 tensor cores gets its bf16 rate for fp8 (and int8)."""
        key = {"fp64": "fp32", "int8": "fp8", "uint8": "fp8"}.get(dtype, dtype)
        if key not in self.peak_flops:
            key = "bf16" if key == "fp8" else "fp32"
        return self.peak_flops[key]

    @property
    def spec(self) -> _table.GpuSpec:
        """The full entry of the GPU table (L2, SMs, clock, PCIe ...), as the calibrated model uses it."""
        return _table.GPUS[self.key]


def _runtime_view(g: _table.GpuSpec) -> GpuSpec:
    tc = g.tensor_flops
    peaks = {"bf16": tc["bfloat16"], "fp16": tc["float16"], "fp32": g.fp32_flops, "tf32": tc["tf32"]}
    if "fp8" in tc:
        peaks["fp8"] = tc["fp8"]
    return GpuSpec(g.label or g.name, peaks, g.mem_bw, g.mem_bytes, g.nvlink_bw, g.name)


GPUS: dict[str, GpuSpec] = {name: _runtime_view(g) for name, g in _table.GPUS.items()}


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by short name or alias (case-insensitive), e.g. 'h100', 'H100 SXM'; InputError if unknown."""
    return GPUS[_table.get_gpu(name).name]
