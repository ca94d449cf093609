"""NCCL's tuner: the channel graphs its search finds, its latency and bandwidth per algorithm and protocol, the
time it predicts, and the choice it makes (the fastest enabled pair), with the channels it then runs on.

A restatement of NCCL 2.30's model (src/graph/tuning.cc `ncclTopoTuneModel`, `ncclTopoGetAlgoTime`, src/enqueue.cc
`topoGetAlgoInfo`) on the `Platform` of one communicator. The topology search (search.cc) is replaced by its
outcome on the machines it is built for: the fastest candidate per-channel bandwidth whose channels fill the
GPU's NVLink (one node) or its NICs (several nodes), then NCCL's channel duplication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from phantora.collectives.nccl import coll_group, old_tuners, proto_rate, proxy, ring_chain, ring_kernel, ring_round_up
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import (
    Graph,
    comm_channels,
    default_nvls_channels,
    link_graph,
    nvls_channels,
    ring_graph,
    search_fallback,
)
from phantora.collectives.nccl.chunking import collective_chunk, refuse_empty_chunk, ring_simple_chunk
from phantora.collectives.nccl.cta_ceiling import capped_bus_bw, raised_bus_bw
from phantora.collectives.nccl.net_channel import coll_net_channel_bw
from phantora.collectives.nccl.nvls_kernel import nvls_kernel_algbw
from phantora.collectives.nccl.pipeline import chunk_overhead_us, fill_us
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

NSTEPS_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
GRAPH_ALGORITHMS = ("ring", "tree", "pat")  # rated on the ring graph (`costs`), so on its fallback too


@dataclass(frozen=True)
class Cost:
    """NCCL's model of one (algorithm, protocol): latency in µs and algorithm bandwidth in GB/s."""

    algorithm: str
    protocol: str
    lat_us: float
    algbw: float  # bytes per ns

    def time_us(self, nbytes: int) -> float:
        return self.lat_us + nbytes / (1000.0 * self.algbw)


@dataclass(frozen=True)
class Choice:
    """What NCCL runs a collective with, and the time its model predicts."""

    algorithm: str
    protocol: str
    channels: int
    lat_us: float
    algbw: float  # GB/s, the model's algorithm bandwidth (bandwidth term only)
    time_us: float
    peer_bw: float = 0.0  # p2p: GB/s of one connection to a peer inside the node (0: not capped)
    net_bw: float = 0.0  # p2p across nodes: GB/s a GPU's channels move from its remote peers (0: not capped)
    fill_us: float = 0.0  # pipeline fill NCCL's model leaves out (pipeline.py), charged on top of its time
    fit_us: float = 0.0  # the part of lat_us that is NCCL's tree correction (a fit of measured trees: their fill)
    chan_net_bw: float = 0.0  # GB/s one network connection of a ring, tree or NVLS-Tree moves (0: no limit)
    chain_us: float = 0.0  # a ring's network hops NCCL's latency leaves out (ring_chain.py), charged on top of it
    proxy_us: float = 0.0  # what the busiest proxy's turns exceed NCCL's transfer by (proxy.py): the closed form's
    proxy_floor_us: float = 0.0  # the least time a network connection's bytes take: those turns less the fit (shape.py)
    transport: tuple[tuple[str, int], ...] = ()  # PCIe host: how many ring hops run P2P and SHM (pci_paths.py)
    path: str = ""  # PCIe host: the ring's farthest path type (PIX, PHB, SYS)
    pair_bw: tuple[tuple[int, int, float], ...] = ()  # p2p on a PCIe host: (src node, dst node, GB/s) of each pair
    search_fallback: bool = False  # rated on NCCL's 0.1 GB/s fallback ring (no ring fits the PCIe host's links)
    nccl_time_us: float = 0.0  # with search_fallback: NCCL's own estimate, the time its tuner chose by
    kernel: str = ""  # algorithm "sym": the symmetric kernel NCCL's picker runs (sym_kernels.py)
    registered: bool = False  # run on registered buffers (-R 1: NVLS's registered CTAs; register.py)
    ce_syncs: int = 0  # algorithm "ce": the syncs between the GPUs of a copy-engine collective (ce_coll.py)
    works: int = 1  # algorithm "sym": the calls of one NCCL group it runs as one kernel (nccl-tests' -m; register.py)
    plans: int = 1  # p2p calls of one group: the kernels NCCL's plan budget cuts them into (p2p_plans.py)

    def to_dict(self) -> dict[str, object]:
        return {
            "algorithm": T.NCCL_ALGO_NAMES.get(self.algorithm, self.algorithm),
            "protocol": self.protocol,
            "channels": self.channels,
            "model_lat_us": round(self.lat_us, 3),
            "model_algbw_gbs": round(self.algbw, 3),
            "model_time_us": round(self.time_us, 3),
            **({"kernel": self.kernel} if self.kernel else {}),
            **({"registered": True} if self.registered else {}),
            **({"ce_syncs": self.ce_syncs} if self.ce_syncs else {}),
            **({"group_calls": self.works} if self.works > 1 else {}),
            **({"plans": self.plans} if self.plans > 1 else {}),
            **({"peer_bw_gbs": round(self.peer_bw, 3)} if self.peer_bw else {}),
            **({"fill_us": round(self.fill_us, 3)} if self.fill_us else {}),
            **({"chain_us": round(self.chain_us, 3)} if self.chain_us else {}),
            **({"proxy_us": round(self.proxy_us, 3)} if self.proxy_us else {}),
            **({"transport": dict(self.transport), "path": self.path} if self.transport else {}),
            **(
                {"search_fallback": True, "nccl_model_time_us": round(self.nccl_time_us, 3)}
                if self.search_fallback
                else {}
            ),
        }


