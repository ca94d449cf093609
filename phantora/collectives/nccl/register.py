"""What registered buffers change in NCCL's choice (nccl-tests' `-R`, `PHANTORA_NCCL_REGISTER`; register_env.py).

- `-R 2`, symmetric windows (NCCL 2.27+): on one NVLink host an all-reduce, all-gather or reduce-scatter runs a
  symmetric kernel whenever one is available (enqueue.cc 2.27 "always use symmetric if available"; 2.28+
  symmetric_sched.cc: both buffers in windows, no fallback), picked by NCCL's own model (`sym_kernels.py`); across
  hosts an all-gather or reduce-scatter runs a GIN kernel from 2.29.7 where GIN is there (`sym_gin.py`), the
  legacy algorithms elsewhere (`_gin_choice`).
- `-R 1`, ncclCommRegister: NVLS and NVLS-Tree run on the registered buffers with fewer CTAs, "to saturate
  bandwidth" (coll_reg.cc, nvls.cc `ncclNvlsRegResourcesQuery`): `registered_nvls_ctas`. Under NCCL_CTA_POLICY
  EFFICIENCY (2.27+) a registered all-gather or reduce-scatter on one NVSwitch host takes NVLS on those CTAs when
  they are no more than the chosen algorithm's (enqueue.cc `ncclGetAlgoInfo`): `efficiency_nvls`. Ring, tree and
  p2p registration (IPC, NET) remove a copy through NCCL's buffers; NCCL's tuner has no term for it and its code
  gives no figure, so their choice and time stay.
"""

from __future__ import annotations

import dataclasses
import math

from phantora.collectives.nccl import old_tuners
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import nvls_channels, nvls_heads
from phantora.collectives.nccl.chunking import chunk_bytes, step_bytes, whole_grains
from phantora.collectives.nccl.pci_symmetric import pci_symmetric_support
from phantora.collectives.nccl.pipeline import chunk_overhead_us, fill_us
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.sym_gin import pick_gin
from phantora.collectives.nccl.sym_kernels import LDMC_TYPES, pick, sym_nbytes
from phantora.collectives.nccl.tuning import Choice, running_release
from phantora.collectives.spec import DTYPE_BYTES, Collective
from phantora.errors import InputError

SYM_FROM = (2, 27, 0)  # ncclCommWindowRegister and the symmetric kernels
GIN_FROM = (2, 29, 2)  # the first symmetric kernel across hosts (GIN), and symmetric support there needs GIN
GIN_RESTATED_FROM = (2, 29, 7)  # AllGather_RailRing_LsaSTMC, ReduceScatter_RailA2A_Lsa*: sym_gin.py
GIN_TYPES = (-1, 2, 3)  # NCCL_GIN_TYPE a GIN plugin of an RDMA NIC answers to: any, proxy, GDAKI
LSA_MULTIMEM_MIN_RANKS_FROM = (2, 29, 7)  # multicast kernels need more than 2 GPUs (hasLsaMultimem)
CTA_POLICY_FROM = (2, 27, 0)
SYM_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
GROUP_FROM = (2, 28, 0)  # symmetric_sched.cc: a group's calls of one (op, reduction, type) as one kernel
ARGS_BYTES = 4 << 10  # ncclMaxKernelArgsSize, 2.28.x
RANGES_BYTES = 64 * 4  # MAXCHANNELS x sizeof(ncclSymkChannelWorkRange), 16-aligned
WORK_BYTES = 64  # sizeof(ncclSymkDevWork)
# sizeof(ncclSymkDevWorkArgs), 16-aligned: its ncclSymkDevComm (ncclDevComm and an ncclLLA2AHandle) and an int. 2.28.3:
# a devComm of 88 B (6 ints, 2 pointers, an inlined 32 B window, a multimem pointer, a barrier handle of 8 B) + 8
# + 4 -> 112; 2.28.7 - 2.28.9 add the window's GIN offset and 4 GIN windows (72 B), a GIN barrier handle and the GIN
# context fields (devComm 200 B) -> 224 (comm__types.h, core__types.h, sym_kernels.h at each tag). 2.29.2 - 2.29.3
# keep 224; 2.29.7 adds the GIN outbox, rail inbox and sync handles to ncclSymkDevComm and a second int -> 288;
# 2.30.3 - 2.30.7 a resource handle and a byte count for the GIN reduce-scatter -> 304. Each size (and 64 B a work,
# 4 B a channel's range, MAXCHANNELS 64, ncclMaxKernelArgsSize 4 KiB) as sizeof prints it for a program built on the
# tag's own src/include (nvcc, x86-64, NCCL_GIN_GDAKI_ENABLE 0: that switch adds no field), 2026-12-03.
SYMK_ARGS_BYTES = {(2, 28, 3): 112, (2, 28, 7): 224, (2, 29, 7): 288, (2, 30, 3): 304}


