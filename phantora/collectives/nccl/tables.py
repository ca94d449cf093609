"""The constants of NCCL's cost model (NCCL 2.30, src/graph/tuning.cc, topo.h, search.cc, device.h).

Facts read from NVIDIA/nccl, restated as data: latencies in µs, bandwidths in GB/s (1e9 bytes/s). Indices follow
NCCL: architecture (Volta, Ampere, Hopper, Blackwell), and for the per-channel limits the node count (1, 2, >2).
"""

from __future__ import annotations

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree", "pat")  # NCCL's, less CollNet (needs SHARP switches)
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_ALGO_NAMES = {"tree": "Tree", "ring": "Ring", "nvls": "NVLS", "nvls_tree": "NVLSTree", "pat": "PAT"}
NCCL_FUNC_NAMES = {  # NCCL_ALGO / NCCL_PROTO prefixes
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "all_reduce": "AllReduce",
}
ARCHS = ("volta", "ampere", "hopper", "blackwell")

# Base latency of a collective (µs): kernel launch and set-up, per algorithm and protocol (LL, LL128, Simple).
BASE_LAT = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
    "pat": (8.0, 8.0, 8.0),
}
# Latency of one step over a link kind (µs), per algorithm and protocol.
HW_LAT = {
    "nvlink": {
        "tree": (0.6, 1.25, 4.0),
        "ring": (0.6, 1.9, 3.4),
        "nvls": (0.0, 0.0, 25.0),
        "nvls_tree": (0.0, 0.0, 25.0),
        "pat": (0.0, 0.0, 4.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 4.0),
        "ring": (1.0, 2.5, 5.7),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
        "pat": (0.0, 0.0, 4.0),
    },
    "net": {
        "tree": (5.0, 8.5, 14.0),
        "ring": (2.7, 4.0, 14.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls_tree": (0.0, 0.0, 20.9),
        "pat": (0.0, 0.0, 14.0),
    },
}
# LL's total bandwidth ceiling: one node by GPU architecture; several nodes by CPU (Intel row used), per node count.
LL_MAX_BW = {
    "volta": (39.0, 39.0, 20.4),
    "ampere": (87.7, 22.5, 19.0),
    "hopper": (141.0, 45.0, 35.0),
    "blackwell": (282.0, 90.0, 70.0),
}
# Several nodes: by the hosts' CPU vendor (NCCL's index1: AMD or mixed hosts take row 1, every other host row 0).
LL_MAX_BW_MULTINODE = {"intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0), "arm": (39.0, 39.0, 20.4)}
PER_CH_MAX_RING_LL128_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
PER_CH_MAX_TREE_LL128_BW = {
    "volta": (20.0, 20.0, 20.0),
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
PER_CH_MAX_TREE_BW = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0),
}
PER_CH_MAX_NVLS_TREE_BW = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (0.0, 57.7, 45.5),
    "blackwell": (0.0, 96.0, 80.0),
}
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
# Proxy post overhead per inter-node step (µs, x3 for Simple): `getNetOverhead`, 2 on x86 AMD hosts, else 1 (arm too).
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "arm": 1.0}
RING_PLATEAU = 1.4  # multi-node ring Simple all-reduce latency factor on SM80+ (1.9 before)
# Tree all-reduce bandwidth correction by log2(bytes / 64), 64 B .. 256 MiB, per protocol.
TREE_CORRECTION = {
    "LL": (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    "LL128": (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
        1.0,
    ),
    "Simple": (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
        0.9,
    ),
}

# Link bandwidths NCCL assumes (GB/s): NVLink per link by architecture, PCIe Gen3 x16.
NVLINK_BW_PER_LINK = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
NVLINK_RAW_PER_LINK = {"volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}  # data sheet, per direction
# The bus bandwidth (GB/s) a ring all-reduce kernel reaches at most inside one NVLink node, where it is below the
# NVLink: the whole GPU's, so its channels' sum (no reduce-scatter table shows it). A100 "about 230"
# (NVIDIA/nccl-tests#149, sjeaugey: 12 NVLinks give 240 of SM payload, "some other bottlenecks on the GPUs" hold
# the all-reduce to ~230; NCCL 2.9-2.17's tuner caps sm80 at 235). Not the link: on the same A100 host and NCCL
# the copying all-gather / all-to-all reach 254 (mscclpp's NDmv4 page). None on H100 (its ring all-reduce, 368,
# outruns its all-gather, 358: Together's tables).
RING_REDUCE_BUSBW_MAX = {"ampere": 230.0}
PCI_BW = 12.0
# The topology search's candidate per-channel bandwidths, fastest first: inside a node, across nodes.
SPEEDS_INTRA = {
    "volta": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "ampere": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12)
_INTER_SM90 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
SPEEDS_INTER = {
    "volta": _INTER,
    "ampere": _INTER,
    "hopper": _INTER_SM90,
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0) + _INTER_SM90[7:],
}

MAX_CHANNELS = 64  # MAXCHANNELS
RING_GRAPH_MAX_CHANNELS = 32  # the search's limit for ring and tree graphs (MAXCHANNELS / 2)
NVLS_MAX_ARITY = 32
NVLS_CHANNELS = {"hopper": 16, "blackwell": 24}  # NVLS CTAs by default (Blackwell: one node, 2.27+)
NVLS_CHANNELS_SM100 = 32  # Blackwell NVLS CTAs across nodes, and everywhere before 2.27 (nvls.cc)
NVLS_SM100_NVL_FROM = (2, 27)  # v2.27.3-1: 24 NVLS CTAs on Blackwell inside one node or MNNVL domain
NVLS_SM100_TREE_TUNING_FROM = (2, 30)  # v2.30.3-1: ncclNvlsTreeSm100Tuning
NVLS_TREE_CORRECTION_FROM = (2, 29)  # v2.29.2-1: treeCorrectionFactor on Blackwell NVLS-Tree (x86 hosts)
X86_CPUS = ("intel", "amd")  # Platform.cpu values that are x86 (NCCL_TOPO_CPU_ARCH_X86)
MODEL_NCCL_VERSION = (2, 30)  # the NCCL whose model tuning.py restates
OLD_NVLS_TREE_TUNER = ((2, 22), (2, 27))  # the NCCL versions whose NVLS-Tree rating first_use.py restates
NCCL_STEPS = 8
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # bytes per thread before another channel is opened
DEFAULT_BUFFSIZE = {"LL": 8 * 512 * 8 * 16, "LL128": 120 * 640 * 8 * 8, "Simple": 1 << 22}
NVLS_CHUNK = 128 * 1024  # NCCL_NVLS_CHUNKSIZE's default
P2P_CHUNK = {"net": 1 << 17, "pci": 1 << 17, "nvlink": 1 << 19}  # NCCL_P2P_{NET,PCI,NVL}_CHUNKSIZE
P2P_NET_CHUNK_ARM_FROM = (2, 29)  # v2.29.2-1 init.cc: the net p2p chunk x 2 on arm hosts of Blackwell GPUs (GBx)
P2P_LL_THRESHOLD = 16384  # send/recv of at most this many bytes per peer use LL
