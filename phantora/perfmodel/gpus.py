"""GPU specifications: phantora's one GPU table (dense peaks, per GPU; vendor data sheets).

One `GpuSpec` per GPU serves every user: the calibrated model (`matmul_peak`, L2, SMs, clocks), the runtime's
roofline and MFU figures (`peak` by short dtype name), the simulated CUDA device and the NCCL model.
Every figure is the vendor data sheet's dense (no sparsity) figure; docs/gpus.md lists each GPU with its source.
The A100, H100 SXM, H200, B200 and L40S BF16/FP16 tensor and FP32 peaks, memory bandwidth, memory and NVLink are
../shared/REFERENCE.md section 2.

GPUs are deployed as variants of one die (`chip`): the same SMs at another power limit, memory or
form factor. `power_w` is the board power limit; `tensor_clock_hz` is the clock the data sheet's
tensor peak implies (peak / (SMs x tensor FLOP per SM per clock)), the clock the part sustains under
its power limit in a dense matrix product. The one part without a data sheet, the 500 W H100 with
96 GB HBM2e of Meta's Grand Teton hosts (torchtitan's benchmarks), gets its clock from the two data
sheets of the same die that bracket its power per SM (H100 NVL 400 W, H100 SXM 700 W), interpolated
linearly in watts per SM: 1.64 GHz, 886 dense BF16 TFLOP/s (marked ~ below, derived, not measured).

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
    chip: str = ""  # the die (GA100, GH100, GB100, AD102): variants of one die share public kernel data
    power_w: int = 0  # board power limit
    tensor_clock_hz: float = 0.0  # the clock the data sheet's tensor peak implies (power-limited)
    _peaks: dict[str, float] = field(init=False, repr=False, compare=False)  # `peak`'s table, by short name

    def __post_init__(self) -> None:
        tc = self.tensor_flops
        peaks = {"bf16": tc["bfloat16"], "fp16": tc["float16"], "fp32": self.fp32_flops, "tf32": tc["tf32"]}
        peaks["fp8"] = tc.get("fp8", tc["bfloat16"])  # no fp8 tensor cores (A100): the bf16 rate
        peaks.update(fp64=self.fp32_flops, int8=peaks["fp8"], uint8=peaks["fp8"])
        object.__setattr__(self, "_peaks", peaks)

    @property
    def display_name(self) -> str:
        """The name results and messages show, e.g. "H100 SXM" (the short `name` when there is no label)."""
        return self.label or self.name

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a short compute dtype name, as the runtime counts FLOPs: 'bf16', 'fp16' (tensor cores),
        'fp32' (non-tensor; also fp64), 'tf32' (tensor cores), 'fp8' (tensor cores; the bf16 rate on GPUs without
        them; also int8). Any other name gets the fp32 rate."""
        return self._peaks.get(dtype, self.fp32_flops)

    def fast_f32_peak(self) -> float:
        """FLOP/s of an fp32 product done as three TF32 tensor-core products (CUTLASS's OpMultiplyAddFastF32),
        as the memory-efficient attention kernel does its fp32 GEMMs on sm80+ (mem_eff_attention
        gemm_kernel_utils.h `DefaultGemmType<ArchTag, float>`); older GPUs run them on the CUDA cores."""
        return self.tensor_flops["tf32"] / 3 if self.capability >= (8, 0) else self.fp32_flops

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


