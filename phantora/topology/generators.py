"""Topology generators: k-ary fat-tree, 2-tier leaf-spine, rail-optimised, DGX-like NVSwitch hosts, PCIe hosts.

Every generator numbers nodes the SimAI way (GPUs first, host-major; then NVSwitches; then leaves;
then spines; then cores), so rank i is GPU i and node ``gpu{i}``. Rates accept ``'400Gbps'`` or
an int in bits/s, times ``'1us'`` or an int in ns. Each returns a validated `Topology` whose
``meta`` records the generator, its parameters and the per-leaf oversubscription, and ``cpu``, the hosts'
CPU vendor (intel, amd or arm; NCCL's net overhead and multi-node LL ceiling follow it), when given.

DGX-like hosts (``gpus_per_host > 1``): the host's GPUs join one NVSwitch node (kind
``nvswitch``) at NVLink rate (from the ``gpu`` model: H100 = 3600 Gbps per direction) and each GPU
has its own NIC link to a leaf, as in SimAI. ``cpu_model`` (bdw, skl, icx, spr, gnr, emr, zen, arm: the classes of
NCCL's topology detection) names the hosts' CPU, which NCCL's PCIe view of a host with P2P off reads (its
inter-CPU link: phantora.collectives.nccl.nvlink_pci); unset, the DGX's of the GPU (A100 zen, H100 / H200 spr,
B200 emr: phantora.collectives.nccl.dgx_cpus). It also sets the vendor ``cpu`` when that is not given.

PCIe hosts (``pcie_host``): the host's GPUs join one PCIe switch (kind ``switch``) at the GPU's PCIe rate (the
``gpu`` model's host bandwidth: Gen4 x16 = 256 Gbps, Gen5 x16 = 512 Gbps per direction), no NVLink, no fabric.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction

from phantora.errors import InputError
from phantora.topology._util import Rate, Time, count, cpu_name, gpu_name, nvlink_default, rate_bps, ratio, time_ns
from phantora.topology.model import Topology

DEFAULT_NVLINK_LATENCY = "25ns"
DEFAULT_PCIE_GPU = "a100-pcie"  # pcie_host's GPU when none is named


def _hosts(
    topo: Topology,
    hosts: int,
    gpus_per_host: int,
    nvswitch: bool,
    nvlink_rate: Rate | None,
    nvlink_latency: Time,
) -> list[list[int]]:
    """Add hosts x gpus_per_host GPU nodes (then one NVSwitch per host); return GPU ids per host."""
    per_host = [
        [topo.add_node("gpu", f"gpu{h * gpus_per_host + g}", host=h) for g in range(gpus_per_host)]
        for h in range(hosts)
    ]
    if nvswitch and gpus_per_host > 1:
        bps = rate_bps(nvlink_rate, "nvlink_rate") if nvlink_rate is not None else nvlink_default(topo.gpu_model)
        if bps is None:
            raise InputError(f"GPU model {topo.gpu_model!r} has no NVLink: set nvswitch = false", field="nvswitch")
        lat = time_ns(nvlink_latency, "nvlink_latency")
        for h, gpus in enumerate(per_host):
            nv = topo.add_node("nvswitch", f"nvsw{h}", host=h)
            for g in gpus:
                topo.add_link(g, nv, bps, lat)
        topo.meta["nvlink_bps"] = bps
    return per_host


def _new(
    kind: str,
    name: str | None,
    gpu: str | None,
    params: Mapping[str, object],
    cpu: str | None,
    cpu_model: str | None = None,
) -> Topology:
    """An empty topology with the generator's meta: its parameters, the hosts' CPU vendor (`cpu`, else the vendor of
    `cpu_model`) and the CPU model NCCL's topology detection would find (`cpu_model`, validated)."""
    from phantora.collectives.nccl.pci_paths import CPU_MODELS, cpu_model_name

    topo = Topology(name=name or kind, gpu_model=gpu_name(gpu))
    vendor = cpu_name(cpu)
    topo.meta["generator"] = {"kind": kind, **{k: v for k, v in params.items() if v is not None}}
    if cpu_model is not None:
        model = cpu_model_name(cpu_model, vendor)
        topo.meta["cpu_model"] = model  # NCCL's PCIe view of the host (nvlink_pci.py), its inter-CPU link
        vendor = vendor or CPU_MODELS[model][0]
    if vendor is not None:
        topo.meta["cpu"] = vendor  # read by the NCCL model (phantora.collectives.nccl.platform.cpu_vendor)
    return topo


