"""NCCL's symmetric kernels across hosts (2.29.7+): the GIN kernels, which move a collective over the network with
GPU-initiated puts along each rail (the GPUs of one local index, one a host) and inside each host over NVLink (LSA).

A restatement of `queryModel_gin` and the GIN part of `ncclSymkMask` / `ncclSymkPickKernel` (src/sym_kernels.cc,
v2.29.7-1 .. v2.30.7-1) for nccl-tests' calls (both buffers in windows, one collective a group):

- all-gather: `AllGather_RailRing_LsaSTMC` (a multicast kernel: NVLS, more than 2 GPUs a host): a ring along each
  rail carries every rank's part to the next host, each GPU multicasting what it has into its host. Time
  steps x ginLat + max(S_part x nRanks / lsaBw, S_part x (railRanks - 1) / ginBw), steps = ceil(S_part / 1 MiB) x
  (railRanks - 1); CTAs ceil(S_part / 1 MiB) within [minCTAs, min(maxCTAs, 64, divUp(16 | 32, nHeads))]. NCCL
  leaves this kernel's estimate in seconds (no 1e6 as for the others); it is the only all-gather candidate across
  hosts, so the pick is the same: the model keeps it in µs.
- reduce-scatter: `ReduceScatter_RailA2A_LsaLD` / `_LsaLDMC` (multicast loads): each GPU reduces inside its host
  the parts bound for its rail peers and puts them to each (a rail all-to-all), then reduces its own part with
  what arrived. CTAs ceil(S_part / chunk) within [minCTAs, min(maxCTAs, 64, maxGinInboxBlocks, satBlocks)];
  bandwidth min(CTAs x smBw / smMul, lsaBw / lsaMul, ginBw / ginMul); time S_part / bw + min(S_part, chunk x CTAs)
  x (lsaMul / lsaBw + ginMul / ginBw) + ginLat.

lsaBw is NCCL's 360 GB/s (Hopper) or 720 GB/s (Blackwell), ginBw the GPU's path to its NIC (`minNetBw`, here the
NIC's rate), ginLat NCCL's network ring Simple latency (14 µs).
"""

from __future__ import annotations

import math

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import nvls_heads
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.sym_kernels import MAX_BLOCKS, MAX_BUS_BYTES, REDUCING_FLOATS, SymPick, f32, penalised

RAIL_RING_CHUNK = 1 << 20  # ncclSymkAllGather_RailRing_ChunkSize
LSA_BW = {False: 360e9, True: 720e9}  # nvlinkBws, bytes/s, by Blackwell
RS_CHUNK_FROM = (2, 30, 7)  # 128 KiB default chunk (NCCL_SYM_RS_GIN_CHUNK_SIZE) and new smBw figures from here
RS_CHUNK_OLD = 64 << 10
RS_CHUNK_DEFAULT, RS_CHUNK_MIN, RS_CHUNK_MAX = 128 << 10, 128, 1 << 30
# getSmBw_ReduceScatter_RailA2A, bytes/s: (Blackwell, LDMC) -> figure, per release range
SM_BW_OLD = {(True, True): 2.25e9, (True, False): 5.0e9, (False, True): 9.85e9, (False, False): 14.5e9}
SM_BW_NEW = {(True, True): 8.44e9, (True, False): 26.6e9, (False, True): 4.22e9, (False, False): 13.7e9}
SM_LAT = 10e-6  # getSmLat_ReduceScatter_RailA2A: sizes the inbox only
AG_KERNEL = "AllGather_RailRing_LsaSTMC"
RS_KERNELS = ("ReduceScatter_RailA2A_LsaLD", "ReduceScatter_RailA2A_LsaLDMC")  # NCCL's enum order


def gin_lat_s() -> float:
    """`getGinLat`: NCCL's network ring Simple hardware latency, in seconds."""
    return T.HW_LAT["net"]["ring"][2] * 1e-6


def rs_chunk(st: NcclSettings, release: tuple[int, int, int]) -> int:
    """The reduce-scatter kernel's chunk: 64 KiB before 2.30.7; from it NCCL_SYM_RS_GIN_CHUNK_SIZE (default
    128 KiB) clamped to [128 B, 1 GiB] and rounded down to a power of two."""
    if release < RS_CHUNK_FROM:
        return RS_CHUNK_OLD
    c = st.sym_rs_gin_chunk if st.sym_rs_gin_chunk > 0 else RS_CHUNK_DEFAULT
    c = max(RS_CHUNK_MIN, min(c, RS_CHUNK_MAX))
    return 1 << (c.bit_length() - 1)


def _muls(lsa: int, rail: int, ldmc: bool) -> tuple[float, float, float]:
    """`getBusMul_ReduceScatter_RailA2A`: (smMul, lsaMul, ginMul)."""
    lsa_mul = max((lsa if ldmc else lsa - 1) * rail, (lsa - 1) * rail)
    gin_mul = rail - 1
    stage0 = 0 if lsa == 1 else (1 if ldmc else lsa) * (rail - 1)
    sm_mul = stage0 + (1 if ldmc else lsa) + (rail - 1)
    return float(sm_mul), float(lsa_mul), float(gin_mul)


def _sm_bw(p: Platform, ldmc: bool, release: tuple[int, int, int]) -> float:
    table = SM_BW_NEW if release >= RS_CHUNK_FROM else SM_BW_OLD
    return table[p.compcap >= 100, ldmc]


