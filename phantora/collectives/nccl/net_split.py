"""NCCL's NET transport between GPUs of one NVLink host with P2P off, where the host has NICs.

NVIDIA/nccl v2.17.1-1 to v2.30.7-1, paths.cc `ncclTopoCheckNet` (called by p2p.cc's and shm.cc's canConnect, and
net.cc's): a GPU pair goes over NET, not SHM, when both GPUs reach a NIC at PXB or closer faster than they reach
each other (`netSpeed > speed`, strictly); `NCCL_NET_DISABLE_INTRA=1` turns the rule off. With P2P off
(`NCCL_P2P_DISABLE=1`, `NCCL_P2P_LEVEL=LOC`) every GPU pair is diverted through the receiver's CPU
(`addInterStep`), so its speed is `min(x16, inter-CPU)` across sockets and the x16 inside one; a GPU reaches the NIC
under its PCIe switch at `min(x16, NIC)` (topo.cc: a NIC's bandwidth is its speed / 8000). A pair NCCL can reach
neither by P2P nor by SHM is marked PATH_NET (`ncclTopoComputePaths`), and `ncclTopoTrimSystem` keeps each rank the
GPUs joined to it below PATH_NET: each such group is one NCCL node (init.cc counts nodes by their rings' first
ranks), joined through the NICs by NCCL's multi-node algorithms.

So, on the DGX-like layout of `nvlink_pci.py` (two sockets, the x16 at the GPU's PCIe generation, the host's CPU
model): a same-socket pair never goes NET (its `x16` is no less than the NIC path), a cross-socket pair does when
`min(x16, NIC) > min(x16, inter-CPU)`: every DGX on 400G NICs (H100 / H200 `48 > 22`, B200 `48 > 40`, A100 on 200G
`24 > 16`). The host then is one NCCL node per socket. With `NCCL_SHM_DISABLE=1` every pair goes NET: one node per
GPU. A host without NICs (`dgx_host`) keeps its SHM ring (`nvlink_pci.py`). Where no pair is at NET
(`NCCL_NET_DISABLE_INTRA=1`, or NICs no faster than the CPU link), a communicator across hosts has one NCCL node a
host, SHM inside (`shm_hosts_bw`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from phantora.collectives.nccl.dgx_cpus import dgx_cpu_model
from phantora.collectives.nccl.nvlink_pci import GPUS_PER_SWITCH, SOCKETS, host_pci, named_vendor, p2p_off
from phantora.collectives.nccl.pci_paths import (
    CPU_MODELS,
    INTEL_P2P_OVERHEAD,
    LOC,
    PHB,
    Link,
    PciHost,
    hop_links,
    inter_cpu_bw,
    switch,
)
from phantora.collectives.nccl.pci_paths import link_bw as pci_link_bw
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.shm_order import node_order
from phantora.netsim.base import Flow
from phantora.topology.model import Node, Topology


def nic_gbs(topo: Topology, node: int) -> float:
    """GB/s of an endpoint's NIC (its fastest link to a switch, NCCL's speed / 8000), 0 without one."""
    rates = [topo.channel_bandwidth(ch) for v, ch in topo.neighbours(node) if topo.nodes[v].kind == "switch"]
    return max(rates, default=0) / 8e9


def domains(
    topo: Topology, nodes: Sequence[int], st: NcclSettings | None, gpu: str, link_bw: float
) -> tuple[tuple[int, int], ...] | None:
    """Each GPU's NCCL node as (host, part): a socket, or the GPU itself without SHM; None where NCCL keeps every
    host of the group whole (P2P on, the rule off, no NICs, no pair at NET)."""
    if st is None or not p2p_off(st) or not st.net_intra:
        return None
    memo: dict[tuple[object, ...], tuple[tuple[int, int], ...] | None]
    memo = topo.__dict__.setdefault("_nccl_net_domains", {})  # per topology: a run asks for each collective
    key = (tuple(nodes), st.shm, gpu, link_bw)
    if key not in memo:
        memo[key] = _domains(topo, nodes, st.shm, gpu, link_bw)
    return memo[key]


def _domains(
    topo: Topology, nodes: Sequence[int], shm: bool, gpu: str, link_bw: float
) -> tuple[tuple[int, int], ...] | None:
    """`domains` once its settings ask for P2P off and the NET rule on (`shm`: not NCCL_SHM_DISABLE=1)."""
    if not all(topo.nodes[n].kind == "gpu" and topo.nodes[n].host is not None for n in nodes):
        return None
    if any(nic_gbs(topo, n) <= 0 for n in nodes) or not _nvlink(topo, nodes):
        return None
    out = []
    model = cpu_model(topo, gpu)
    gpus_of: dict[int, list[int]] = {}
    for m in topo.nodes:
        if m.kind == "gpu" and m.host is not None:
            gpus_of.setdefault(m.host, []).append(m.id)
    for n in nodes:
        host = topo.nodes[n].host
        assert host is not None
        if not shm:
            out.append((host, n))
            continue
        local = gpus_of[host]
        sockets = SOCKETS if len(local) % SOCKETS == 0 else 1
        net = min(link_bw, nic_gbs(topo, n))
        cross = net > min(link_bw, inter_cpu_bw(model))  # ncclTopoCheckNet on a cross-socket pair
        out.append((host, local.index(n) // (len(local) // sockets) if cross and sockets > 1 else 0))
    by_host: dict[int, set[tuple[int, int]]] = {}
    for d in out:
        by_host.setdefault(d[0], set()).add(d)
    return tuple(out) if any(len(parts) > 1 for parts in by_host.values()) else None


def cpu_model(topo: Topology, gpu: str) -> str:
    """The hosts' CPU model as `nvlink_pci.host_pci` takes it."""
    return dgx_cpu_model(gpu, topo.meta.get("cpu_model"), named_vendor(topo))


