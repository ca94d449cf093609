"""GPU table: dense peak FLOP/s per dtype, memory bandwidth and capacity (REFERENCE.md §2).

bf16/fp16, fp32, memory bandwidth, memory and NVLink come from REFERENCE.md §2. The tf32 and fp8
columns are the dense figures of the same vendor data sheets (half and twice the bf16 peak), used
when a script enables TF32 matmuls or computes in fp8.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phantora.errors import InputError

TERA = 10**12


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: peaks in FLOP/s by dtype name, bandwidths in bytes/s, memory in bytes."""

    name: str
    peak_flops: dict[str, float] = field(repr=False)
    mem_bw: float
    memory: int
    nvlink_bw: float  # per direction; 0 when the GPU has no NVLink

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a compute dtype ('bf16', 'fp16', 'fp32', 'tf32', 'fp8'); fp64 maps to fp32."""
        key = {"fp64": "fp32", "int8": "fp8", "uint8": "fp8"}.get(dtype, dtype)
        if key not in self.peak_flops:
            key = "bf16" if key == "fp8" else "fp32"
        return self.peak_flops[key]


def _spec(name: str, bf16: float, fp32: float, mem_tbs: float, mem_gb: int, nvlink_gbs: float, fp8: bool) -> GpuSpec:
    peaks = {"bf16": bf16 * TERA, "fp16": bf16 * TERA, "fp32": fp32 * TERA, "tf32": bf16 / 2 * TERA}
    if fp8:
        peaks["fp8"] = 2 * bf16 * TERA
    return GpuSpec(name, peaks, mem_tbs * TERA, mem_gb * 10**9, nvlink_gbs * 10**9)


GPUS: dict[str, GpuSpec] = {
    "a100": _spec("A100 SXM 80GB", 312, 19.5, 2.04, 80, 300, fp8=False),
    "h100": _spec("H100 SXM", 989, 67, 3.35, 80, 450, fp8=True),
    "h200": _spec("H200 SXM", 989, 67, 4.8, 141, 450, fp8=True),
    "b200": _spec("B200", 2250, 80, 8.0, 192, 900, fp8=True),
    "l40s": _spec("L40S (PCIe)", 362, 91.6, 0.864, 48, 0, fp8=True),
}


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by short name (case-insensitive), e.g. 'h100'."""
    key = str(name).strip().lower().replace("-", "").replace(" ", "")
    for alias, real in (("a100sxm", "a100"), ("h100sxm", "h100"), ("h200sxm", "h200")):
        if key == alias:
            key = real
    if key not in GPUS:
        raise InputError(f"unknown GPU {name!r} (known: {', '.join(GPUS)})", field="gpu")
    return GPUS[key]