def _uplink(
    down_bps: int, spines: int, uplink_rate: Rate | None, oversubscription: float | int | None
) -> tuple[int, Fraction]:
    """The leaf-to-spine link rate and the resulting downlink:uplink ratio of one leaf."""
    if uplink_rate is not None and oversubscription is not None:
        raise InputError("give uplink_rate or oversubscription, not both", field="oversubscription")
    if uplink_rate is not None:
        up = rate_bps(uplink_rate, "uplink_rate")
    else:
        want = Fraction(ratio(oversubscription if oversubscription is not None else 1, "oversubscription"))
        up = round(Fraction(down_bps) / (spines * want))
        if up <= 0:
            raise InputError(
                f"oversubscription {oversubscription} leaves no uplink bandwidth", field="oversubscription"
            )
    return up, Fraction(down_bps, spines * up)


def fat_tree(
    k: int,
    *,
    link_rate: Rate = "100Gbps",
    latency: Time = "1us",
    gpus_per_host: int = 1,
    nvswitch: bool = True,
    nvlink_rate: Rate | None = None,
    nvlink_latency: Time = DEFAULT_NVLINK_LATENCY,
    gpu: str | None = None,
    cpu: str | None = None,
    cpu_model: str | None = None,
    name: str | None = None,
) -> Topology:
    """k-ary fat-tree: k pods of k/2 edge + k/2 aggregation switches, (k/2)^2 cores, k^3/4 GPUs.

    Edge switch e of a pod serves k/2 GPUs; aggregation switch a of every pod joins cores
    a*k/2 .. a*k/2 + k/2 - 1. All fabric links share one rate; full bisection bandwidth.
    """
    k = count(k, "k", 2)
    if k % 2:
        raise InputError(f"k must be even, got {k}", field="k")
    half = k // 2
    gpus_per_host = count(gpus_per_host, "gpus_per_host")
    if half % gpus_per_host:
        raise InputError(
            f"{gpus_per_host} GPUs per host do not divide the {half} ports of an edge switch", field="gpus_per_host"
        )
    bps, lat = rate_bps(link_rate, "link_rate"), time_ns(latency, "latency")
    params = {"k": k, "link_rate": link_rate, "latency": latency, "gpus_per_host": gpus_per_host}
    topo = _new("fat_tree", name or f"fattree-k{k}", gpu, params, cpu, cpu_model)
    hosts = _hosts(topo, k**3 // 4 // gpus_per_host, gpus_per_host, nvswitch, nvlink_rate, nvlink_latency)
    gpus = [g for h in hosts for g in h]
    edge = [[topo.add_node("switch", f"edge{p}.{i}", tier=1) for i in range(half)] for p in range(k)]
    agg = [[topo.add_node("switch", f"agg{p}.{i}", tier=2) for i in range(half)] for p in range(k)]
    core = [topo.add_node("switch", f"core{c}", tier=3) for c in range(half * half)]
    for j, g in enumerate(gpus):
        topo.add_link(g, edge[j // (half * half)][(j // half) % half], bps, lat)
    for p in range(k):
        for e in edge[p]:
            for a in agg[p]:
                topo.add_link(e, a, bps, lat)
        for i, a in enumerate(agg[p]):
            for c in range(half):
                topo.add_link(a, core[i * half + c], bps, lat)
    topo.meta["oversubscription"] = 1.0
    return topo.validate()


def leaf_spine(
    leaves: int,
    endpoints_per_leaf: int,
    spines: int,
    *,
    nic_rate: Rate = "400Gbps",
    uplink_rate: Rate | None = None,
    oversubscription: float | int | None = None,
    latency: Time = "1us",
    gpus_per_host: int = 1,
    nvswitch: bool = True,
    nvlink_rate: Rate | None = None,
    nvlink_latency: Time = DEFAULT_NVLINK_LATENCY,
    gpu: str | None = None,
    cpu: str | None = None,
    cpu_model: str | None = None,
    name: str | None = None,
) -> Topology:
    """2-tier leaf-spine: every leaf links once to every spine.

    Each leaf serves ``endpoints_per_leaf`` GPU NICs; whole hosts sit under one leaf. The uplink
    rate is ``uplink_rate``, or derived from ``oversubscription`` = leaf downlink capacity :
    leaf uplink capacity (default 1, non-blocking). ``spines = 0`` with one leaf is a star.
    """
    leaves = count(leaves, "leaves")
    per_leaf = count(endpoints_per_leaf, "endpoints_per_leaf")
    spines = count(spines, "spines", 0)
    if spines == 0 and leaves > 1:
        raise InputError(f"{leaves} leaves need at least one spine", field="spines")
    gpus_per_host = count(gpus_per_host, "gpus_per_host")
    if per_leaf % gpus_per_host:
        raise InputError(
            f"{gpus_per_host} GPUs per host do not divide {per_leaf} endpoints per leaf", field="gpus_per_host"
        )
    nic, lat = rate_bps(nic_rate, "nic_rate"), time_ns(latency, "latency")
    params = {
        "leaves": leaves,
        "endpoints_per_leaf": per_leaf,
        "spines": spines,
        "nic_rate": nic_rate,
        "uplink_rate": uplink_rate,
        "oversubscription": oversubscription,
        "latency": latency,
        "gpus_per_host": gpus_per_host,
    }
    topo = _new("leaf_spine", name or f"leafspine-{leaves}x{per_leaf}", gpu, params, cpu, cpu_model)
    hosts = _hosts(topo, leaves * per_leaf // gpus_per_host, gpus_per_host, nvswitch, nvlink_rate, nvlink_latency)
    gpus = [g for h in hosts for g in h]
    leaf = [topo.add_node("switch", f"leaf{i}", tier=1) for i in range(leaves)]
    spine = [topo.add_node("switch", f"spine{j}", tier=2) for j in range(spines)]
    for j, g in enumerate(gpus):
        topo.add_link(g, leaf[j // per_leaf], nic, lat)
    if spines:
        up, over = _uplink(per_leaf * nic, spines, uplink_rate, oversubscription)
        for lf in leaf:
            for sp in spine:
                topo.add_link(lf, sp, up, lat)
        topo.meta["oversubscription"] = float(over)
    return topo.validate()


def rail_optimized(
    hosts: int,
    gpus_per_host: int = 8,
    spines: int = 8,
    *,
    hosts_per_leaf: int | None = None,
    nic_rate: Rate = "400Gbps",
    uplink_rate: Rate | None = None,
    oversubscription: float | int | None = None,
    latency: Time = "1us",
    nvswitch: bool = True,
    nvlink_rate: Rate | None = None,
    nvlink_latency: Time = DEFAULT_NVLINK_LATENCY,
    gpu: str | None = None,
    cpu: str | None = None,
    cpu_model: str | None = None,
    name: str | None = None,
) -> Topology:
    """Rail-optimised fabric: GPU i of every host links to rail leaf i; every leaf links to every spine.

    With ``hosts_per_leaf`` < hosts, the hosts form groups of that size and each group has its own
    G rail leaves (leaf ``rail{i}.{group}``). Uplink rate as in `leaf_spine`.
    """
    hosts = count(hosts, "hosts")
    gpus_per_host = count(gpus_per_host, "gpus_per_host")
    spines = count(spines, "spines", 0)
    per_leaf = count(hosts_per_leaf if hosts_per_leaf is not None else hosts, "hosts_per_leaf")
    if hosts % per_leaf:
        raise InputError(f"hosts_per_leaf {per_leaf} does not divide {hosts} hosts", field="hosts_per_leaf")
    groups = hosts // per_leaf
    if spines == 0 and groups * gpus_per_host > 1:
        raise InputError("a rail-optimised fabric with more than one leaf needs spines", field="spines")
    nic, lat = rate_bps(nic_rate, "nic_rate"), time_ns(latency, "latency")
    params = {
        "hosts": hosts,
        "gpus_per_host": gpus_per_host,
        "spines": spines,
        "hosts_per_leaf": hosts_per_leaf,
        "nic_rate": nic_rate,
        "uplink_rate": uplink_rate,
        "oversubscription": oversubscription,
        "latency": latency,
    }
    topo = _new("rail_optimized", name or f"rail-{hosts}x{gpus_per_host}", gpu, params, cpu, cpu_model)
    per_host = _hosts(topo, hosts, gpus_per_host, nvswitch, nvlink_rate, nvlink_latency)
    rails = [
        [topo.add_node("switch", f"rail{r}" if groups == 1 else f"rail{r}.{g}", tier=1) for r in range(gpus_per_host)]
        for g in range(groups)
    ]
    spine = [topo.add_node("switch", f"spine{j}", tier=2) for j in range(spines)]
    for h, gpus in enumerate(per_host):
        for r, g in enumerate(gpus):
            topo.add_link(g, rails[h // per_leaf][r], nic, lat)
    if spines:
        up, over = _uplink(per_leaf * nic, spines, uplink_rate, oversubscription)
        for group in rails:
            for lf in group:
                for sp in spine:
                    topo.add_link(lf, sp, up, lat)
        topo.meta["oversubscription"] = float(over)
    return topo.validate()


def dgx_host(
    gpus_per_host: int = 8,
    *,
    nvlink_rate: Rate | None = None,
    nvlink_latency: Time = DEFAULT_NVLINK_LATENCY,
    gpu: str | None = None,
    cpu: str | None = None,
    cpu_model: str | None = None,
    name: str | None = None,
) -> Topology:
    """One DGX-like server: G GPUs on an NVSwitch, no fabric (for tensor-parallel runs on one host)."""
    gpus_per_host = count(gpus_per_host, "gpus_per_host", 2)
    params = {"gpus_per_host": gpus_per_host, "nvlink_rate": nvlink_rate, "nvlink_latency": nvlink_latency}
    topo = _new("dgx_host", name or f"dgx{gpus_per_host}", gpu, params, cpu, cpu_model)
    _hosts(topo, 1, gpus_per_host, True, nvlink_rate, nvlink_latency)
    return topo.validate()


def pcie_host(
    gpus_per_host: int = 8,
    *,
    sockets: int = 1,
    pcie_switch: bool = True,
    cpu_model: str | None = None,
    cpu_link_rate: Rate | None = None,
    pcie_latency: Time = DEFAULT_NVLINK_LATENCY,
    gpu: str | None = None,
    cpu: str | None = None,
    name: str | None = None,
) -> Topology:
    """One server of PCIe cards, no NVLink and no fabric: G GPUs, each on its own x16 link at the GPU model's PCIe
    rate, split evenly over `sockets` CPUs. With `pcie_switch` each socket's GPUs share one PCIe switch (NCCL's PIX
    path between them), else they sit on the CPU's root ports (PHB). A CPU is a switch node (``cpu<s>``) whenever
    the GPUs reach one another through it: its switch's uplink is x16 at the same rate, and the CPUs are joined by
    a link of `cpu_link_rate`, by default the figure NCCL gives the `cpu_model`'s inter-CPU link (topo.h: ``skl``
    and ``icx`` 10 GB/s, ``spr`` 22, ``emr`` 40, ``zen`` 16; phantora.collectives.nccl.pci_paths). NCCL's per-hop
    PCIe latency is its tuner's (phantora.collectives.nccl.tables.HW_LAT); `pcie_latency` is only the links'."""
    from phantora.collectives.nccl.pci_paths import cpu_model_name, inter_cpu_bw
    from phantora.perfmodel.gpus import get_gpu

    gpus_per_host = count(gpus_per_host, "gpus_per_host", 2)
    sockets = count(sockets, "sockets", 1)
    if gpus_per_host % sockets:
        raise InputError(f"{gpus_per_host} GPUs do not split evenly over {sockets} sockets", field="sockets")
    if not isinstance(pcie_switch, bool):
        raise InputError(f"expected true or false, got {pcie_switch!r}", field="pcie_switch")
    model = cpu_model_name(cpu_model, cpu_name(cpu))
    params = {
        "gpus_per_host": gpus_per_host,
        "sockets": sockets,
        "pcie_switch": pcie_switch,
        "cpu_model": cpu_model,
        "cpu_link_rate": cpu_link_rate,
        "pcie_latency": pcie_latency,
    }
    topo = _new("pcie_host", name or f"pcie{gpus_per_host}", gpu or DEFAULT_PCIE_GPU, params, cpu)
    bps = int(get_gpu(topo.gpu_model or DEFAULT_PCIE_GPU).host_bw) * 8
    lat = time_ns(pcie_latency, "pcie_latency")
    gpus = _hosts(topo, 1, gpus_per_host, False, None, pcie_latency)[0]
    per = gpus_per_host // sockets
    socket_of = [g // per for g in range(gpus_per_host)]
    through_cpu = sockets > 1 or not pcie_switch
    cpus = [topo.add_node("switch", f"cpu{s}", host=0) for s in range(sockets)] if through_cpu else []
    for s in range(sockets):
        mine = [g for g in gpus if socket_of[g] == s]
        if pcie_switch:
            sw = topo.add_node("switch", f"pcisw{s}", host=0)
            for g in mine:
                topo.add_link(g, sw, bps, lat)
            if cpus:
                topo.add_link(sw, cpus[s], bps, lat)
        else:
            for g in mine:
                topo.add_link(g, cpus[s], bps, lat)
    if sockets > 1:
        link = rate_bps(cpu_link_rate, "cpu_link_rate") if cpu_link_rate is not None else int(inter_cpu_bw(model) * 8e9)
        for a in range(sockets):
            for b in range(a + 1, sockets):
                topo.add_link(cpus[a], cpus[b], link, lat)
        topo.meta["cpu_link_bps"] = link
    topo.meta["pcie_bps"] = bps
    topo.meta["pcie"] = {"sockets": socket_of, "switch": pcie_switch, "cpu_model": model}
    return topo.validate()


GENERATORS: dict[str, Callable[..., Topology]] = {
    "fat_tree": fat_tree,
    "leaf_spine": leaf_spine,
    "rail_optimized": rail_optimized,
    "dgx_host": dgx_host,
    "pcie_host": pcie_host,
}
