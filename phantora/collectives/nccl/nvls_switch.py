"""The NVLink switch chips' share of an NVLS all-reduce's reductions, as a bound on its rate.

In an NVLS all-reduce the switch, not the GPU, adds the n inputs of every element (`multimem.ld_reduce`): n - 1
additions an element, spread over the switch chips each GPU's NVLinks reach. Those chips are a property of the
machine (NVIDIA's specifications: an HGX H100/H200 baseboard has 4 NVSwitch chips, its GPUs' 18 links split
5/4/4/5 among them; an HGX B200 baseboard 2 NVLink switch chips of 72 ports, 9 links a GPU to each, its 14.4 TB/s
being 8 x 18 links of 100 GB/s; a GB200 NVL72 or NVL36 rack has 9 NVLink switch trays of 2 chips, one link from
each GPU to each of the 18).

NCCL's `nvlsEfficiency` (tuning.cc) is its measured NVLS rate on the 8-GPU baseboards (0.85 on Hopper, 0.74 on
Blackwell, of the NVLinks NCCL rates). The model takes that rate as what the baseboard's switch chips sustain when
they add 8 inputs an element: a chip's additions a second are the 8-GPU rate x 7 / chips. A domain of n GPUs over
k chips then runs its NVLS all-reduce at most at that x k / (n - 1). A group of at most 8 GPUs never adds more a
chip than the 8-GPU baseboard, so the bound binds only on larger NVLink domains: a 72-GPU NVL72 adds 71 inputs over
18 chips, 3.94 a chip against the HGX B200's 3.5, and runs at 0.887 of the 8-GPU rate where its NVLinks alone would
allow 1.09 (32 heads: S + S/32 a GPU, `nvls_kernel.py`). The rate is per byte whatever the data type (NCCL's
efficiency is).
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.platform import Platform

BASEBOARD_GPUS = 8  # the NVSwitch baseboards NCCL's nvlsEfficiency describes (HGX H100/H200/B200)
BASEBOARD_CHIPS = {"hopper": 4, "blackwell": 2}  # NVSwitch chips a baseboard GPU's links reach
MNNVL_CHIPS = {"blackwell": 18}  # NVLink switch chips a GPU of a GB200 NVL72/NVL36 rack reaches (9 trays x 2)


def switch_chips(p: Platform) -> int:
    """The NVLink switch chips one GPU's links spread over: the baseboard's up to 8 GPUs, a multi-node NVLink
    rack's beyond (a Blackwell NVLink domain of more than 8 GPUs is a GB200 rack); 0 where not known."""
    if p.ppn > BASEBOARD_GPUS and p.arch in MNNVL_CHIPS:
        return MNNVL_CHIPS[p.arch]
    return BASEBOARD_CHIPS.get(p.arch, 0)


def switch_bound_algbw(p: Platform) -> float:
    """Algorithm bandwidth (GB/s) the switch chips' additions allow a one-node NVLS all-reduce of `p.ppn` GPUs;
    0 when unbounded (no NVLS efficiency or chip count known, or one GPU)."""
    chips, ref_chips = switch_chips(p), BASEBOARD_CHIPS.get(p.arch, 0)
    eff = T.NVLS_EFFICIENCY.get(p.arch, 0.0)
    if not chips or not ref_chips or not eff or p.ppn < 2:
        return 0.0
    n = BASEBOARD_GPUS
    baseboard = p.nvls_gpu_bw * eff * n / (n + 1)  # the 8-GPU kernel rate (nvls_kernel.py at 8 heads)
    per_chip = baseboard * (n - 1) / ref_chips  # bytes of additions a chip sustains, per input beyond the first
    return per_chip * chips / (p.ppn - 1)
