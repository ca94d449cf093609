"""P2P off on NVLink hosts that have NICs: NCCL's NET transport between the sockets of one host (net_split.py).

NVIDIA/nccl v2.30.7-1 paths.cc `ncclTopoCheckNet` (called by p2p.cc's and shm.cc's canConnect): a pair runs NET when
both GPUs reach a NIC at PXB or closer faster than each other. With NCCL_P2P_DISABLE=1 a pair is diverted through the
receiver's CPU: `min(x16, inter-CPU)` across sockets (H100 on Sapphire Rapids: min(48, 22) = 22), the x16 inside one
(48); the GPU reaches its NIC at min(x16, 400G / 8 = 50) = 48. So the cross-socket pairs run NET (48 > 22), the
same-socket ones SHM (48 is not above 48), `ncclTopoTrimSystem` leaves each rank its socket: 2 NCCL nodes a host.
NCCL_NET_DISABLE_INTRA=1 turns the rule off (one host: the SHM ring of nvlink_pci.py).

Each NCCL node's ring enters its first GPU from that GPU's NIC (down its PCIe switch), crosses the socket's other 3
GPUs over SHM, each GPU's previous first (0 3 2 1: nccl/shm_order.py; each hop up to the CPU and down, 6/5 on Intel's
PCIe links) and leaves the last, 1, through the NIC it entered by, under their shared switch: switch 1's uplink
carries hops 3->2 and 2->1, 2 x 6/5 = 2.4 GB/s per GB/s of ring, so the ring carries 48 / 2.4 = 20.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.channels import ring_graph
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host, rail_optimized

N = 8
GEN5 = 16 * 240 / 80.0  # ncclTopoAddPci: width x speed / 80 = 48 GB/s
NIC = 400 / 8  # topo.cc: speed (Mb/s) / 8000 = 50 GB/s
INTEL = 6 / 5
NODE_RING = GEN5 / (2 * INTEL)  # switch 0's uplink: hops 0->1 and 1->2 at 6/5: 20 GB/s
SKL_QPI = 10.0  # topo.h SKL_QPI_BW
GIB = 1 << 30
# NVLS, which P2P off leaves on (tests/test_nccl_nvls_p2p_off.py), off: these tests check the ring over the NCCL nodes
P2P_OFF = {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}


def _opts(**env: str) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


def _run_ns(topo: object, flows: list) -> int:
    sim = FlowSimulator(topo)  # type: ignore[arg-type]
    sim.submit(flows, at=0)
    return max(c.end_ns for c in sim.drain())


def _ring_time_us(choice: dict, n: int, size: int, busbw: float) -> float:
    """NCCL's ring all-reduce: its latency plus 2 (n - 1) / n of the bytes at the bus bandwidth."""
    return float(choice["model_lat_us"]) + size * 2 * (n - 1) / n / (1000 * busbw)


@pytest.mark.parametrize("env", [P2P_OFF, {"NCCL_P2P_LEVEL": "LOC"}])
def test_one_fabric_host_is_two_nccl_nodes(env: dict[str, str]) -> None:
    """A communicator of one DGX host of a rail fabric: 2 nodes of 4 GPUs (its sockets), SHM inside, no NVSwitch
    (no NVLS), the NICs' 50 GB/s between; the node's ring carries 20 GB/s, found as one channel of 20."""
    p = platform_of(rail_optimized(2, N, 2), tuple(range(N)), settings_from_env(env))
    assert (p.nnodes, p.ppn, p.intra, p.nvswitch, p.pci) == (2, 4, "pci", False, None)
    assert (p.nic_bw, p.nics_per_node) == (NIC, 4)
    assert p.node_bw == pytest.approx(NODE_RING)
    g = ring_graph(p)
    assert g.nchannels * g.bw_intra == pytest.approx(NODE_RING)


def test_nodes_across_hosts_and_without_shm() -> None:
    """Two hosts: 4 NCCL nodes. NCCL_SHM_DISABLE=1 too: no pair has P2P or SHM, every GPU its own node."""
    topo = rail_optimized(2, N, 2)
    assert platform_of(topo, tuple(range(2 * N)), settings_from_env(P2P_OFF)).nnodes == 4
    p = platform_of(topo, tuple(range(N)), settings_from_env({**P2P_OFF, "NCCL_SHM_DISABLE": "1"}))
    assert (p.nnodes, p.ppn) == (N, 1)