@lru_cache(maxsize=256)
def nvls_graph(p: Platform) -> Graph:
    """The NVLS graph: one channel per GPU of the node (at most 32), the fastest candidate that fits, a channel's
    head GPU carrying it twice (so n + 1 shares of each GPU's NVLink); across nodes, the fastest that fits a NIC."""
    n = min(T.NVLS_MAX_ARITY, p.ppn)
    if n < 2 or not p.nvls_fabric or p.compcap < 90:
        return Graph(0, 0.0, 0.0)
    fits = [s for s in T.SPEEDS_INTRA[p.arch] if (n + 1) * s <= p.nvls_gpu_bw + 1e-9]
    s = fits[0] if fits else T.SPEEDS_INTRA[p.arch][-1]
    inter = s
    if p.nnodes > 1:
        nic = [x for x in T.SPEEDS_INTER[p.arch] if x <= min(p.nic_bw, 2 * s) + 1e-9]
        inter = nic[0] if nic else T.SPEEDS_INTER[p.arch][-1]
    return Graph(n, s, inter)


def _nsteps(kind: str, n: int) -> int:
    return 2 * (n - 1) if kind == "all_reduce" else n - 1 if kind in ("all_gather", "reduce_scatter") else n


def _applies(kind: str, algo: str) -> bool:
    if kind in ("broadcast", "reduce"):
        return algo == "ring"
    if kind in ("all_gather", "reduce_scatter"):
        return algo in ("ring", "nvls", "pat")
    return algo != "pat"  # all_reduce


def costs(kind: str, p: Platform, st: NcclSettings, ring: Graph | None = None) -> list[Cost]:
    """NCCL's (latency, bandwidth) of every enabled (algorithm, protocol) for `kind` on `p`, on NCCL's ring graph
    or on `ring` (`achieved` passes the graph at the rate its kernel moves data)."""
    ring = ring or ring_graph(p)
    graphs = {"ring": ring, "tree": ring, "pat": ring, "nvls": nvls_graph(p), "nvls_tree": nvls_graph(p)}
    ix = p.index2
    arch, n, nn, ppn = p.arch, p.nranks, p.nnodes, p.ppn / 1.0
    ll_max = _ll_max(p)
    nsteps = _nsteps(kind, n)
    out = []
    for a in T.ALGORITHMS:
        if not _applies(kind, a) or not _algo_enabled(kind, a, p, st):
            continue
        g = graphs[a]
        for pi, proto in enumerate(T.PROTOCOLS):
            if a in ("nvls", "nvls_tree", "pat") and proto != "Simple":
                continue
            if not _proto_enabled(kind, proto, p, st):
                continue
            bw = g.bw_intra if nn <= 2 else g.bw_inter
            if a in ("nvls", "nvls_tree"):
                if g.nchannels < 2:
                    continue
                intra = g.bw_intra * T.NVLS_EFFICIENCY[arch] * (g.nchannels - 1) / g.nchannels
                intra *= 2.0 if kind == "all_reduce" else (ppn - 1) / ppn
                inter = g.bw_inter * (2 if nn <= 2 and a == "nvls_tree" else 1) if nn > 1 else math.inf
                cap = T.PER_CH_MAX_NVLS_TREE_BW[arch][ix] if a == "nvls_tree" else math.inf
                bw = min(intra, inter, cap)
            bus = g.nchannels * bw
            if a == "ring" and proto == "LL":
                bus = min(ll_max, bus * 0.5)
            if (a == "ring" and proto == "LL128") or (a == "tree" and kind == "all_reduce"):
                bus = capped_bus_bw(a, proto, p, bus, g.nchannels)  # the per-channel ceilings, NCCL's own CTAs
            if a == "tree" and proto == "LL":
                bus = min(bus / 3.8, ll_max)
            if a == "pat":
                bus *= 0.75
            if not (a != "ring" and kind in ("all_gather", "reduce_scatter")):
                bus *= n / nsteps if a in ("ring", "nvls", "nvls_tree") else 0.5
            lat = _latency(kind, a, pi, p, nsteps, net_overhead_us(p, st))
            if bus > 0:
                out.append(Cost(a, proto, lat, bus))
    return out