# Dense BF16 tensor FLOP per SM per clock: Ampere 2048, Hopper 4096, Blackwell 8192 (so 132 H100 SMs at
# 1.83 GHz give the data sheet's 989 TFLOP/s). The Grand Teton H100's clock, 1.64 GHz: H100 NVL (132 SMs,
# 400 W) is rated at 835.5 / (132 x 4096) = 1.545 GHz, H100 SXM (132 SMs, 700 W) at 1.83 GHz; 500 W lies
# (500 - 400) / (700 - 400) = 1/3 of the way, 1.545 + (1.83 - 1.545) / 3 = 1.64 GHz.
GT_CLOCK = 1.64e9
GT_BF16 = 132 * 4096 * GT_CLOCK / TERA  # 886.7 TFLOP/s; TF32 half of it, FP8 twice, as on every Hopper part
GT_SCALE_FP = GT_CLOCK / 1.98e9  # of the H100 SXM's FP32 and FP64 throughput (rated at its 1.98 GHz boost clock)

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
            chip="GA100",
            power_w=400,
            tensor_clock_hz=1.410e9,
        ),
        GpuSpec(
            "a100-40gb",  # A100 data sheet: same compute as the 80 GB part, HBM2 1,555 GB/s
            _tc(312, 156, None),
            19.5 * TERA,
            9.7 * TERA,
            1555 * GIGA,
            40 * 10**9,
            40 * MIB,
            108,
            1.410e9,
            32 * GIGA,
            ("a100-sxm4-40gb", "a100-40g"),
            label="A100 SXM 40GB",
            capability=(8, 0),
            cuda_name="NVIDIA A100-SXM4-40GB",
            nvlink_bw=300 * GIGA,
            chip="GA100",
            power_w=400,
            tensor_clock_hz=1.410e9,
        ),
        GpuSpec(
            "a100-pcie",  # A100 data sheet, 80 GB PCIe: same peaks, HBM2e 1,935 GB/s, 300 W; no NVSwitch
            _tc(312, 156, None),
            19.5 * TERA,
            9.7 * TERA,
            1935 * GIGA,
            80 * 10**9,
            40 * MIB,
            108,
            1.410e9,
            32 * GIGA,
            ("a100-pcie-80gb", "a100-80gb-pcie"),
            label="A100 PCIe 80GB",
            capability=(8, 0),
            cuda_name="NVIDIA A100 80GB PCIe",
            chip="GA100",
            power_w=300,
            tensor_clock_hz=1.410e9,
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
            ("h100-sxm", "h100-sxm5", "h100-700w"),
            label="H100 SXM",
            capability=(9, 0),
            cuda_name="NVIDIA H100 80GB HBM3",
            nvlink_bw=450 * GIGA,
            chip="GH100",
            power_w=700,
            tensor_clock_hz=1.830e9,
        ),
        GpuSpec(
            "h100-96gb",  # ~: Grand Teton H100, 96 GB HBM2e at 2.4 TB/s, 500 W (torchtitan); clock derived above
            _tc(GT_BF16, GT_BF16 / 2, GT_BF16 * 2),
            67 * TERA * GT_SCALE_FP,
            34 * TERA * GT_SCALE_FP,
            2400 * GIGA,
            96 * 10**9,
            50 * MIB,
            132,
            GT_CLOCK,
            64 * GIGA,
            ("h100-hbm2e", "h100-500w", "h100-grand-teton", "grand-teton"),
            label="H100 96GB HBM2e 500W",
            capability=(9, 0),
            cuda_name="NVIDIA H100",
            nvlink_bw=450 * GIGA,
            chip="GH100",
            power_w=500,
            tensor_clock_hz=GT_CLOCK,
        ),
        GpuSpec(
            "h100-pcie",  # H100 data sheet, PCIe: 114 SMs, 756 BF16 dense, HBM2e 2 TB/s, 350 W; no NVSwitch
            _tc(756, 378, 1513),
            51 * TERA,
            26 * TERA,
            2000 * GIGA,
            80 * 10**9,
            50 * MIB,
            114,
            1.755e9,
            64 * GIGA,
            ("h100-pcie-80gb",),
            label="H100 PCIe",
            capability=(9, 0),
            cuda_name="NVIDIA H100 PCIe",
            chip="GH100",
            power_w=350,
            tensor_clock_hz=756e12 / (114 * 4096),
        ),
        GpuSpec(
            "h100-nvl",  # H100 NVL data sheet: 94 GB HBM3 3.9 TB/s, 835.5 BF16 dense, 400 W; NVLink bridge pairs only
            _tc(835.5, 417.5, 1670.5),
            60 * TERA,
            30 * TERA,
            3900 * GIGA,
            94 * 10**9,
            50 * MIB,
            132,
            1.785e9,
            64 * GIGA,
            ("h100-nvl-94gb",),
            label="H100 NVL",
            capability=(9, 0),
            cuda_name="NVIDIA H100 NVL",
            chip="GH100",
            power_w=400,
            tensor_clock_hz=835.5e12 / (132 * 4096),
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
            chip="GH100",
            power_w=700,
            tensor_clock_hz=1.830e9,
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
            chip="GB100",
            power_w=1000,
            tensor_clock_hz=2250e12 / (148 * 8192),
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
            chip="AD102",
            power_w=350,
            tensor_clock_hz=362e12 / (142 * 1024),
        ),
    )
}


def get_gpu(name: str | GpuSpec) -> GpuSpec:
    """Look a GPU up by name or alias (case-insensitive). Raises InputError naming the known GPUs."""
    if isinstance(name, GpuSpec):
        return name
    key = _squash(name)
    for g in GPUS.values():
        if key == _squash(g.name) or key in {_squash(a) for a in (*g.aliases, g.label)}:
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
