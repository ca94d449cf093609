"""What NCCL's tuner sees of a communicator: GPU generation, nodes, GPUs per node, NVLink, NVSwitch, NICs, CPU.

Read from the topology (`gpu` model, links and NVSwitches) for one group of ranks. Bandwidths are in NCCL's own
units and conventions (GB/s, `tables.py`): an NVLink is worth NCCL's per-link figure, not the data sheet's, because
that is what NCCL's search and cost model assume a GPU can push through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from phantora.collectives.layout import host_blocks
from phantora.collectives.nccl import net_split
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.cpu_vendor import vendor_named
from phantora.collectives.nccl.nvlink_pci import host_pci, p2p_off
from phantora.collectives.nccl.pci_paths import CPU_MODELS, UNSET, PciHost, cpu_model_name, inter_cpu_bw
from phantora.collectives.nccl.settings import NcclSettings
from phantora.errors import InputError
from phantora.topology.model import Topology

DEFAULT_GPU = "h100"  # topologies without a GPU model (HPCC files of plain hosts) are taken as H100 hosts


@dataclass(frozen=True)
class Platform:
    """One communicator as NCCL's tuner sees it."""

    arch: str  # volta | ampere | hopper | blackwell
    compcap: int  # e.g. 90
    nranks: int
    nnodes: int
    ppn: int  # ranks per node (the largest node's count)
    intra: str  # "nvlink" | "pci": how GPUs of one node reach each other
    nvswitch: bool
    gpu_intra_bw: float  # GB/s one GPU can push to its peers inside the node, in NCCL's units
    nic_bw: float  # GB/s of one NIC (line rate / 8); 0 when the group stays in one node
    nics_per_node: int
    cpu: str = "intel"  # intel | amd | arm: the hosts' CPU as NCCL classes it (`cpu_vendor`); see tables.X86_CPUS
    sm_clock_ghz: float = 0.0  # the GPU's SM (boost) clock; 0: unknown (the kernels' cycle costs then take H100's)
    pci: PciHost | None = None  # one PCIe host's sockets, switches and P2P settings (pci_paths.py), if described
    node_bw: float = 0.0  # NCCL nodes that are NVLink hosts, or their sockets, with P2P off: what their ring
    # carries over PCIe and CPU links (net_split.py)
    nvls_bw: float = 0.0  # P2P off on an NVSwitch: the GPU's NVLink GB/s that NCCL's NVLS graph still runs on
    # (`nvswitch` and `gpu_intra_bw` are then the ring's PCIe view; nvls.cc has no P2P gate: `nvls_fabric`)

    @property
    def nvls_fabric(self) -> bool:
        """Whether NCCL's NVLS search finds the NVSwitch: GPUs of a node share one, with P2P on or off (nvls.cc
        `ncclNvlsInit` reads only NCCL_NVLS_ENABLE, the GPU count and multicast; search.cc's NVLS pattern follows
        the GPU <-> NVSwitch paths, which P2P off does not divert, v2.19.4-1 to v2.30.7-1)."""
        return self.nvswitch or self.nvls_bw > 0

    @property
    def nvls_gpu_bw(self) -> float:
        """GB/s of one GPU's NVLink as NCCL's NVLS search sees it."""
        return self.nvls_bw or self.gpu_intra_bw

    @property
    def index2(self) -> int:
        """NCCL's node-count index: 0 for one node, 1 for two, 2 for more."""
        return min(self.nnodes, 3) - 1


def arch_of(compcap: int) -> str:
    return "blackwell" if compcap >= 100 else "hopper" if compcap >= 90 else "ampere" if compcap >= 80 else "volta"


def platform_of(topo: Topology, ranks: tuple[int, ...], st: NcclSettings | None = None) -> Platform:
    """The platform of a group of global ranks on `topo`, under the NCCL variables of `st` (default: none set)."""
    from phantora.perfmodel.gpus import get_gpu

    try:
        gpu = get_gpu(topo.gpu_model or DEFAULT_GPU)
    except InputError:
        gpu = get_gpu(DEFAULT_GPU)
    major, minor = gpu.capability
    compcap = major * 10 + minor if major else 90
    arch = arch_of(compcap)
    topo = net_split.base_of(topo)  # a split view's NCCL nodes are its base's
    nodes = [topo.node_of_rank(r) for r in ranks]
    pcie_bw = max(T.PCI_BW, gpu.host_bw / 1e9 * T.PCI_BW / 16.0)  # PCIe Gen3 x16 = 12 GB/s
    split = net_split.domains(topo, nodes, st, gpu.name, pcie_bw)  # NCCL nodes of NET pairs (net_split.py)
    blocks = host_blocks(topo, nodes) if split is None else _blocks(split)
    ppn = max(len(b) for b in blocks)
    nvswitch = any(topo.shared_nvswitch(nodes[b[0]], nodes[b[1]]) is not None for b in blocks if len(b) > 1)
    nvl_bps = nvlink_bps(topo, nodes[0])
    off = bool(nvl_bps) and len(blocks) == 1 and ppn > 1 and p2p_off(st)  # NCCL's PCIe ring (nvlink_pci.py)
    off = off or split is not None  # SHM inside each NCCL node, NET between them
    node_bw = net_split.node_ring_bw(ppn, net_split.cpu_vendor(topo, gpu.name), pcie_bw) if split else 0.0
    if not off and nvl_bps and ppn > 1 and p2p_off(st):  # hosts kept whole on SHM, NET between them
        assert st is not None
        node_bw = net_split.shm_hosts_bw(topo, nodes, blocks, st, gpu.name, pcie_bw)
        off = node_bw > 0  # else (no NICs) refused: check_transports
    nvl_bw = nvl_bps / 8e9 / T.NVLINK_RAW_PER_LINK[arch] * T.NVLINK_BW_PER_LINK[arch] if nvl_bps else 0.0
    if nvl_bps and not off:
        intra, intra_bw = "nvlink", nvl_bw
    else:
        intra, intra_bw = "pci", pcie_bw
    nic_bps = _nic_bps(topo, nodes[0]) if len(blocks) > 1 else 0
    return Platform(
        arch=arch,
        compcap=compcap,
        nranks=len(ranks),
        nnodes=len(blocks),
        ppn=ppn,
        intra=intra,
        nvswitch=nvswitch and not off,
        gpu_intra_bw=intra_bw,
        nic_bw=nic_bps / 8e9,
        nics_per_node=ppn if nic_bps else 0,
        cpu=cpu_vendor(topo),
        sm_clock_ghz=gpu.clock_hz / 1e9,
        pci=_pci_host(topo, nodes, gpu.name, intra_bw, st, off) if intra == "pci" and len(blocks) == 1 else None,
        node_bw=node_bw,
        nvls_bw=nvl_bw if off and nvswitch else 0.0,  # P2P off leaves NVLS its NVLink (tuning.nvls_graph)
    )