def _algo_enabled(kind: str, a: str, p: Platform, st: NcclSettings) -> bool:
    if a in ("nvls", "nvls_tree"):
        if not (st.nvls and p.nvls_fabric and p.compcap >= 90 and p.ppn > 1):
            return False
        if kind != "all_reduce" and p.ppn > T.NVLS_MAX_ARITY:
            return False
        if a == "nvls" and p.nnodes > 1:  # needs CollNet (SHARP switches) across nodes
            return False
        if a == "nvls_tree" and p.nnodes == 1:
            return False
    if a == "pat" and (not st.pat or p.nnodes != p.nranks):  # one GPU per node
        return False
    return st.algo_enabled(kind, a)


def _proto_enabled(kind: str, proto: str, p: Platform, st: NcclSettings) -> bool:
    if not st.proto_enabled(kind, proto):
        return False
    if proto == "LL128" and not st.protos_forced:
        return p.intra == "nvlink" or p.ppn == 1  # NCCL enables LL128 by default on NVLink-connected GPUs only
    return True


def net_overhead_us(p: Platform, st: NcclSettings) -> float:
    """`getNetOverhead`: the proxy's cost to post one network operation (µs): NCCL_NET_OVERHEAD (ns) if set, else
    2 on AMD hosts and 1 on any other."""
    return st.net_overhead_ns / 1000.0 if st.net_overhead_ns >= 0 else T.NET_OVERHEAD_US.get(p.cpu, 1.0)


def _ring_hop_us(pi: int, p: Platform, overhead: float) -> tuple[float, float]:
    """NCCL's latency (µs) of one ring step inside a node and of one across the network (protocol index `pi`):
    across nodes a step inside a node costs at least the net overhead (x3 for Simple)."""
    hw_intra = "nvlink" if p.intra == "nvlink" else "pci"
    intra = T.HW_LAT[hw_intra]["ring"][pi]
    inter = T.HW_LAT["net"]["tree" if p.ppn == 1 else "ring"][pi]
    if p.nnodes > 1:
        intra = max(intra, overhead * (3 if pi == 2 else 1))
    return intra, inter


