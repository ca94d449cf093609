"""The host CPUs of a GPU server and what a host op costs on them: the host side of the compute model.

One `HostSpec` per host model, from its data sheets (docs/runtime.md "Host compute" cites each): sockets, cores,
base clock, SIMD width and FMA units (peak FP32 FLOP/s), memory channels and their transfer rate (peak DRAM
bandwidth). A host op (a CPU optimizer's update, a CPU tensor op of a program that uses the GPU) is timed as a
roofline on the rank's share of the host: `max(bytes / bandwidth, flops / peak)`, where the rank gets
`min(threads, cores / ranks)` cores (its threads, at most its share of the host's cores when `ranks` ranks of the
job share the host) and `min(cores x core_bw, MEM_EFF x DRAM bandwidth / ranks)` of the memory: all ranks of a
data-parallel job step their optimizers at the same time, so each has 1/ranks of the sockets' bandwidth.

An op that allocates its output afresh pays for the output's pages too when the allocation is large: glibc serves
a request of at least `MMAP_MAX` (its dynamic mmap threshold's ceiling, 32 MiB on 64-bit) with a fresh mapping and
unmaps it on free, so every step the op's first touch faults each 4 KiB page in and the kernel zeroes it
(`fault_ns`: `FAULT_NS` a page, one page at a time for the process). Smaller outputs come back from the heap warm.

A copy between host and GPU moves over the GPU's PCIe link (`GpuSpec.host_bw`, per direction): from pinned memory
by DMA at `PCIE_EFF` of the link; from pageable memory the CUDA driver first copies the data into a pinned staging
buffer on the calling thread (one core reads and writes each byte), so it runs at the slower of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from phantora.errors import InputError

GIGA = 10**9
MEM_EFF = 0.75  # sustained share of the theoretical DRAM bandwidth (a-priori, not fitted; docs/runtime.md)
PCIE_EFF = 0.8  # a pinned DMA copy's share of the PCIe link (a-priori, not fitted; docs/runtime.md)
COPY_FLOOR_NS = 1000  # a host<->device copy's fixed cost (the memcpy curves' floor, perfmodel/curves.py)
GRAIN = 32768  # torch's at::internal::GRAIN_SIZE: a CPU op on fewer elements runs on one thread
PAGE_BYTES = 4096  # a base page: torch's CPU allocator asks for no huge pages unless THP_MEM_ALLOC_ENABLE is set
MMAP_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: a larger allocation is always a fresh mapping
FAULT_NS = 500  # ~ one minor fault of a fresh page: the trap, allocation and mapping (~250 ns) and zeroing 4 KiB
# at ~16 GB/s (~250 ns); a-priori, not fitted (docs/runtime.md "Host compute")


@dataclass(frozen=True)
class HostSpec:
    """One host model: its CPUs and their memory. Rates in bytes/s and FLOP/s."""

    name: str
    label: str  # the CPUs, as the data sheet names them
    sockets: int
    cores_per_socket: int
    clock_hz: float  # base clock (a vector loop on all cores runs near it, not at the single-core boost)
    simd_f32: int  # FP32 lanes of a vector unit (AVX-512: 16, AVX2: 8)
    fma_units: int  # vector FMA units per core
    channels_per_socket: int
    mts: int  # memory transfers per second (millions): DDR5-4800 -> 4800
    core_bw: float  # one core's sustained DRAM bandwidth (~: derived, docs/runtime.md)
    gpus: tuple[str, ...] = field(default=())  # phantora.perfmodel.gpus names whose DGX this host is
    aliases: tuple[str, ...] = field(default=())

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def mem_bw(self) -> float:
        """Theoretical DRAM bandwidth of all sockets: channels x MT/s x 8 bytes."""
        return self.sockets * self.channels_per_socket * self.mts * 1e6 * 8

    @property
    def core_flops(self) -> float:
        """Peak FP32 FLOP/s of one core: clock x lanes x FMA units x 2."""
        return self.clock_hz * self.simd_f32 * self.fma_units * 2


HOSTS: dict[str, HostSpec] = {
    h.name: h
    for h in (
        HostSpec(
            "dgx-h100",  # DGX H100 / H200 data sheets; Intel ARK Xeon Platinum 8480+: 56 cores, DDR5-4800 x 8
            "2x Intel Xeon Platinum 8480C",
            2,
            56,
            2.0e9,
            16,
            2,
            8,
            4800,
            25.6 * GIGA,
            gpus=("h100", "h100-96gb", "h200"),
            aliases=("dgx-h200",),
        ),
        HostSpec(
            "dgx-a100",  # DGX A100 data sheet; AMD EPYC 7742: 64 cores, DDR4-3200 x 8, Zen 2 (2 x 256-bit FMA)
            "2x AMD EPYC 7742",
            2,
            64,
            2.25e9,
            8,
            2,
            8,
            3200,
            25.6 * GIGA,
            gpus=("a100", "a100-40gb"),
        ),
        HostSpec(
            "dgx-b200",  # DGX B200 data sheet; Intel ARK Xeon Platinum 8570: 56 cores, DDR5-5600 x 8
            "2x Intel Xeon Platinum 8570",
            2,
            56,
            2.1e9,
            16,
            2,
            8,
            5600,
            25.6 * GIGA,
            gpus=("b200",),
        ),
        HostSpec(
            "dgx-2",  # DGX-2 data sheet (ZeRO-Offload's host); Intel ARK Xeon Platinum 8168: 24 cores, DDR4-2666 x 6
            "2x Intel Xeon Platinum 8168",
            2,
            24,
            2.7e9,
            16,
            2,
            6,
            2666,
            22.8 * GIGA,
        ),
    )
}
DEFAULT_HOST = "dgx-h100"  # a GPU without a DGX of its own (the PCIe cards, L40S)


def _squash(name: str) -> str:
    return "".join(c for c in str(name).strip().lower() if c not in "-_ ")


def get_host(name: str | HostSpec) -> HostSpec:
    """A host by name or alias (case-insensitive, `-`, `_` and spaces ignored); InputError naming the known ones."""
    if isinstance(name, HostSpec):
        return name
    key = _squash(name)
    for h in HOSTS.values():
        if key == _squash(h.name) or key in {_squash(a) for a in h.aliases}:
            return h
    raise InputError(f"unknown host {name!r} (known: {', '.join(HOSTS)})", field="host")


def host_of_gpu(gpu: str) -> HostSpec:
    """The host of the DGX built on `gpu` (a phantora.perfmodel.gpus name), else DEFAULT_HOST's."""
    for h in HOSTS.values():
        if gpu in h.gpus:
            return h
    return HOSTS[DEFAULT_HOST]