def release_of(st: NcclSettings) -> tuple[int, int, int]:
    """The NCCL that runs as (major, minor, patch), a bare minor its newest patch."""
    return old_tuners.release(running_release(st))


def register_mode(st: NcclSettings) -> int:
    """The registration NCCL sees: 0, 1 (local) or 2 (symmetric window). nccl-tests takes -R 2 as 1 before NCCL
    2.27; NCCL_LOCAL_REGISTER=0 makes a local registration count for nothing."""
    mode = st.register
    if mode == 2 and release_of(st) < SYM_FROM:
        mode = 1
    if mode == 1 and not st.local_register:
        return 0
    return mode


def nvlink_domain(p: Platform) -> bool:
    """All the communicator's GPUs reach each other over NVLink directly (ncclTopoPathAllDirectNVLink)."""
    return p.intra == "nvlink" and p.pci is None and (p.nvswitch or p.ppn == 2)


def kernel_works(rel: tuple[int, int, int]) -> int | None:
    """The calls one symmetric kernel of a group takes in NCCL `rel` (symmetric_sched.cc `ncclMakeSymmetricTaskList`,
    v2.28.3-1 .. v2.30.7-1: a kernel ends with the call after which one more work would overflow the kernel's
    arguments, `calcArgsSize(MAXCHANNELS, nWorks + 1) > workArgsBytes`): 58 in 2.28.3, 56 in 2.28.7 - 2.29.3, 55
    from 2.29.7. None before 2.28 (no symmetric group)."""
    if rel < GROUP_FROM:
        return None
    args = SYMK_ARGS_BYTES[max(k for k in SYMK_ARGS_BYTES if k <= rel)]
    return (ARGS_BYTES - args - RANGES_BYTES) // WORK_BYTES


def kernel_calls(sizes: tuple[int, ...], per_kernel: int) -> list[tuple[int, ...]]:
    """A symmetric group's calls (bytes, in issue order) cut into NCCL's kernels of at most `per_kernel` calls,
    in launch order: `ncclMakeSymmetricTaskList` chains a bin's tasks newest first, then cuts the chain."""
    chain = sizes[::-1]
    return [chain[i : i + per_kernel] for i in range(0, len(chain), per_kernel)]


def sym_choice(coll: Collective, p: Platform, st: NcclSettings) -> Choice | None:
    """The symmetric kernel NCCL runs `coll` with under `-R 2`, as a Choice (algorithm "sym"); None where NCCL runs
    its legacy algorithms instead. Raises where NCCL would run a symmetric kernel this model does not restate."""
    if register_mode(st) != 2 or coll.kind not in SYM_KINDS or not st.win_enable or coll.nbytes == 0:
        return None
    rel = release_of(st)
    sizes = coll.group_sizes or (coll.nbytes,) * coll.group_calls  # the group's calls (nccl-tests -m, coalesced)
    works = len(sizes)
    field = "group_sizes" if coll.group_sizes else "-m"
    if works > 1 and rel < GROUP_FROM:
        return None  # 2.27 runs a symmetric kernel only for a group of one collective (enqueue.cc nTasksColl == 1)
    if p.nnodes > 1:
        gin = _gin_choice(coll, p, st, rel)
        if gin is not None and works > 1:
            raise InputError(f"a group of {works} calls on GIN kernels (across hosts) is not modelled", field=field)
        return gin
    if not nvlink_domain(p):
        if rel >= (2, 29, 0):
            return None  # 2.29+: only where every GPU has a direct NVLink (isAllDirectNvlink)
        if not pci_symmetric_support(p, rel, f"this {coll.kind}"):
            return None  # a pair on SHM: no symmetric support, the legacy algorithms
    multicast = st.nvls and p.nvswitch and p.compcap >= 90
    if rel >= LSA_MULTIMEM_MIN_RANKS_FROM:
        multicast = multicast and p.nranks > 2
    # symmetric_sched.cc: the picker rates the calls' counts, each rounded up to cells, summed (countTotal), with the
    # size limits of the largest (countMax); a call runs symmetric only if a kernel takes it alone (ncclSymkAvailable)
    each = [sym_nbytes(coll.kind, s, p.nranks, DTYPE_BYTES[coll.dtype], rel) for s in sizes]
    nbytes = sum(each)
    got = pick(coll.kind, nbytes, p, st, coll.dtype, multicast, rel, works, largest=max(each))
    alones = {e: pick(coll.kind, e, p, st, coll.dtype, multicast, rel) is not None for e in set(each)}
    if works > 1 and len(set(alones.values())) > 1:
        raise InputError(
            f"a group of {works} symmetric calls of which only some have a symmetric kernel alone: NCCL runs those "
            "symmetric and the rest on its legacy kernels, two kernels in one launch, which is not modelled",
            field=field,
        )
    alone = all(alones.values())
    per_kernel = kernel_works(rel)
    if alone and per_kernel is not None and works > per_kernel:  # NCCL's first kernel (collectives/sym_plans.py)
        first = kernel_calls(sizes, per_kernel)[0]
        return sym_choice(dataclasses.replace(coll, nbytes=sum(first), group_sizes=first, group_calls=1), p, st)
    if got is None:
        if alone and works > 1 and rel < (2, 29, 0):  # symmetric alone (ncclSymkAvailable), no kernel in a group
            raise InputError(
                f"NCCL_SYM_KERNEL={st.sym_kernel} in a group of {works} calls: NCCL {rel[0]}.{rel[1]} runs no LL "
                'kernel in a group and fails the call ("no symmetric kernel available")',
                field="NCCL_SYM_KERNEL",
            )
        return None  # 2.29+ falls back to the legacy algorithms
    lat = got.time_us - got.bw_us
    algbw = sum(sizes) / (1000.0 * got.bw_us) if got.bw_us > 0 else math.inf
    proto = "LL" if got.ll else "Simple"
    return Choice("sym", proto, got.ctas, lat, algbw, got.time_us, kernel=got.kernel, works=works)