def _latency(kind: str, a: str, pi: int, p: Platform, nsteps: int, overhead: float) -> float:
    """NCCL's latency (µs) of algorithm `a` with protocol index `pi` (the hardware inside a node is that of the
    algorithm's graph, tuning.cc `intraHw[a]`: NVLS's is NVLink with P2P off too)."""
    nvls_nvlink = a in ("nvls", "nvls_tree") and p.nvls_bw > 0
    hw_intra = "nvlink" if p.intra == "nvlink" or nvls_nvlink else "pci"
    hw = hw_intra if p.nnodes == 1 else "net"
    lat = T.BASE_LAT[a][pi]
    intra = T.HW_LAT[hw_intra][a][pi]
    inter = T.HW_LAT["net"]["tree" if p.ppn == 1 else a][pi]
    nn = p.nnodes
    log_nodes = int(math.log2(nn)) if nn > 1 else 0
    if a == "ring":
        if kind in ("broadcast", "reduce"):
            return lat + T.HW_LAT[hw][a][pi]  # same channels: one step
        intra, inter = _ring_hop_us(pi, p, overhead)
        inter_steps = ring_chain.nccl_inter_steps(kind, nn)
        return lat + (nsteps - inter_steps) * intra + inter_steps * inter
    if a == "tree":
        return lat + 2 * ((p.nranks // nn - 1) * intra + log_nodes * inter) if kind == "all_reduce" else lat
    if a == "nvls":
        return intra + (inter if nn > 1 else 0.0)
    if a == "nvls_tree":
        return lat + intra + 2 * log_nodes * inter
    return lat + log_nodes * inter / 3.5 + p.nranks * 2.8  # pat


def model_time_us(
    cost: Cost, kind: str, p: Platform, nbytes: int, channels: int, version: tuple[int, ...] = T.MODEL_NCCL_VERSION
) -> float:
    """`ncclTopoGetAlgoTime`: latency (with the ring plateau) plus bytes over bandwidth (tree-corrected; NVLS-Tree
    on Blackwell too where NCCL `version` corrects it, `nvls_tree_corrected`)."""
    bw, lat = cost.algbw, cost.lat_us
    log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
    if cost.algorithm == "tree" and kind == "all_reduce" and 0 <= log_size < 23:
        bw *= T.TREE_CORRECTION[cost.protocol][log_size]
    if nvls_tree_corrected(cost, kind, p, version) and 0 <= log_size < 24:
        bw *= T.TREE_CORRECTION[cost.protocol][log_size]
    plateau = nbytes // max(1, channels * p.nranks) >= 64
    ring_ar = cost.algorithm == "ring" and cost.protocol == "Simple" and p.nnodes > 1 and kind == "all_reduce"
    old = old_tuners.ring_plateau(version, p, nbytes) if ring_ar else None
    if old is not None:
        lat *= old
    elif ring_ar and plateau:
        lat *= T.RING_PLATEAU if p.compcap >= 80 else 1.9
    return lat + nbytes / (1000.0 * bw)


def nvls_tree_corrected(cost: Cost, kind: str, p: Platform, version: tuple[int, ...]) -> bool:
    """Whether NCCL `version` applies the tree correction to an NVLS-Tree all-reduce: from v2.29.2-1 on Blackwell
    with x86 hosts (tuning.cc `ncclTopoGetAlgoTime`: minCompCap >= 100, cpuArch X86, log2(bytes / 64) < 24)."""
    return (
        cost.algorithm == "nvls_tree"
        and kind == "all_reduce"
        and p.compcap >= 100
        and p.cpu in T.X86_CPUS
        and version[:2] >= T.NVLS_TREE_CORRECTION_FROM
    )


def tree_correction_us(cost: Cost, kind: str, nbytes: int, p: Platform | None = None) -> float:
    """The time (µs) NCCL's tree correction adds to its latency plus bytes over bandwidth. NCCL fitted the factor
    (tuning.cc `treeCorrectionFactor`, "trees are not perfectly sticking to the model for medium sizes") on
    measured trees, so it already holds their pipeline fill; `select` counts the fill only beyond it. From 2.29
    NCCL fits NVLS-Tree on Blackwell with the same factor up to 512 MiB (`nvls_tree_corrected`): a fit of the
    measured kernel on that hardware, so its time holds it whatever NCCL made the choice (`p`: the platform)."""
    log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
    nvls_tree = p is not None and nvls_tree_corrected(cost, kind, p, T.MODEL_NCCL_VERSION) and 0 <= log_size < 24
    if not nvls_tree and (cost.algorithm != "tree" or kind != "all_reduce" or not 0 <= log_size < 23):
        return 0.0
    factor = T.TREE_CORRECTION[cost.protocol][log_size]
    return nbytes / (1000.0 * cost.algbw) * (1.0 / factor - 1.0)


def run_channels(choice_algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int) -> int:
    """Channels the collective runs on: NVLS CTAs for NVLS, else comm channels reduced for small sizes."""
    if choice_algo in ("nvls", "nvls_tree"):
        return nvls_channels(p, st)
    nc = comm_channels(p, ring_graph(p), st)
    nt = T.MAX_THREADS[proto]
    threshold = ring_round_up.thread_threshold(choice_algo, proto, p)
    while nbytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    return nc


def nvls_tree_cost_2_2x(p: Platform) -> Cost | None:
    """NVLS-Tree all-reduce as NCCL 2.22-2.27 rate it (old_tuners.nvls_tree_rating); None where it does not run."""
    g = nvls_graph(p)
    rating = old_tuners.nvls_tree_rating(T.OLD_NVLS_TREE_TUNER[1], p, g.nchannels, g.bw_intra, g.bw_inter)
    return None if rating is None else Cost("nvls_tree", "Simple", rating[0], rating[1])


def _ll_max(p: Platform) -> float:
    """llMaxBw: LL's total ceiling, by GPU on one node and by CPU vendor on several."""
    return T.LL_MAX_BW[p.arch][p.index2] if p.nnodes == 1 else T.LL_MAX_BW_MULTINODE[p.cpu][p.index2]


def running_release(st: NcclSettings) -> old_tuners.Version:
    """The NCCL that runs, as old_tuners takes it: `st.nccl_release` where it names a patch of `st.nccl_version`,
    else (major, minor) alone (the minor's newest patch)."""
    r = st.nccl_release
    return r if r[2] and r[:2] == st.nccl_version else st.nccl_version


def rated(cost: Cost, kind: str, p: Platform, st: NcclSettings) -> Cost | None:
    """`cost` as the tuner of the NCCL that runs (`running_release`) rates it, for the choice only:
    where an older tuning.cc differs (old_tuners.py: ring and tree bandwidths and latencies, NVLS, NVLS-Tree and PAT
    ratings, and which of them exist), its figure; else 2.30's. None: that NCCL does not run it. The chosen
    algorithm's time stays the model's."""
    v, a, proto = running_release(st), cost.algorithm, cost.protocol
    if not old_tuners.available(v, a, kind):
        return None
    if a == "pat":
        f = old_tuners.pat_factor(v)
        return cost if f is None else Cost(a, proto, cost.lat_us, cost.algbw * f)
    pi = T.PROTOCOLS.index(proto)
    if a in ("ring", "tree"):
        ring, nsteps = ring_graph(p), _nsteps(kind, p.nranks)
        raw = ring.nchannels * (ring.bw_intra if p.nnodes <= 2 else ring.bw_inter)
        bus = old_tuners.graph_bus_bw(v, kind, a, proto, p, raw, ring.nchannels, _ll_max(p))
        algbw = cost.algbw if bus is None else bus * (p.nranks / nsteps if a == "ring" else 0.5)
        if a == "ring":
            lat = old_tuners.ring_lat_us(v, kind, pi, p, nsteps, net_overhead_us(p, st))
        else:
            lat = old_tuners.tree_lat_us(v, kind, pi, p)
        if bus is None and lat is None:
            return cost
        return Cost(a, proto, cost.lat_us if lat is None else lat, algbw)
    g = nvls_graph(p)
    if a == "nvls_tree":
        rating = old_tuners.nvls_tree_rating(v, p, g.nchannels, g.bw_intra, g.bw_inter, _nsteps(kind, p.nranks))
        return cost if rating is None else Cost(a, proto, rating[0], rating[1])
    if a == "nvls" and p.nnodes == 1:
        if old_tuners.release(v) < old_tuners.V2_18_1:  # v2.17 rates NVLS on the ring graph
            g = ring_graph(p)
        bw = old_tuners.nvls_algbw(v, kind, p, g.nchannels, g.bw_intra, g.bw_inter)
        lat = old_tuners.nvls_lat_us(v, p)
        if bw is None and lat is None:
            return cost
        return Cost(a, proto, cost.lat_us if lat is None else lat, cost.algbw if bw is None else bw)
    return cost


@lru_cache(maxsize=4096)  # a training step repeats the same calls: one search per distinct call
def select(kind: str, p: Platform, st: NcclSettings, nbytes: int, pipe_ops: int = 1) -> Choice | None:
    """NCCL's choice for a collective of `nbytes` (nccl-tests' size): the (algorithm, protocol) of least model
    time among those enabled. None if the user's NCCL_ALGO / NCCL_PROTO leave nothing (NCCL fails there too).
    `pipe_ops`: an aggregate of a group's calls, NCCL's numPipeOps, which charges its latency latCount times
    (`coll_group.lat_count`)."""
    if kind not in NSTEPS_KINDS or p.nranks < 2:
        return None
    best: tuple[float, Cost, int] | None = None
    comm = comm_channels(p, ring_graph(p), st)
    for cost in costs(kind, p, st):
        as_rated = rated(cost, kind, p, st)
        if as_rated is None:
            continue
        ch = run_channels(cost.algorithm, cost.protocol, p, st, nbytes)
        t = model_time_us(as_rated, kind, p, nbytes, comm, running_release(st))
        t += (coll_group.lat_count(st.nccl_version, cost.algorithm, pipe_ops) - 1) * as_rated.lat_us
        if best is None or t < best[0]:
            best = (t, cost, ch)
    if best is None:
        return None
    nccl_t, cost, ch = best
    if nbytes > 0:  # a buffer too small for one grain: NCCL divides by its zero chunk
        what = f"NCCL's {T.NCCL_ALGO_NAMES.get(cost.algorithm, cost.algorithm)}/{cost.protocol} {kind}"
        chunk = collective_chunk(kind, cost.algorithm, cost.protocol, p, st, nbytes, ch)
        refuse_empty_chunk(chunk, what, cost.protocol, st)
    fallback = cost.algorithm in GRAPH_ALGORITHMS and search_fallback(p)
    cost = achieved(cost, kind, p, st)  # NCCL's rating chose it; its kernel moves data at the links' rate
    t = model_time_us(cost, kind, p, nbytes, comm)
    ring = ring_kernel.applies(kind, cost.algorithm, cost.protocol, p)
    kernel = nvls_kernel_algbw(kind, p) if cost.algorithm == "nvls" else 0.0
    limit = channel_limit(cost.algorithm, cost.protocol, p, st, nbytes)
    if ring:  # its channels' share of the NVLink, no more in all than the GPU's ceiling (ring_kernel.kernel_busbw)
        kernel = ring_kernel.kernel_busbw(p, kind, limit) * p.nranks / _nsteps(kind, p.nranks)
    kernel = kernel or more_ctas_algbw(cost, kind, p, ch)
    algbw = kernel if ring else (kernel or cost.algbw) * limit
    apb = alg_per_bus(cost.algorithm, kind, p.nranks)  # then the protocol kernel's per-CTA rate over the same CTAs
    threads = ring_round_up.run_threads(kind, cost.protocol, p, nbytes, ch, cost.algorithm)
    share = cta_share(p, cost.protocol, ch, threads)
    algbw = proto_rate.capped_algbw(algbw, kind, cost.algorithm, cost.protocol, p, apb, share)
    if cost.algorithm == "ring":  # NCCL < 2.20's kernel rounds LL/LL128 chunks up: its busiest chunk sets the pace
        algbw /= ring_round_up.busiest_over_mean(kind, cost.protocol, p, st, nbytes, ch)
    fill = raw_fill = fill_us(cost.algorithm, cost.protocol, p, st, nbytes, ch, algbw, kind)
    fit = tree_correction_us(cost, kind, nbytes, p)
    if cost.algorithm in ("tree", "nvls_tree"):  # the correction already charges the mid-size shortfall: the larger
        fill = max(0.0, fill - fit)
    overhead = chunk_overhead_us(cost.algorithm, cost.protocol, p, st, nbytes, ch, kind)
    if ring:
        chunk = ring_simple_chunk(st, ring_kernel.RING_CHUNK_STEPS)
        fill += ring_kernel.fill_us(p, kind, nbytes, ch, chunk, limit)
        overhead += ring_kernel.pass_overhead_us(p, nbytes, ch, chunk)
    if overhead:
        algbw = nbytes / (nbytes / algbw + 1000.0 * overhead)  # the chunks' and passes' cost lowers the throughput
    lat = t - nbytes / (1000.0 * cost.algbw)
    lat += (coll_group.lat_count(st.nccl_version, cost.algorithm, pipe_ops) - 1) * cost.lat_us
    time = lat + nbytes / (1000.0 * algbw)
    chan = coll_net_channel_bw(cost.algorithm, cost.protocol, p, ch, st.nccl_version)
    chain = 0.0
    if cost.algorithm == "ring":  # counted only beyond NCCL's plateau factor, its fit of measured rings' latency
        intra, inter = _ring_hop_us(T.PROTOCOLS.index(cost.protocol), p, net_overhead_us(p, st))
        chain = ring_chain.extra_us(kind, _nsteps(kind, p.nranks), p.nnodes, p.ppn, intra, inter)
        chain = max(0.0, chain - (lat - cost.lat_us)) if chain else 0.0  # none: not lat's rounding error
    turns = proxy.service_us(kind, cost.algorithm, cost.protocol, p, st, nbytes, ch)
    floor = proxy.floor_us(turns, fit, raw_fill)
    serve = proxy.excess_us(floor, nbytes / (1000.0 * algbw))
    return Choice(
        cost.algorithm,
        cost.protocol,
        ch,
        lat,
        algbw,
        time,
        fill_us=fill,
        fit_us=fit,
        chan_net_bw=chan,
        chain_us=chain,
        proxy_us=serve,
        proxy_floor_us=floor,
        search_fallback=fallback,
        nccl_time_us=nccl_t if fallback else 0.0,
    )


def achieved(cost: Cost, kind: str, p: Platform, st: NcclSettings) -> Cost:
    """`cost` at the rate its kernel moves data: the same, except where NCCL's ring search fell back to its
    0.1 GB/s channel (a PCIe host: `channels.link_graph`). That figure is NCCL's tuning only, what `costs`,
    `rated` and `model_time_us` rate the choice with; the copy runs at what the host's links allow the ring."""
    if cost.algorithm not in GRAPH_ALGORITHMS or not search_fallback(p):
        return cost
    want = (cost.algorithm, cost.protocol)
    same = (c for c in costs(kind, p, st, link_graph(p)) if (c.algorithm, c.protocol) == want)
    return next(same, cost)


def channel_limit(algo: str, proto: str, p: Platform, st: NcclSettings, nbytes: int) -> float:
    """The share of NCCL's bandwidth left when the user caps the channels (CTAs) below those NCCL runs the call on:
    each channel is a CTA with its own copy throughput, which NCCL's model (search channels) does not scale down. A
    ring or tree call runs the channels `run_channels` leaves for its size (enqueue.cc `topoGetAlgoInfo` starts
    from comm->nChannels and drops one while the bytes are short of the threads' threshold), so the share is the
    capped call's channels over the uncapped call's at that size: a cap at or above the call's own channels takes
    nothing. NVLS and NVLS-Tree run the NVLS CTAs at every size. A whole-GPU ceiling binds the channels' sum, not
    each channel (`ring_kernel.kernel_busbw`)."""
    if algo in ("nvls", "nvls_tree"):
        return min(1.0, nvls_channels(p, st) / default_nvls_channels(p, st.nccl_version))
    own = run_channels(algo, proto, p, NcclSettings(), nbytes)
    return min(1.0, run_channels(algo, proto, p, st, nbytes) / own)


def cta_share(p: Platform, proto: str, channels: int, threads: int) -> float:
    """The CTAs a collective runs, weighted by their threads, over NCCL's default count of full CTAs: fewer under
    NCCL_MAX_NCHANNELS, more when NCCL_MIN_NCHANNELS / NCCL_MIN_CTAS open more and the size runs them all, and
    fewer for small sizes, where NCCL runs fewer channels and, a ring on one, fewer threads (`run_channels`,
    `ring_round_up.run_threads`: enqueue.cc `topoGetAlgoInfo`). A protocol kernel's per-CTA rate
    (`proto_rate.py`) scales with it; NCCL's own rating does not (its model keeps the search's channels)."""
    default = comm_channels(p, ring_graph(p), NcclSettings())
    return channels / default * threads / T.MAX_THREADS[proto]


def more_ctas_algbw(cost: Cost, kind: str, p: Platform, channels: int) -> float:
    """The algorithm bandwidth (GB/s) of a per-channel-capped pair (`cta_ceiling.py`) running `channels` CTAs, more
    than NCCL's default: its ceilings scale with them. 0 when it runs NCCL's default or fewer, or has no ceiling."""
    default = comm_channels(p, ring_graph(p), NcclSettings())
    ring = ring_graph(p)
    if channels <= default or (cost.algorithm == "tree" and kind != "all_reduce"):
        return 0.0
    graph_bus = ring.nchannels * (ring.bw_intra if p.nnodes <= 2 else ring.bw_inter)
    bus = raised_bus_bw(cost.algorithm, cost.protocol, p, graph_bus, ring.nchannels, channels / default)
    return max(cost.algbw, bus * alg_per_bus(cost.algorithm, kind, p.nranks)) if bus > 0 else 0.0


def alg_per_bus(algo: str, kind: str, nranks: int) -> float:
    """Algorithm over bus bandwidth of a ring (nranks / its steps) or a tree all-reduce (1/2), as `costs` has it."""
    return nranks / _nsteps(kind, nranks) if algo == "ring" else 0.5