@dataclass(frozen=True)
class RankShare:
    """What one rank has of its host: cores (may be fractional when ranks x threads oversubscribe the host),
    DRAM bandwidth (bytes/s) and FP32 peak (FLOP/s)."""

    cores: float
    bw: float
    flops: float


def rank_share(host: HostSpec, ranks: int, threads: int) -> RankShare:
    """The share of `host` a rank gets with `threads` threads when `ranks` ranks of the job run on it."""
    if ranks < 1 or threads < 1:
        raise InputError(f"ranks and threads must be >= 1, got {ranks} and {threads}", field="host")
    cores = min(float(threads), host.cores / ranks)
    bw = min(cores * host.core_bw, MEM_EFF * host.mem_bw / ranks)
    return RankShare(cores, bw, cores * host.core_flops)


def op_ns(share: RankShare, nbytes: int, flops: int = 0, elements: int = GRAIN) -> int:
    """A host op's time on a rank's share: the roofline of its bytes and FLOPs. An op on fewer than GRAIN elements
    runs on one thread, as torch's parallel_for keeps it."""
    bw, peak = share.bw, share.flops
    if elements < GRAIN and share.cores > 1:
        bw, peak = bw / share.cores, peak / share.cores
    return math.ceil(max(nbytes / bw, flops / peak) * 1e9) if nbytes or flops else 0


def fault_ns(fresh: int) -> int:
    """The page faults of `fresh` bytes of newly mapped output, first touched by the op: FAULT_NS a 4 KiB page, one
    at a time (a process's faults take its memory map's lock and the page allocator's; modelled serial)."""
    return -(-fresh // PAGE_BYTES) * FAULT_NS if fresh >= MMAP_MAX else 0


def copy_ns(nbytes: int, link_bw: float, pinned: bool, host: HostSpec) -> int:
    """A host<->device copy of `nbytes` over a PCIe link of `link_bw` bytes/s per direction: from pinned memory at
    PCIE_EFF of the link; from pageable memory at most half a core's bandwidth (the driver's staging copy reads and
    writes each byte on the calling thread), pipelined with the DMA."""
    rate = PCIE_EFF * link_bw
    if not pinned:
        rate = min(rate, host.core_bw / 2)
    return COPY_FLOOR_NS + math.ceil(nbytes / rate * 1e9)