def nccl_view(topo: Topology, ranks: tuple[int, ...], st: NcclSettings | None) -> Topology:
    """`topo` as NCCL's nodes group `ranks`: its split view where NCCL runs GPU pairs of one host over NET
    (`net_split.split_view`: one host per NCCL node), else `topo` itself."""
    from phantora.perfmodel.gpus import get_gpu

    if st is None or not p2p_off(st) or len(ranks) < 2:
        return topo
    topo = net_split.base_of(topo)
    try:
        gpu = get_gpu(topo.gpu_model or DEFAULT_GPU)
    except InputError:
        gpu = get_gpu(DEFAULT_GPU)
    nodes = [topo.node_of_rank(r) for r in ranks]
    split = net_split.domains(topo, nodes, st, gpu.name, max(T.PCI_BW, gpu.host_bw / 1e9 * T.PCI_BW / 16.0))
    return topo if split is None else net_split.split_view(topo, nodes, split)


def _blocks(parts: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """Positions grouped by their NCCL node, nodes in order of first appearance (as `host_blocks`)."""
    out: dict[tuple[int, int], list[int]] = {}
    for pos, part in enumerate(parts):
        out.setdefault(part, []).append(pos)
    return list(out.values())


def _pci_host(
    topo: Topology, nodes: list[int], gpu: str, link_bw: float, st: NcclSettings | None, nvlink_off: bool
) -> PciHost | None:
    """The group's PCIe host as the `pcie_host` generator describes it (topology meta "pcie"), an NVLink host's
    with P2P off as `nvlink_pci.host_pci` lays it out, or None."""
    if nvlink_off:
        assert st is not None
        return host_pci(topo, nodes, gpu, link_bw, st)
    desc = topo.meta.get("pcie")
    if not isinstance(desc, dict):
        return None
    sockets, model = list(desc["sockets"]), str(desc["cpu_model"])
    return PciHost(
        sockets=tuple(int(sockets[n]) for n in nodes),
        switched=bool(desc["switch"]),
        cpu=CPU_MODELS[model][0],
        inter_cpu_bw=inter_cpu_bw(model),
        link_bw=link_bw,
        comm_gpus=len(nodes),
        p2p_level=st.p2p_level if st is not None else UNSET,
        shm=st.shm if st is not None else True,
    )


def cpu_vendor(topo: Topology) -> str:
    """The hosts' CPU as NCCL's topology detection classes it (topo.cc `kvDictCpuArch`, `kvDictCpuVendor`): "arm"
    (arch arm64: NVIDIA Grace, as on GB200), "amd" (x86 AuthenticAMD) or "intel" (x86 GenuineIntel; NCCL gives any
    other x86 vendor Intel's figures). Read from the topology's meta "cpu" (a vendor, or a table's free text such as
    "2x AMD EPYC 7742" or "arm (NVIDIA Grace)"), else from its "cpu_model" (`pci_paths.CPU_MODELS`); neither: Intel.
    A "cpu" that names none of them, a "cpu_model" not in CPU_MODELS, or the two disagreeing is a one-line error."""
    raw, model = topo.meta.get("cpu"), topo.meta.get("cpu_model")
    vendor = vendor_named(raw)
    if model is not None:
        return CPU_MODELS[cpu_model_name(model, vendor)][0]
    return vendor or "intel"


def nvlink_bps(topo: Topology, node: int) -> int:
    """Bits/s of the endpoint's link to its NVSwitch, or 0 if it has none."""
    for v, ch in topo.neighbours(node):
        if topo.nodes[v].kind == "nvswitch":
            return topo.channel_bandwidth(ch)
    return 0


def _nic_bps(topo: Topology, node: int) -> int:
    """Bits/s of the endpoint's own NIC: its fastest link that is not NVLink."""
    rates = [topo.channel_bandwidth(ch) for v, ch in topo.neighbours(node) if topo.nodes[v].kind != "nvswitch"]
    return max(rates, default=0)