def test_all_reduce_net_hops_cross_the_spine_and_carry_the_rings_bytes() -> None:
    """1 GiB on one host: Ring / Simple, 2 channels, the second a copy of the one the search found (connectRings), so
    both run the ring 0 3 2 1 4 7 6 5 (nccl/shm_order.py): its NET hops 1 -> 4 and 5 -> 0 each send 2 (n - 1) / n of the
    buffer through the NIC their channel entered the socket by (crossNic 0: GPU 0's and GPU 4's, nccl/ring_nics.py), so
    the flows leave GPU 0 and 4's rail leaves, cross a spine and arrive on the peer's rail leaf; no byte leaves by GPU
    3's or 7's NIC. The bus bandwidth is the node ring's 20 GB/s (under the NICs' 50)."""
    topo = rail_optimized(2, N, 2)
    dag = decompose(Collective("all_reduce", tuple(range(N)), GIB, "fp32"), topo, _opts(**P2P_OFF))
    choice = dag.choice or {}
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Ring", "Simple", 2)
    assert choice["transport"] == {"NET": 2, "SHM": 6} and choice["path"] == "NET"
    sent: dict[tuple[int, int], int] = {}
    for f in dag.flows:
        if f.via_nic:
            sent[f.src, f.dst] = sent.get((f.src, f.dst), 0) + f.size
            hops = [topo.nodes[topo.channel_ends(ch)[1]].name for ch in topo.route(f.src, f.dst, f.key, f.via_nic)]
            assert hops[0] == f"rail{f.src}" and hops[1].startswith("spine") and hops[2] == f"rail{f.dst}"
    assert sorted(sent) == [(0, 4), (4, 0)]  # the hops 3 -> 4 and 7 -> 0, leaving by GPU 0's and GPU 4's NIC
    for got in sent.values():
        assert got == pytest.approx(2 * (N - 1) / N * GIB, rel=1e-6)
    t_us = _run_ns(topo, dag.flows) / 1000
    assert t_us == pytest.approx(_ring_time_us(choice, N, GIB, NODE_RING), rel=0.005)


def test_two_hosts_run_at_the_node_ring() -> None:
    """16 GPUs on 2 hosts: 4 NCCL nodes, the ring's 4 node-to-node hops NET (2 inside a host through the NICs, 2
    between the hosts; both channels run one ring), 1 GiB at the node ring's 20 GB/s."""
    topo = rail_optimized(2, N, 2)
    n = 2 * N
    dag = decompose(Collective("all_reduce", tuple(range(n)), GIB, "fp32"), topo, _opts(**P2P_OFF))
    choice = dag.choice or {}
    assert choice["transport"] == {"NET": 4, "SHM": 12}
    inside = {(f.src, f.dst) for f in dag.flows if f.via_nic}
    # each host's socket-to-socket hop (3 -> 4, 11 -> 12), leaving by the socket's entry NIC; 7 -> 8, 15 -> 0 cross
    # hosts (by GPU 4's and GPU 12's NIC)
    assert inside == {(0, 4), (N, N + 4)}
    t_us = _run_ns(topo, dag.flows) / 1000
    assert t_us == pytest.approx(_ring_time_us(choice, n, GIB, NODE_RING), rel=0.005)


def test_without_shm_each_gpu_is_a_node_bound_by_its_nic() -> None:
    """NCCL_SHM_DISABLE=1 as well, 100G NICs on Skylake hosts (12.5 GB/s, above SKL_QPI_BW 10, so the rule holds):
    no pair has P2P or SHM, each GPU is an NCCL node, every ring hop is NET, and the ring is bound by the NIC: one
    channel of Hopper's fastest inter-node speed not above 12.5 (search.cc sm90 list: 12), a 1 GiB bus bandwidth of
    12 GB/s."""
    topo = rail_optimized(2, N, 2, nic_rate="100Gbps", cpu_model="skl")
    env = {**P2P_OFF, "NCCL_SHM_DISABLE": "1"}
    p = platform_of(topo, tuple(range(N)), settings_from_env(env))
    assert (p.nnodes, p.ppn, p.nic_bw) == (N, 1, 100 / 8)
    g = ring_graph(p)
    assert (g.nchannels, g.bw_intra) == (1, 12.0)
    dag = decompose(Collective("all_reduce", tuple(range(N)), GIB, "fp32"), topo, _opts(**env))
    assert (dag.choice or {})["transport"] == {"NET": N}
    assert sum(f.via_nic for f in dag.flows) == len([f for f in dag.flows if f.size])
    t_us = _run_ns(topo, dag.flows) / 1000
    assert t_us == pytest.approx(_ring_time_us(dag.choice or {}, N, GIB, 12.0), rel=0.005)


