"""NCCL's copy-engine collectives (CE, NCCL 2.28+): an all-gather or all-to-all moved by the GPUs' copy engines,
no CTA (src/ce_coll.cc, enqueue.cc `taskAppend`, v2.28.3-1 .. v2.30.7-1).

Where NCCL runs one (`taskAppend`, before its tuner and its symmetric kernels, so NCCL_ALGO / NCCL_PROTO do not
apply):
- NCCL_CTA_POLICY ZERO (2.28.x: the policy equal to ZERO; 2.29.2+: its ZERO bit) on symmetric windows (`-R 2`),
  all-gather or all-to-all (`ncclCeImplemented`; CUDA 12.5+, taken as given; its scatter and gather are no kind
  of phantora's; an all-to-all only as the ncclAlltoAll call, `Collective.alltoall_api`: torch runs its all-to-all
  as a group of sends and receives, which never reach the copy engines), every rank in one node (2.28.x
  `nNodes == 1`, 2.29.2+ `ncclCeAvailable`: the LSA team is the communicator), with symmetric support
  (NCCL_WIN_ENABLE);
- 2.29.2+ without the policy: a Blackwell (SM100+) all-gather on symmetric windows of more than NCCL_SYM_CE_THRESHOLD
  elements a rank (8 Mi) where every GPU has a direct NVLink to every other (`isAllDirectNvlink`).
What it runs (`ncclCeAllGather`, `ncclCeAlltoAll`): a sync (each rank writes a flag, to the NVLS multicast address
or to every peer, and its stream waits for every peer's), one batch of copies (`cudaMemcpyBatchAsync`), each GPU
writing its part to every peer's window (all-gather: its s = S / n to each; all-to-all: each peer's block), and a
second sync. A batch of more than 8 copies and 512 MiB or more is cut: 2.28.x into batches of 8 with a sync between
(`CE_COLL_INTRA_BATCH_SYNC_FREQ`, `_MSG_THRESHOLD`); from 2.29.2 into interleaved rounds of one batch, no sync.
The cost: NCCL rates none of this (it bypasses the tuner). The latency is its syncs, each a flag over NVLink that
the peers' streams poll, charged NCCL's NVLink hop for a Simple step's flag handshake (tuning.cc hwLat, 3.4 µs;
its PCI hop, 5.7, on a PCIe host); the bytes move as flows at whatever the links give (no copy-engine rate in
NCCL's code). On a PCIe host (2.28.3) NCCL copies over P2P where it gives the host symmetric support
(`pci_symmetric.py`: every pair within its P2P level); 2.28.7+ decide that by CUDA's peer capability: refused.
Across hosts, 2.30.7's hierarchical CE (`ncclHierCeAvailable`, `ncclHierCeAllGather` / `ncclHierCeAlltoAll`):
under the ZERO policy on windows registered on both sides, every host's GPUs one NVLink domain (its LSA team covers
its local ranks), symmetric support across hosts (GIN: `register.gin_available`, NCCL_GIN_ENABLE) and the host RMA
proxy (init.cc `hostRmaSupport`: NCCL_NUM_RMA_CTX > 0, its internal IB RMA plugin on phantora's RDMA NICs with
GPUDirect, NCCL_CROSS_NIC not 0). What it runs: a rail sync (a signal put to every other host's GPU of the same
local index, and a wait for theirs), then the RMA proxy's puts (`sym.hier_chunks`: a peer's bytes cut into chunks of at
most 64 MiB) and the host's copy engines, and a final sync. All-gather: each GPU puts its part s to its rail peer on
every other host, syncs its host, copies s to each host peer, then, host by host in shift order, waits for each
chunk's signal and copies that chunk to each host peer (one batch after another on its stream). All-to-all: after a
host sync each GPU puts its block to every GPU of every other host and copies its block to each host peer, all at
once. Latency: the rail sync, charged NCCL's network Simple hop (tuning.cc hwLat, 14 µs; NCCL rates none of this),
and the host syncs at NVLink's (3.4 µs; all-gather's first one delays only its host copies).
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.pci_symmetric import pci_symmetric_support
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.register import gin_available, nvlink_domain, register_mode, release_of
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.tuning import Choice
from phantora.collectives.spec import DTYPE_BYTES, Collective
from phantora.collectives.sym import HOST_SYNC_NS, hier_chunks
from phantora.errors import InputError

CE_FROM = (2, 28, 0)  # ce_coll.cc
AUTO_CE_FROM = (2, 29, 2)  # the Blackwell all-gather without the ZERO policy; ncclCeAvailable
ROUNDS_FROM = (2, 29, 2)  # a cut batch runs as interleaved rounds of one cudaMemcpyBatchAsync, no sync between
HIER_CE_FROM = (2, 30, 7)  # ncclHierCeAvailable: CE across hosts through the RMA proxy
CE_KINDS = ("all_gather", "all_to_all")
ZERO = 2  # nccl.h NCCL_CTA_POLICY_ZERO
AUTO_CE_COMPCAP = 100  # comm->minCompCap >= 100
SYNC_FREQ = 8  # CE_COLL_INTRA_BATCH_SYNC_FREQ: copies a batch before a sync
SYNC_MSG_BYTES = 512 << 20  # CE_COLL_INTRA_BATCH_SYNC_MSG_THRESHOLD


def ce_copies(n: int) -> int:
    """The copies of one rank's batch: all-gather its own part into its output (out of place, as nccl-tests' and
    torch's calls are) and n - 1 peers; all-to-all its own block and n - 1 peers'."""
    return n


def hier_ce(p: Platform, st: NcclSettings) -> bool:
    """Whether NCCL 2.30.7+ runs a multi-host CE call hierarchically (module docstring; the ZERO policy, windows,
    the function and the release are the caller's). Raises where it would and the hosts are not one NVLink domain
    each (their LSA team is then not modelled)."""
    if not (gin_available(p, st) and st.gin_enable and st.num_rma_ctx > 0 and st.cross_nic != 0):
        return False  # no symmetric support across hosts, or no host RMA proxy: NCCL's kernels, not its CE
    if not nvlink_domain(p):
        raise InputError(
            "NCCL_CTA_POLICY ZERO with symmetric registration (-R 2) across hosts whose GPUs are not all direct "
            "NVLink peers: NCCL's hierarchical copy-engine collective needs each host's LSA team, not modelled there",
            field="NCCL_CTA_POLICY",
        )
    return True


def ce_syncs(kind: str, nbytes: int, n: int, rel: tuple[int, int, int]) -> int:
    """The syncs of one CE call: before and after the batch, and under 2.28.x one between batches of 8 copies when
    the batch is cut (more than 8 copies of 512 MiB or more in all)."""
    copies = ce_copies(n)
    part = -(-nbytes // n)  # all-gather: a rank's part; all-to-all: one peer's block
    cut = copies > SYNC_FREQ and part * copies >= SYNC_MSG_BYTES
    if not cut or rel >= ROUNDS_FROM:
        return 2
    return 2 + -(-copies // SYNC_FREQ) - 1


def rail_sync_us() -> float:
    """The hierarchical CE's rail sync: a signal put across the network and the wait for the peers', charged NCCL's
    network hop of a Simple step (tuning.cc hwLat[NET][RING][SIMPLE], 14 µs)."""
    return T.HW_LAT["net"]["ring"][T.PROTOCOLS.index("Simple")]


def ce_sync_us(p: Platform) -> float:
    """One sync: a flag across NVLink (PCIe on a PCIe host) that the peers' streams wait on, at NCCL's hop of a
    Simple step over that link (tuning.cc hwLat: NVLink 3.4 µs, PCI 5.7)."""
    return T.HW_LAT["pci" if p.intra == "pci" else "nvlink"]["ring"][T.PROTOCOLS.index("Simple")]


def _count(coll: Collective) -> int:
    """NCCL's `count` of the call: the elements of a rank's part (all-gather's sendcount)."""
    return coll.nbytes // coll.size // DTYPE_BYTES[coll.dtype]


def runs_ce(coll: Collective, p: Platform, st: NcclSettings) -> bool:
    """Whether NCCL runs `coll` on the copy engines (module docstring); raises where it would and that is not
    modelled (PCIe P2P copies, 2.30.7's hierarchical CE across hosts)."""
    rel = release_of(st)
    if rel < CE_FROM or coll.kind not in CE_KINDS or coll.nbytes == 0 or coll.size < 2:
        return False
    if coll.kind == "all_to_all" and not coll.alltoall_api:
        return False  # a group of sends and receives (torch): NCCL's p2p tasks, never the copy engines
    if register_mode(st) != 2 or not st.win_enable:
        return False
    zero = bool(st.cta_policy & ZERO)
    if p.nnodes > 1:  # ncclCeAvailable: not every rank in the LSA team (one node); 2.30.7+: ncclHierCeAvailable
        return zero and rel >= HIER_CE_FROM and hier_ce(p, st)
    auto = (
        rel >= AUTO_CE_FROM
        and coll.kind == "all_gather"
        and p.compcap >= AUTO_CE_COMPCAP
        and nvlink_domain(p)
        and _count(coll) > st.sym_ce_threshold
    )
    if not zero and not auto:
        return False
    return nvlink_domain(p) or pci_symmetric_support(p, rel, f"this {coll.kind} under NCCL_CTA_POLICY ZERO")


def ce_choice(coll: Collective, p: Platform, st: NcclSettings) -> Choice | None:
    """The copy-engine Choice (algorithm "ce", no CTA) where NCCL runs one (`runs_ce`), else None. Its latency is
    the syncs'; its time, which NCCL does not estimate, the closed form on an idle host: (n - 1) parts out of each
    GPU at NCCL's figure for the GPU's NVLink (or PCIe link)."""
    if not runs_ce(coll, p, st):
        return None
    n = coll.size
    if p.nnodes > 1:
        return _hier_choice(coll, p)
    syncs = ce_syncs(coll.kind, coll.nbytes, n, release_of(st))
    lat = syncs * ce_sync_us(p)
    bw_us = (n - 1) * -(-coll.nbytes // n) / (1000.0 * p.gpu_intra_bw)
    algbw = coll.nbytes / (1000.0 * bw_us)
    return Choice("ce", "Simple", 0, lat, algbw, lat + bw_us, ce_syncs=syncs)


def _hier_choice(coll: Collective, p: Platform) -> Choice:
    """The hierarchical CE Choice: latency the rail sync and two host syncs; its time the closed form on idle links
    (`hier_idle_us`) at NCCL's figures for the GPU's NVLink and its NIC."""
    lat = rail_sync_us() + 2 * ce_sync_us(p)
    bw_us = hier_idle_us(coll.kind, coll.nbytes, p.nnodes, p.ppn, 1000.0 * p.nic_bw, 1000.0 * p.gpu_intra_bw)
    return Choice("ce", "Simple", 0, lat, coll.nbytes / (1000.0 * bw_us), lat + bw_us, ce_syncs=2)


def hier_idle_us(kind: str, nbytes: int, hosts: int, local: int, nic: float, nvl: float) -> float:
    """`sym.hier_ce_flows` on idle links past its latency, in µs (`nic`, `nvl`: a GPU's NIC and NVLink, bytes a µs;
    a rank's part s = S / n, a peer's chunks c_1 .. c_m). All-to-all: max((H - 1) L s / NIC, (L - 1) s / NVLink).
    All-gather: the H - 1 rail puts share the NIC, so chunk j of every host arrives at (H - 1) (c_1 + .. + c_j) / NIC;
    the host copies of s end at one host sync + (L - 1) s / NVLink; then each received chunk's copies, (L - 1) c_j /
    NVLink, start once it has arrived and the copies before have ended."""
    s = -(-nbytes // (hosts * local))
    if kind == "all_to_all":
        return max((hosts - 1) * local * s / nic, (local - 1) * s / nvl)
    chunks = hier_chunks(s)
    end = HOST_SYNC_NS / 1000.0 + (local - 1) * s / nvl
    for _ in range(1, hosts):
        sent = 0
        for c in chunks:
            sent += c
            end = max(end, (hosts - 1) * sent / nic) + (local - 1) * c / nvl
    return end