def gin_available(p: Platform, st: NcclSettings) -> bool:
    """Whether NCCL finds a GIN plugin for a communicator across hosts (plugin/gin.cc `ncclGinInit`, 2.29.7+):
    after any external one it tries its own, GDAKI on mlx5 (ConnectX) NICs and then a proxy over its IB RMA
    backend, each needing GPUDirect RDMA (peermem or DMA-BUF), on Volta or later. phantora's fabrics are
    InfiniBand / RoCE NICs with GPUDirect, so GIN is there unless NCCL_GIN_TYPE names another type (0, 1...)."""
    return p.compcap >= 70 and st.gin_type in GIN_TYPES


def _gin_choice(coll: Collective, p: Platform, st: NcclSettings, rel: tuple[int, int, int]) -> Choice | None:
    """`sym_choice` across hosts. Legacy (None) where NCCL runs no symmetric kernel: before 2.29.2 (2.27 - 2.28.3
    have no symmetric support across hosts; 2.28.7 - 2.28.9 mask every LSA kernel there and their one network
    kernel, AllReduce_RSxNet_ARxMC_AGxNet, is in no function's mask), for all-reduce (no GIN kernel in any
    release), without GIN (init.cc: symmetricSupport needs it across hosts; ncclCommWindowRegister then
    registers nothing), with NCCL_SYM_GIN_KERNELS_ENABLE=0, without a direct NVLink between a host's GPUs, or where
    no kernel applies. The GIN kernels of 2.29.7+ are `sym_gin.py`'s; 2.29.2 - 2.29.3's AllGather_GinHier_MCRing
    is refused, as is NCCL_GIN_ENABLE=0 (NCCL's window registration fails: "GIN is disabled")."""
    if rel < GIN_FROM or coll.kind == "all_reduce" or not gin_available(p, st):
        return None
    if (rel >= GIN_RESTATED_FROM and not st.sym_gin_kernels) or not nvlink_domain(p):
        return None
    multicast = st.nvls and p.nvswitch and p.compcap >= 90 and p.ppn > 2
    if rel < GIN_RESTATED_FROM:
        if coll.kind != "all_gather" or not multicast:
            return None  # 2.29.2 - 2.29.3: the one GIN kernel is a multicast all-gather
        raise InputError(
            f"symmetric registration (-R 2) of an all_gather across {p.nnodes} hosts: NCCL {rel[0]}.{rel[1]}.{rel[2]} "
            "runs AllGather_GinHier_MCRing there, which is not modelled (2.29.7+'s GIN kernels are)",
            field="PHANTORA_NCCL_VERSION",
        )
    if not st.gin_enable:
        raise InputError(
            "NCCL_GIN_ENABLE=0 with symmetric registration (-R 2) across hosts: NCCL's window registration fails "
            '("GIN is disabled"); NCCL_SYM_GIN_KERNELS_ENABLE=0 runs the legacy algorithms instead',
            field="NCCL_GIN_ENABLE",
        )
    if p.nranks != p.nnodes * p.ppn:
        raise InputError(
            f"symmetric registration (-R 2) of a {coll.kind} across hosts with unequal GPUs a host "
            f"({p.nranks} GPUs on {p.nnodes} hosts): NCCL's GIN rails are not modelled there",
            field="PHANTORA_NCCL_REGISTER",
        )
    ldmc = multicast and (coll.dtype in LDMC_TYPES or (coll.dtype == "fp8" and p.compcap >= 100))
    nbytes = sym_nbytes(coll.kind, coll.nbytes, p.nranks, DTYPE_BYTES[coll.dtype], rel)
    got = pick_gin(coll.kind, nbytes, p, st, coll.dtype, multicast, ldmc, rel)
    if got is None:
        return None
    return Choice(
        "sym", "Simple", got.ctas, got.time_us - got.bw_us, _algbw(coll, got.bw_us), got.time_us, kernel=got.kernel
    )


