"""GPU specifications: phantora's one GPU table (dense peaks, per GPU; vendor data sheets).

The runtime's view (`phantora/runtime/gpus.py`: peak by short dtype name, memory, NVLink) is derived
from this table. BF16/FP16 tensor and FP32 peaks, memory bandwidth, memory and NVLink per direction
are ../shared/REFERENCE.md section 2. TF32 and FP8 are the dense (no sparsity) figures of the same
vendor data sheets: A100 TF32 156; H100/H200 SXM TF32 494.5, FP8 1979; B200 TF32 1100, FP8 4500;
L40S TF32 183, FP8 733 TFLOP/s. A100 has no FP8 tensor cores. FP64 is the non-tensor FP64 peak.

Tensor-core peaks are used for GEMMs and attention in bf16/fp16/fp8 (and tf32 when a caller asks
for it); fp32 GEMMs use the non-tensor FP32 peak, as PyTorch does by default
(`torch.backends.cuda.matmul.allow_tf32 = False`). Memory-bound ops use the DRAM bandwidth, the
L2 capacity and an L2 bandwidth that scales with SMs x clock. Values marked ~ are approximate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phantora.errors import InputError
from phantora.perfmodel.dtypes import normalize_dtype

TERA = 10**12
GIGA = 10**9
MIB = 2**20


@dataclass(frozen=True)
class GpuSpec:
    """Peaks of one GPU model. Rates in FLOP/s and bytes/s; `tensor_flops` maps a compute dtype to its peak."""

    name: str
    tensor_flops: dict[str, float]
    fp32_flops: float
    fp64_flops: float
    mem_bw: float
    mem_bytes: int
    l2_bytes: int
    sms: int
    clock_hz: float
    host_bw: float  # PCIe per direction
    aliases: tuple[str, ...] = field(default=())
    label: str = ""  # display name, e.g. "H100 SXM"
    nvlink_bw: float = 0.0  # per direction, bytes/s; 0 when the GPU has no NVLink
    capability: tuple[int, int] = (0, 0)  # CUDA compute capability (torch.cuda.get_device_capability)
    cuda_name: str = ""  # the name CUDA reports (torch.cuda.get_device_name)

    def matmul_peak(self, dtype: str, *, tf32: bool = False) -> float:
        """Peak FLOP/s of a matrix product whose inputs are `dtype` (canonical name)."""
        if dtype == "float32":
            return self.tensor_flops["tf32"] if tf32 else self.fp32_flops
        if dtype == "float64":
            return self.fp64_flops
        key = "fp8" if dtype.startswith("float8") else dtype
        if key not in self.tensor_flops:
            have = ", ".join(sorted(self.tensor_flops))
            raise InputError(f"{self.name} has no {dtype} tensor cores (it has: {have}, float32)", field="dtype")
        return self.tensor_flops[key]


def _tc(bf16: float, tf32: float, fp8: float | None) -> dict[str, float]:
    peaks = {"bfloat16": bf16 * TERA, "float16": bf16 * TERA, "tf32": tf32 * TERA}
    if fp8 is not None:
        peaks["fp8"] = fp8 * TERA
    return peaks


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            "a100",
            _tc(312, 156, None),
            19.5 * TERA,
            9.7 * TERA,
            2039 * GIGA,
            80 * 10**9,
            40 * MIB,
            108,
            1.410e9,
            32 * GIGA,
            ("a100-sxm", "a100-80gb", "a100-sxm4-80gb"),
            label="A100 SXM 80GB",
            capability=(8, 0),
            cuda_name="NVIDIA A100-SXM4-80GB",
            nvlink_bw=300 * GIGA,
        ),
        GpuSpec(
            "h100",
            _tc(989, 494.5, 1979),
            67 * TERA,
            34 * TERA,
            3350 * GIGA,
            80 * 10**9,
            50 * MIB,
            132,
            1.980e9,
            64 * GIGA,
            ("h100-sxm", "h100-sxm5"),
            label="H100 SXM",
            capability=(9, 0),
            cuda_name="NVIDIA H100 80GB HBM3",
            nvlink_bw=450 * GIGA,
        ),
        GpuSpec(
            "h200",
            _tc(989, 494.5, 1979),
            67 * TERA,
            34 * TERA,
            4800 * GIGA,
            141 * 10**9,
            50 * MIB,
            132,
            1.980e9,
            64 * GIGA,
            ("h200-sxm",),
            label="H200 SXM",
            capability=(9, 0),
            cuda_name="NVIDIA H200",
            nvlink_bw=450 * GIGA,
        ),
        GpuSpec(
            "b200",  # ~: bf16 2250, fp8 4500, tf32 1100 dense; L2 ~126 MB; 148 SMs at ~1.98 GHz
            _tc(2250, 1100, 4500),
            80 * TERA,
            37 * TERA,
            8000 * GIGA,
            192 * 10**9,
            126 * MIB,
            148,
            1.980e9,
            64 * GIGA,
            ("b200-sxm",),
            label="B200",
            capability=(10, 0),
            cuda_name="NVIDIA B200",
            nvlink_bw=900 * GIGA,
        ),
        GpuSpec(
            "l40s",  # fp64 ~1/64 of fp32 (Ada); PCIe Gen4 x16
            _tc(362, 183, 733),
            91.6 * TERA,
            1.43 * TERA,
            864 * GIGA,
            48 * 10**9,
            96 * MIB,
            142,
            2.520e9,
            32 * GIGA,
            ("l40s-pcie",),
            label="L40S (PCIe)",
            capability=(8, 9),
            cuda_name="NVIDIA L40S",
        ),
    )
}


def get_gpu(name: str | GpuSpec) -> GpuSpec:
    """Look a GPU up by name or alias (case-insensitive). Raises InputError naming the known GPUs."""
    if isinstance(name, GpuSpec):
        return name
    key = _squash(name)
    for g in GPUS.values():
        if key == g.name or key in {_squash(a) for a in (*g.aliases, g.label)}:
            return g
    raise InputError(f"unknown GPU {name!r} (known: {', '.join(GPUS)})", field="gpu")


def _squash(name: str) -> str:
    """'H100 SXM', 'h100-sxm', 'H100_SXM' -> 'h100sxm'."""
    return "".join(c for c in str(name).strip().lower() if c not in "-_ ()")


def check_dtype(gpu: GpuSpec, dtype: str) -> str:
    """Normalise `dtype` and check the GPU can run matrix products in it."""
    d = normalize_dtype(dtype)
    gpu.matmul_peak(d)
    return d