def cpu_vendor(topo: Topology, gpu: str) -> str:
    """The vendor of `cpu_model`."""
    return CPU_MODELS[cpu_model(topo, gpu)][0]


def node_ring_bw(gpus: int, cpu: str, link_bw: float) -> float:
    """The most GB/s the ring channels of one NCCL node of `gpus` GPUs of one socket carry in all (NCCL's search
    over the trimmed system, search.cc `followPath`): `host_ring_capacity` on one socket of the DGX-like layout."""
    h = PciHost(
        sockets=(0,) * gpus,
        switched=True,
        cpu=cpu,
        inter_cpu_bw=0.0,
        link_bw=link_bw,
        comm_gpus=gpus,
        p2p_level=LOC,
        switch_of=tuple(k // GPUS_PER_SWITCH for k in range(gpus)),
    )
    return host_ring_capacity(h)


def host_ring_capacity(h: PciHost) -> float:
    """The most GB/s the ring channels of one NCCL node carry in all over its PCIe and CPU links, as NCCL's search
    finds them (search.cc v2.30.7-1): `ncclTopoSearchRecNet` enters from the first NIC at its first local GPU, 0,
    and with an NVSwitch in the system `ncclTopoSearchNextGpuSort` tries each GPU's previous first: 0, n-1, ..., 1
    (`shm_order.node_order`); the first ring found (`crossNic` 0, tried before 2) leaves its last GPU for the NIC
    it entered from (`ncclTopoSearchCheckNet`): under that GPU's own switch when it shares GPU 0's (PATH_PIX),
    else up to its CPU, across to GPU 0's socket and down GPU 0's switch. Each SHM hop goes up to the receiver's
    CPU and down (`hop_links`); `followPath` charges 6/5 on the PCIe links of a PATH_PHB path through an Intel
    CPU (an SHM hop, or the way out to the NIC), and the inter-CPU figure where the sockets differ."""
    order = node_order(len(h.sockets))
    head, tail = order[0], order[-1]
    intel = h.cpu == "intel"
    first, last = ("sw", switch(h, head)), ("sw", switch(h, tail))
    loads: dict[Link, float] = {(first, ("gpu", head)): 1.0}  # from the NIC (under the same switch) to GPU 0
    if first == last:  # the last GPU leaves for the NIC under its own switch (PATH_PIX)
        out: list[Link] = [(("gpu", tail), last)]
    else:
        ci, c0 = ("cpu", h.sockets[tail]), ("cpu", h.sockets[head])
        out = [(("gpu", tail), last), (last, ci), *([(ci, c0)] if ci != c0 else []), (c0, first)]
    pci_out = INTEL_P2P_OVERHEAD if intel and h.sockets[tail] == h.sockets[head] and first != last else 1.0
    for links, kind in (hop_links(h, i, j) for i, j in zip(order, order[1:], strict=False)):
        factor = INTEL_P2P_OVERHEAD if kind == PHB and intel else 1.0
        for link in links:
            loads[link] = loads.get(link, 0.0) + (1.0 if link[0][0] == link[1][0] == "cpu" else factor)
    for link in out:
        loads[link] = loads.get(link, 0.0) + (1.0 if link[0][0] == link[1][0] == "cpu" else pci_out)
    return min(pci_link_bw(h, link) / load for link, load in loads.items())


def shm_hosts_bw(
    topo: Topology, nodes: Sequence[int], blocks: Sequence[Sequence[int]], st: NcclSettings, gpu: str, bw: float
) -> float:
    """A communicator across NVLink hosts with NICs whose pairs inside a host NCCL keeps on SHM (P2P off, no pair
    at NET: `NCCL_NET_DISABLE_INTRA=1`, or NICs no faster than the CPU link): each host is one NCCL node, and this is
    the least of its hosts' node rings (`host_ring_capacity` over `nvlink_pci.host_pci`); 0 where that is not the
    case (no NICs). Kept per topology."""
    if any(nic_gbs(topo, n) <= 0 for n in nodes):
        return 0.0
    memo: dict[tuple[object, ...], float] = topo.__dict__.setdefault("_nccl_shm_hosts", {})
    key = (tuple(nodes), st.p2p_level, st.shm, gpu, bw)
    if key not in memo:
        memo[key] = min(host_ring_capacity(host_pci(topo, [nodes[i] for i in b], gpu, bw, st)) for b in blocks)
    return memo[key]


def _nvlink(topo: Topology, nodes: Sequence[int]) -> bool:
    """Whether two GPUs of the group share an NVSwitch (the hosts are NVLink hosts)."""
    by_host: dict[object, int] = {}
    for n in nodes:
        first = by_host.setdefault(topo.nodes[n].host, n)
        if first != n and topo.shared_nvswitch(first, n) is not None:
            return True
    return False


def split_view(topo: Topology, nodes: Sequence[int], parts: Sequence[tuple[int, int]]) -> Topology:
    """`topo` with each of `nodes` on a host of its own NCCL node (`parts`), everything else as it is: the same
    links, routes and ids, so `layout.host_blocks` groups the positions as NCCL's nodes. Kept per topology."""
    views: dict[tuple[tuple[int, tuple[int, int]], ...], Topology] = topo.__dict__.setdefault("_nccl_net_views", {})
    key = tuple(sorted(set(zip(nodes, parts, strict=True))))
    got = views.get(key)
    if got is None:
        moved = dict(key)
        fresh: dict[object, int] = {}
        new_nodes: list[Node] = []
        for node in topo.nodes:
            where = moved.get(node.id, (node.host, -1)) if node.host is not None else None
            host = fresh.setdefault(where, len(fresh)) if where is not None else None
            new_nodes.append(dataclasses.replace(node, host=host))
        got = Topology(topo.name, new_nodes, topo.links, topo.gpu_model, topo.meta, topo.ecmp_hash)
        order = topo.rank_order
        if order is not None:  # the same ranks on the same GPUs
            natural = {e: i for i, e in enumerate(n.id for n in topo.nodes if n.kind in ("gpu", "host"))}
            got = got.with_rank_order([natural[e] for e in order])
        got.__dict__[_BASE] = topo
        views[key] = got
    return got


_BASE = "_nccl_split_of"  # a split view's attribute: the topology it was made from


def base_of(topo: Topology) -> Topology:
    """The topology a split view was made from (`split_view`), else `topo`: NCCL's nodes are read from it, so a
    view asked again is not split again."""
    base: Topology = topo.__dict__.get(_BASE, topo)
    return base


def through_nics(flows: list[Flow], view: Topology, base: Topology) -> list[Flow]:
    """`flows` (built on `view`) with those between two NCCL nodes of one NVLink host set to leave through the
    NICs (`Flow.via_nic`): GPU -> its NIC -> the fabric -> the peer's NIC -> GPU, as NCCL's NET transport runs."""
    out = []
    for f in flows:
        apart = f.src != f.dst and view.nodes[f.src].host != view.nodes[f.dst].host
        if apart and base.shared_nvswitch(f.src, f.dst) is not None:
            f = dataclasses.replace(f, via_nic=True)
        out.append(f)
    return out