def _algbw(coll: Collective, bw_us: float) -> float:
    return coll.nbytes / (1000.0 * bw_us) if bw_us > 0 else math.inf


def registered_nvls_ctas(kind: str, p: Platform, st: NcclSettings, nvls_bw: float = 0.0) -> int:
    """The CTAs NVLS / NVLS-Tree run on registered buffers (`-R 1`): coll_reg.cc's counts (2.19-2.26) or
    `ncclNvlsRegResourcesQuery` (2.27+), within [NCCL_MIN_CTAS, NCCL_MAX_CTAS]. `nvls_bw`: the tuner's NVLS
    reduce-scatter bandwidth (GB/s), which sets the count across hosts on 2.27+. 0: not registered (other kinds)."""
    if kind not in SYM_KINDS:
        return 0
    rel = release_of(st)
    bw_blackwell = p.compcap >= 100
    lo, hi = max(1, st.min_ctas), st.max_ctas
    if rel < (2, 20, 0):
        return min(5 if kind == "reduce_scatter" else 4, nvls_channels(p, st))
    if rel < (2, 25, 0):
        n = (5 if kind == "reduce_scatter" else 4) if p.nnodes == 1 else 6
        return max(lo, min(hi, n))
    if rel < SYM_FROM:
        if p.nnodes == 1:
            n = (6 if bw_blackwell else 5) if kind == "reduce_scatter" else (8 if bw_blackwell else 4)
        else:
            n = 7 if bw_blackwell else 6
        return max(lo, min(hi, n))
    if p.nnodes == 1:
        factor = {"reduce_scatter": 6 if bw_blackwell else 5, "all_gather": 4}.get(kind, 8 if bw_blackwell else 4)
    elif kind == "reduce_scatter":
        factor = 7 if nvls_bw > 400 else 6
    elif kind == "all_gather":
        factor = 6
    elif rel >= (2, 30, 0) and bw_blackwell and p.nic_bw >= 96.0:
        factor = 10
    else:
        factor = 7 if bw_blackwell else 6
    return max(lo, min(hi, -(-factor * 8 // nvls_heads(p))))


REG_CHUNK_FROM = (2, 27, 0)  # calcCollChunking: a registered NVLS all-gather / reduce-scatter takes a Simple step


def registered_chunk(algo: str, kind: str, p: Platform, st: NcclSettings, nbytes: int, ctas: int) -> int:
    """The chunk calcCollChunking gives NVLS / NVLS-Tree on registered buffers (`-R 1`, `ctas` their CTAs): from
    2.27 a registered NVLS all-gather or reduce-scatter takes a whole Simple step (NCCL_BUFFSIZE / NCCL_STEPS,
    512 KiB by default) with no ladder; otherwise the usual ladder, on the registered CTAs x heads."""
    if _whole_step(algo, kind, st):
        return whole_grains("Simple", st.nccl_version, step_bytes("Simple", st))
    return chunk_bytes(algo, "Simple", p, st, nbytes, max(1, ctas) * nvls_heads(p), kind)


def _whole_step(algo: str, kind: str, st: NcclSettings) -> bool:
    return algo == "nvls" and kind in ("all_gather", "reduce_scatter") and release_of(st) >= REG_CHUNK_FROM


def registered_nvls(choice: Choice, kind: str, p: Platform, st: NcclSettings, nbytes: int) -> Choice:
    """`choice` (NVLS or NVLS-Tree on NCCL's default CTAs) on registered buffers: its registered CTAs
    (`registered_nvls_ctas`), NCCL's bandwidth (its "to saturate bandwidth"), and the chunks and fill of those
    CTAs and `registered_chunk`. The NVLS chunk overhead (pipeline.chunk_overhead_us, charged in the bandwidth) is
    taken off for the default CTAs' chunks and put back for the registered ones (none for a whole-step chunk, larger
    than NCCL's largest ladder chunk, whose cost NCCL's bandwidth already holds). Inside one node the kernel moves
    the data between the user buffers through the multicast object in one pass (all_gather.h, reduce_scatter.h,
    all_reduce.h with `regUsed`: the scatter and gather warps move 0 elements, only synchronising), so no second
    stage fills: no fill. NVLS-Tree keeps its stages, its fill on the registered CTAs and chunk (less its tree
    correction, as `tuning.select` does)."""
    a, proto = choice.algorithm, choice.protocol
    ctas = registered_nvls_ctas(kind, p, st)
    chunk = registered_chunk(a, kind, p, st, nbytes, ctas)
    old = chunk_overhead_us(a, proto, p, st, nbytes, choice.channels, kind)
    new = 0.0 if _whole_step(a, kind, st) else chunk_overhead_us(a, proto, p, st, nbytes, ctas, kind)
    bw_us = nbytes / (1000.0 * choice.algbw) if choice.algbw > 0 else 0.0
    raw = bw_us - old  # the bandwidth part before any chunk overhead, as select has it
    algbw = nbytes / (1000.0 * (raw + new)) if raw + new > 0 else choice.algbw
    fill = 0.0
    if a == "nvls_tree":
        raw_bw = nbytes / (1000.0 * raw) if raw > 0 else choice.algbw
        fill = max(0.0, fill_us(a, proto, p, st, nbytes, ctas, raw_bw, kind, chunk=chunk) - choice.fit_us)
    time = choice.lat_us + (nbytes / (1000.0 * algbw) if algbw > 0 else 0.0)
    return dataclasses.replace(choice, channels=ctas, algbw=algbw, time_us=time, fill_us=fill, registered=True)


def efficiency_nvls(kind: str, p: Platform, st: NcclSettings) -> bool:
    """Whether NCCL_CTA_POLICY EFFICIENCY (2.27+) sends a registered (`-R 1`) all-gather or reduce-scatter to NVLS
    (enqueue.cc `ncclGetAlgoInfo`: no NCCL_ALGO / NCCL_PROTO, one host with NVLS; across hosts it needs CollNet,
    which is not modelled). The caller checks the CTAs against the chosen algorithm's."""
    if kind not in ("all_gather", "reduce_scatter") or not st.cta_policy & 1 or register_mode(st) != 1:
        return False
    if release_of(st) < CTA_POLICY_FROM or "NCCL_ALGO" in dict(st.raw) or "NCCL_PROTO" in dict(st.raw):
        return False
    return p.nnodes == 1 and st.nvls and p.nvls_fabric and p.compcap >= 90 and 2 <= p.ppn <= T.NVLS_MAX_ARITY


P2P_REG_FROM = (2, 24, 0)  # register/sendrecv_reg.cc: IPC and NET registration of send/recv buffers (as read)


def p2p_zero_copy(p: Platform, st: NcclSettings, protocol: str, inside_node: bool, p2p_transport: bool = True) -> bool:
    """Whether NCCL moves a send/recv (or an all-to-all's transfer: both of its buffers registered) between
    registered buffers (`-R 1`) with no copy through its own (enqueue.cc addP2pToPlan, 2.24+): inside a node on
    Simple over a P2P (NVLink or PCIe P2P) connection, not SHM: the sender writes into the receiver's buffer (IPC
    registration); across nodes on Simple when the proxy is the sender's own process, the NIC is GPU-direct and PXN
    is not in use (NCCL uses PXN on NVLink hosts of more than one GPU unless NCCL_PXN_DISABLE=1): the NIC reads and
    writes the user buffers (NET registration). NCCL's p2p rating is the same either way (no figure for the copy
    saved), so only the record and the hand-off's semantics change: a zero-copy sender waits for its receiver,
    so a lone one does not hand off (collectives/handoff.py `send_slots`, `Slots.zero_copy`)."""
    if register_mode(st) != 1 or release_of(st) < P2P_REG_FROM or protocol != "Simple":
        return False
    if inside_node:
        return p2p_transport  # a SHM pair has no P2P connection to register
    pxn = st.pxn and p.intra == "nvlink" and p.ppn > 1
    return not pxn
