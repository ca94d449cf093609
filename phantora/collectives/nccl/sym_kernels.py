"""NCCL's symmetric kernels (2.27+): which one runs a collective on symmetric-registered buffers, on how many CTAs,
and the time NCCL's own cost model gives it.

A restatement of `ncclSymPickKernel` / `queryModel` (src/symmetric.cc, v2.27.3-1 .. v2.27.7-1) and of
`ncclSymkPickKernel` / `queryModel_lsa` (src/sym_kernels.cc, v2.28.3-1 .. v2.30.7-1), which keep the same constants:
for each kernel the bytes its busiest GPU moves (`busBytes`) and a bandwidth `softmin(CTAs x smBw x multiplier,
peakBw)`, time = baseLat + softplus(busBytes / bw - 1); the fewest CTAs within 2.5 % of the time at the most; the
kernel of least time x (1 + 2.5 % per CTA) wins (kernels in NCCL's enum order, the first of equals). Only kernels
inside one NVLink domain are restated here: the cross-host GIN kernels of 2.29.7+ are `sym_gin.py`'s. The TMA
variants (2.29+, off unless NCCL_SYM_TMA_ENABLE=1 on Blackwell) are left out.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

MAX_BLOCKS = 64  # ncclSymMaxBlocks / ncclSymkMaxBlocks
LL_BUS_FACTOR = 9.0  # "2X the bytes, plus some processing, plus no unrolling"
SM_PENALTY = 0.025  # "2.5% percent increase in time per SM"
BLOCK_TOLERANCE = 1.025  # the fewest CTAs whose time is within this of the most CTAs'
GBPS = (1 << 30) / 1.0e6  # NCCL's GBps: bytes per µs of one GiB/s
CELL_BYTES = 1024  # NCCL_SYM_KERNEL_CELL_SIZE: 2.28+ rounds each count up to whole cells
LL_MAX_BUS_BYTES = 2 << 30  # LL kernels count elements in 32-bit ints: none at 2 GiB of bus bytes
MAX_BUS_BYTES = 32 * (2 << 30)  # no kernel at all from here
REDUCING_FLOATS = ("fp32", "fp16", "bf16", "fp8")  # sum on these only (ncclSymImplemented); fp64 not
LDMC_TYPES = ("int32", "int64", "fp16", "bf16", "fp32", "fp64")  # multimem ld_reduce sum; fp8 from SM100

# per kind, the kernels in NCCL's enum order (the picker's order): (name, LL, multicast store, multicast load)
KERNELS: dict[str, tuple[tuple[str, bool, bool, bool], ...]] = {
    "all_reduce": (
        ("AllReduce_AGxLL_R", True, False, False),
        ("AllReduce_AGxLLMC_R", True, True, False),
        ("AllReduce_RSxLD_AGxST", False, False, False),
        ("AllReduce_RSxLDMC_AGxSTMC", False, True, True),
    ),
    "all_gather": (
        ("AllGather_LL", True, False, False),
        ("AllGather_LLMC", True, True, False),
        ("AllGather_ST", False, False, False),
        ("AllGather_STMC", False, True, False),
    ),
    "reduce_scatter": (
        ("ReduceScatter_LL", True, False, False),
        ("ReduceScatter_LD", False, False, False),
        ("ReduceScatter_LDMC", False, True, True),
    ),
}
LL_KERNELS = frozenset(name for kernels in KERNELS.values() for name, ll, _, _ in kernels if ll)


@dataclass(frozen=True)
class SymPick:
    """The kernel NCCL's picker runs, its CTAs, the time its model gives (µs) and that time's bandwidth part."""

    kernel: str
    ctas: int
    time_us: float
    bw_us: float  # busBytes / bw: the part of the time that grows with the bytes
    ll: bool
    multicast: bool


def f32(x: float) -> float:
    """`x` rounded to a C float, as NCCL's float estimates are (one operation in double, then rounded, is the float
    operation's exact result; no numpy, so the netsim CLI's start-up does not load it)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def penalised(t: float, ctas: int) -> float:
    """NCCL's score of a kernel: its float time x (1 + 2.5 % per CTA), in float arithmetic."""
    return f32(f32(t) * f32(1.0 + f32(f32(SM_PENALTY) * ctas)))


def _softmin(x: float, ceiling: float, softness: float) -> float:
    return ceiling - softness * math.log1p(math.expm1(ceiling / softness) * math.exp(-x / softness))


def _softplus(x: float, softness: float) -> float:
    z = x / softness
    return x if z >= 100.0 else softness * math.log1p(math.exp(z))


def _bw(ctas: int, sm_bw: float, mult: float, peak: float) -> float:
    return _softmin(ctas * sm_bw * mult, peak, sm_bw)