def sat_blocks(p: Platform, ldmc: bool, release: tuple[int, int, int]) -> int:
    """`calcSatBlocks_ReduceScatter_RailA2A`: the CTAs whose SM bandwidth reaches the LSA / GIN bound."""
    sm_mul, lsa_mul, gin_mul = _muls(p.ppn, p.nnodes, ldmc)
    bound = min(LSA_BW[p.compcap >= 100] / lsa_mul, p.nic_bw * 1e9 / gin_mul)
    return math.ceil(min(float(1 << 30), bound / (_sm_bw(p, ldmc, release) / sm_mul)))


def max_inbox_blocks(p: Platform, st: NcclSettings, release: tuple[int, int, int]) -> int:
    """`symk->maxGinInboxBlocks` (ncclSymkInitOnce): the larger saturation count of LD and LDMC, within the
    communicator's [minCTAs, maxCTAs], NCCL_SYM_CTAS if set, at most 64."""
    n = max(sat_blocks(p, False, release), sat_blocks(p, True, release))
    n = min(max(n, max(1, st.min_ctas)), st.max_ctas)
    if st.sym_ctas >= 1:
        n = st.sym_ctas
    return min(n, MAX_BLOCKS)


def _block_range(st: NcclSettings, most: int) -> tuple[int, int]:
    lo, hi = max(1, st.min_ctas), min(st.max_ctas, MAX_BLOCKS, most)
    if st.sym_ctas > 0:
        lo = hi = min(MAX_BLOCKS, st.sym_ctas)
    return lo, hi


def all_gather_model(nbytes: int, p: Platform, st: NcclSettings) -> tuple[float, int, float]:
    """`queryModel_gin` for AllGather_RailRing_LsaSTMC on a rank's `nbytes`: (time µs, CTAs, bandwidth part µs)."""
    lo, hi = _block_range(st, -(-(16 if p.compcap < 100 else 32) // nvls_heads(p)))
    chunks = -(-nbytes // RAIL_RING_CHUNK)
    intra = nbytes * p.nranks / LSA_BW[p.compcap >= 100]
    inter = nbytes * (p.nnodes - 1) / (p.nic_bw * 1e9)
    steps = chunks * (p.nnodes - 1)
    bw_s = max(intra, inter)
    return 1e6 * (steps * gin_lat_s() + bw_s), max(lo, min(hi, chunks)), 1e6 * bw_s


def reduce_scatter_model(
    nbytes: int, p: Platform, st: NcclSettings, ldmc: bool, release: tuple[int, int, int]
) -> tuple[float, int, float]:
    """`queryModel_gin` for ReduceScatter_RailA2A_LsaLD(MC) on a rank's `nbytes`: (time µs, CTAs, bw part µs)."""
    lo, hi = _block_range(st, MAX_BLOCKS)
    hi = min(hi, max_inbox_blocks(p, st, release), sat_blocks(p, ldmc, release))
    chunk = rs_chunk(st, release)
    blocks = max(lo, min(hi, -(-nbytes // chunk)))
    sm_mul, lsa_mul, gin_mul = _muls(p.ppn, p.nnodes, ldmc)
    lsa_bw, gin_bw = LSA_BW[p.compcap >= 100], p.nic_bw * 1e9
    eff = min(blocks * _sm_bw(p, ldmc, release) / sm_mul, lsa_bw / lsa_mul, gin_bw / gin_mul)
    bw_s = nbytes / eff
    first = min(nbytes, chunk * blocks) * (lsa_mul / lsa_bw + gin_mul / gin_bw)
    return 1e6 * (bw_s + first + gin_lat_s()), blocks, 1e6 * bw_s


def pick_gin(
    kind: str,
    nbytes: int,
    p: Platform,
    st: NcclSettings,
    dtype: str,
    multicast: bool,
    ldmc: bool,
    release: tuple[int, int, int],
) -> SymPick | None:
    """The GIN kernel NCCL's picker runs across hosts (`nbytes`: a rank's part, as `sym_nbytes` gives), or None
    where none is available: all-reduce (no GIN kernel), a reduction on a type other than a float below double,
    the all-gather without multicast, NCCL_SYM_KERNEL naming another kernel, 64 GiB of bus bytes."""
    if kind == "reduce_scatter" and dtype not in REDUCING_FLOATS:
        return None
    if nbytes * p.nranks >= MAX_BUS_BYTES:
        return None
    if kind == "all_gather":
        if not multicast or (st.sym_kernel and st.sym_kernel != AG_KERNEL):
            return None
        t, ctas, x = all_gather_model(nbytes, p, st)
        return SymPick(AG_KERNEL, ctas, f32(t), x, False, True)
    if kind != "reduce_scatter":
        return None
    best: tuple[float, SymPick] | None = None
    for name in RS_KERNELS:
        mc = name.endswith("LDMC")
        if (mc and not ldmc) or (st.sym_kernel and st.sym_kernel != name):
            continue
        t, ctas, x = reduce_scatter_model(nbytes, p, st, mc, release)
        score = penalised(t, ctas)
        if best is None or score < best[0]:
            best = (score, SymPick(name, ctas, f32(t), x, False, mc))
    return None if best is None else best[1]