def test_net_beats_a_slow_cpu_link_and_disable_intra_gives_it_back() -> None:
    """On Skylake (SKL_QPI_BW 10) the one-host SHM ring is bound by the CPU link: 3 channels of 3 GB/s, 9 GB/s
    (nvlink_pci.py). The NET split does not cross it: 20 GB/s. NCCL_NET_DISABLE_INTRA=1 gives the SHM ring back,
    flows, choice and time alike."""
    topo = rail_optimized(1, N, 2, cpu_model="skl")
    coll = Collective("all_reduce", tuple(range(N)), GIB, "fp32")
    net = decompose(coll, topo, _opts(**P2P_OFF))
    shm = decompose(coll, topo, _opts(**P2P_OFF, NCCL_NET_DISABLE_INTRA="1"))
    assert (net.choice or {})["transport"] == {"NET": 2, "SHM": 6}
    assert (shm.choice or {})["transport"] == {"SHM": N} and (shm.choice or {})["path"] == "SYS"
    assert not any(f.via_nic for f in shm.flows)
    assert _run_ns(topo, net.flows) / 1000 == pytest.approx(
        _ring_time_us(net.choice or {}, N, GIB, NODE_RING), rel=5e-3
    )
    assert _run_ns(topo, shm.flows) / 1000 == pytest.approx(_ring_time_us(shm.choice or {}, N, GIB, 9.0), rel=5e-3)
    old = decompose(coll, dgx_host(N, gpu="h100", cpu_model="skl"), _opts(**P2P_OFF))
    assert [(f.src, f.dst, f.size) for f in old.flows] == [(f.src, f.dst, f.size) for f in shm.flows]


def test_slow_nics_keep_the_shm_ring_also_across_hosts() -> None:
    """100G NICs (12.5 GB/s) are no faster than Sapphire Rapids' 22 across the sockets: no pair runs NET, the host
    keeps its SHM ring; across hosts (as with NCCL_NET_DISABLE_INTRA=1) each host is one NCCL node of 8 GPUs on SHM
    (tests/test_nccl_shm_hosts.py has its rates)."""
    topo = rail_optimized(2, N, 2, nic_rate="100Gbps")
    p = platform_of(topo, tuple(range(N)), settings_from_env(P2P_OFF))
    assert p.nnodes == 1 and p.pci is not None
    for t, env in ((topo, P2P_OFF), (rail_optimized(2, N, 2), {**P2P_OFF, "NCCL_NET_DISABLE_INTRA": "1"})):
        got = choose(Collective("all_reduce", tuple(range(2 * N)), 1 << 20, "fp32"), t, _opts(**env))
        assert got is not None and dict(got.transport or ()) == {"NET": 2, "SHM": 2 * N - 2}


def test_dgx_host_without_nics_keeps_its_shm_ring() -> None:
    p = platform_of(dgx_host(N, gpu="h100"), tuple(range(N)), settings_from_env(P2P_OFF))
    assert p.nnodes == 1 and p.pci is not None and p.node_bw == 0.0


def test_a_socket_alone_keeps_its_shm_ring() -> None:
    """A communicator inside one socket has no pair at NET: one node, its PCIe ring."""
    p = platform_of(rail_optimized(1, N, 2), (0, 1, 2, 3), settings_from_env(P2P_OFF))
    assert p.nnodes == 1 and p.pci is not None and p.pci.sockets == (0,) * 4