def bus_bytes(kernel: str, nbytes: int, nranks: int) -> tuple[float, float]:
    """`queryModel`'s (busBytes, busMultiplier) of `kernel` on `nbytes` (NCCL's nBytes: all-reduce's buffer, a
    rank's part for all-gather and reduce-scatter)."""
    n = nranks
    if kernel in LL_KERNELS:
        return n * nbytes * LL_BUS_FACTOR, (1.1 if "LLMC" in kernel else 1.0)
    if kernel == "AllReduce_RSxLD_AGxST":
        return float(2 * nbytes * (n - 1) // n), 1.0  # size_t arithmetic
    if kernel == "AllReduce_RSxLDMC_AGxSTMC":
        return float(nbytes // n + nbytes), float(n)
    if kernel in ("AllGather_ST", "ReduceScatter_LD"):
        return float((n - 1) * nbytes), 1.0
    if kernel in ("AllGather_STMC", "ReduceScatter_LDMC"):
        return float((n - 1) * nbytes), 0.55 * n
    raise ValueError(kernel)


def query_model(kernel: str, nbytes: int, p: Platform, st: NcclSettings) -> tuple[float, int, float]:
    """`queryModel` (LSA): (time µs, CTAs, busBytes / bw µs) of `kernel` on `nbytes`."""
    n = p.nranks
    busb, mult = bus_bytes(kernel, nbytes, n)
    hopper = p.compcap * 10 < 1000  # comm->cudaArch
    max_blocks = MAX_BLOCKS
    if kernel == "AllReduce_RSxLDMC_AGxSTMC" or kernel in ("AllGather_STMC", "ReduceScatter_LDMC"):
        max_blocks = -(-(16 if hopper else 32) // n)
    max_blocks = min(max_blocks, st.max_ctas)
    min_blocks = max(1, st.min_ctas)  # comm->config.minCTAs: 1 by default
    if st.sym_ctas > 0:
        min_blocks = max_blocks = min(MAX_BLOCKS, st.sym_ctas)
    is_ll = kernel in LL_KERNELS
    is_ag, is_ar = kernel.startswith("AllGather"), kernel.startswith("AllReduce")
    if hopper:
        lat = 4.5 if is_ll else 7.8
        sm_bw = (65 if is_ar else 44) * GBPS
        peak = (480 if kernel == "AllReduce_RSxLDMC_AGxSTMC" else 320) * GBPS
    else:
        lat = (8.5 if is_ag else 11.0) if is_ll else (19.5 if is_ar else 13.0)
        sm_bw = 55 * GBPS
        peak = (1000 if kernel == "AllReduce_RSxLDMC_AGxSTMC" else 600) * GBPS

    def model(ctas: int) -> tuple[float, float]:
        x = busb / _bw(ctas, sm_bw, mult, peak)
        return lat + _softplus(x - 1, 1.0), x

    best, x = model(max_blocks)
    blocks = max_blocks
    for bn in range(min_blocks, max_blocks):
        t, xb = model(bn)
        if t <= BLOCK_TOLERANCE * best:
            return t, bn, xb
    return best, blocks, x


def sym_nbytes(kind: str, nbytes: int, nranks: int, dtype_bytes: int, release: tuple[int, int, int]) -> int:
    """NCCL's nBytes for the picker from phantora's size (nccl-tests': all-gather's output, reduce-scatter's
    input): a rank's count for all-gather and reduce-scatter; from 2.28 each count rounded up to whole 1 KiB
    cells (symmetric_sched.cc)."""
    count = nbytes // dtype_bytes
    if kind != "all_reduce":
        count //= nranks
    if release >= (2, 28, 0):
        cell = max(1, CELL_BYTES // dtype_bytes)
        count = -(-count // cell) * cell
    return count * dtype_bytes


def pick(
    kind: str,
    nbytes: int,
    p: Platform,
    st: NcclSettings,
    dtype: str,
    multicast: bool,
    release: tuple[int, int, int],
    works: int = 1,
    largest: int | None = None,
) -> SymPick | None:
    """`ncclSymkPickKernel` for `works` equal calls of one NCCL group (nccl-tests' -m; 1: a call alone): None where
    no kernel is available (the kind, the type and reduction, the size, NCCL_SYM_KERNEL). `multicast`: the NVLS
    multicast kernels may run (`comm->nvlsSupport`, from 2.29.7 with more than 2 GPUs); `nbytes` as `sym_nbytes`
    gives, the group's total (symmetric_sched.cc: the size limits are the largest call's, `nEltsMax`; the model
    rates the total, `nEltsTotal`; "we currently don't support grouping for LL kernels": none for works > 1).
    `largest`: the largest call's bytes as `sym_nbytes` gives them (None: `works` equal calls)."""
    kernels = KERNELS.get(kind, ())
    if kind != "all_gather" and dtype not in REDUCING_FLOATS:
        return None  # ncclSymImplemented: sum on a float type other than double
    ldmc = multicast and (dtype in LDMC_TYPES or (dtype == "fp8" and p.compcap >= 100))
    bus = (nbytes // works if largest is None else largest) * (1 if kind == "all_reduce" else p.nranks)
    best: tuple[float, SymPick] | None = None
    for name, ll, stmc, ldmc_k in kernels:
        if (stmc and not multicast) or (ldmc_k and not ldmc) or (st.sym_kernel and st.sym_kernel != name):
            continue
        if (ll and (bus >= LL_MAX_BUS_BYTES or works > 1)) or bus >= MAX_BUS_BYTES:
            continue
        t, ctas, x = query_model(name, nbytes, p, st)
        score = penalised(t, ctas)  # NCCL's float estimate, compared with its per-SM penalty in float
        if best is None or score < best[0]:
            best = (score, SymPick(name, ctas, f32(t), x, ll, stmc))
    return None if best is None else best[1]