@pytest.mark.slow
@pytest.mark.ns3
def test_ns3_sends_the_net_hops_through_the_nics(ns3_lib: object) -> None:
    """ns-3 routes a NET hop as the flow engine does (the hop 3 -> 4 by GPU 0's NIC: rail leaf 0 -> spine -> rail
    leaf 4 -> GPU 4, not the NVSwitch), with NVLink in packets too or on the fluid side (nvlink=fluid: the NET hops
    on its packet side, the SHM hops on its fluid NVLink side), and a 64 MiB all-reduce on one host ends within 2% of
    the flow engine's time at the packets' goodput, both at the node ring's closed form within 3%."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.hybrid import FLUID, PACKET, FluidNvlinkSimulator
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig
    from tests.engine_pair import flow_and_ns3_end_ns

    topo = rail_optimized(1, N, 2)
    size = 64 << 20
    dag = decompose(Collective("all_reduce", tuple(range(N)), size, "fp32"), topo, _opts(**P2P_OFF))
    net = [f for f in dag.flows if f.via_nic]
    assert {(f.src, f.dst) for f in net} == {(0, 4), (4, 0)}
    for nvlink in ("packet", "fluid"):
        sim = make_engine(EngineSpec(network="ns3", packet=PacketConfig(nvlink=nvlink)), topo)
        try:
            packet = sim
            if nvlink == "fluid":
                assert isinstance(sim, FluidNvlinkSimulator)
                assert {sim.side_of(f) for f in net} == {PACKET}
                assert {sim.side_of(f) for f in dag.flows if not f.via_nic and f.size} == {FLUID}
                packet = sim.packet
            assert isinstance(packet, Ns3Simulator)
            for f in net:
                assert packet.route(f.src, f.dst, f.key, f.via_nic) == topo.route(f.src, f.dst, f.key, f.via_nic)
                assert (
                    len(topo.route(f.src, f.dst, f.key, f.via_nic)) == 4
                )  # up its rail leaf, a spine, the peer's rail leaf
        finally:
            sim.close()
    ends = flow_and_ns3_end_ns(topo, dag.flows)
    assert ends["ns3"] == pytest.approx(ends["flow"], rel=0.02)
    want_us = _ring_time_us(dag.choice or {}, N, size, NODE_RING)
    assert ends["ns3"] / 1000 == pytest.approx(want_us, rel=0.03)


LIVE = """
    import os
    import torch, torch.distributed as dist
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    x = torch.ones(16 * 1024 * 1024, device="cuda")  # 64 MiB
    dist.all_reduce(x)
    torch.cuda.synchronize()
"""


@pytest.mark.slow
def test_a_live_all_reduce_records_net_between_the_sockets(tmp_path: object) -> None:
    """A torch program on the 8 GPUs of one rail-fabric host with NCCL_P2P_DISABLE=1: the all-reduce's recorded
    choice names NET for the ring's 2 socket-to-socket hops and SHM for the other 6, and the run's flows send those
    hops through the NICs (flows.csv would show them on the rail leaves). Slow: a live 8-rank run."""
    import textwrap
    from pathlib import Path

    from phantora.launcher import RunConfig, launch

    out = Path(str(tmp_path))
    script = out / "allreduce.py"
    script.write_text(textwrap.dedent(LIVE))
    topo = rail_optimized(1, N, 2)
    cfg = RunConfig(str(script), [], topo, nproc=N, tensors="phantom", out_dir=out / "run", timeout_s=600,
                    env=P2P_OFF)  # fmt: skip
    rep = launch(cfg)
    recs = [c for c in rep.cosim.collectives if c["kind"] == "all_reduce"]
    assert recs and all(c["nccl"]["transport"] == {"NET": 2, "SHM": 6} for c in recs)
    assert all(c["nccl"]["path"] == "NET" for c in recs)
    assert rep.summary["nccl"]["env"]["NCCL_P2P_DISABLE"] == "1"


@pytest.mark.parametrize("lb", ["ecmp", "spray"])
def test_a_flow_through_the_nics_never_takes_its_pairs_cached_nvlink_route(lb: str) -> None:
    """GPU 3 -> GPU 4 of one host twice at once, 100 MB each, both of key 7: over the NVSwitch, then through the
    NICs (`Flow.via_nic`). The flow engine caches one route per pair where a pair has one path; the NIC flow must still
    leave by its NIC (400G, and 400G uplinks on 2 hosts x 2 spines: 100 MB in 2 ms), not share the NVLink route the
    first flow cached (0.22 ms)."""
    from phantora.netsim.base import Flow

    topo = rail_optimized(2, N, 2)
    size = 100_000_000
    sim = FlowSimulator(topo, lb=lb)
    sim.submit([Flow(0, 3, 4, size, key=7), Flow(1, 3, 4, size, key=7, via_nic=True)], at=0)
    ends = {c.flow_id: c.end_ns for c in sim.drain()}
    nic_ns = size * 8 / 400e9 * 1e9
    assert ends[1] == pytest.approx(nic_ns, rel=0.01)
    assert ends[0] < nic_ns / 5
