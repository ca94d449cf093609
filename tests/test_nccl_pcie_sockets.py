"""The NCCL model on PCIe hosts whose GPUs reach each other through a CPU: two sockets, root ports, GPUs without
P2P. Closed forms of NCCL's own source (NVIDIA/nccl v2.30.7-1):

- topo.h / topo.cc `ncclTopoGetInterCpuBw`: the inter-CPU link is BDW_QPI_BW 6, SKL_QPI_BW 10 (Intel model >= 0x55:
  Skylake, Cascade Lake, Ice Lake), SRP_QPI_BW 22 (>= 0x8F), ERP_QPI_BW 40 (>= 0xCF), AMD_BW 16 GB/s.
- paths.cc `ncclTopoCheckP2p`: P2P up to PATH_PXB (PATH_SYS on AMD hosts where the communicator has at most two GPUs),
  or NCCL_P2P_LEVEL; NCCL_P2P_DISABLE=1 is PATH_LOC. A pair without P2P is diverted through the receiver's CPU and
  runs SHM.
- search.cc `followPath`: every channel takes its speed off each link of each hop's path, 6/5 of it on the PCIe
  links of a PATH_PHB hop through an Intel CPU; `ncclTopoCompute` keeps the most channels x speed, stops when the
  GPU's link is full, steps the speed down while the next is above .49 of the best, else falls back to 0.1 GB/s.
- tuning.cc: any typeIntra that is not NVLink is NCCL_HW_PCI (latency per hop), LL128 off above PATH_NVB.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose, tuning
from phantora.collectives.nccl.channels import comm_channels, ring_graph
from phantora.collectives.nccl.pci_paths import ring_capacity, transport
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import NcclSettings, nccl_env, settings_from_env
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import pcie_host, rail_optimized
from tests.engine_pair import flow_and_ns3_end_ns

N = 8
GEN4, GEN5 = 16 * 120 / 80.0, 16 * 240 / 80.0  # NCCL's x16 link: width x speed / 80 (ncclTopoAddPci)
QPI = {"bdw": 6.0, "skl": 10.0, "icx": 10.0, "spr": 22.0, "emr": 40.0}  # topo.h, by Intel model class
AMD_BW = 16.0
INTEL = 6 / 5  # INTEL_P2P_OVERHEAD


def _p(env: dict[str, str] | None = None, n: int = N, **kw):  # type: ignore[no-untyped-def]
    st = settings_from_env(env or {})
    topo = pcie_host(n, **kw)
    return platform_of(topo, tuple(range(n)), st), topo


def _opts(**env: str) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


@pytest.mark.parametrize(("model", "gbs"), sorted({**QPI, "zen": AMD_BW}.items()))
def test_the_cpu_link_is_nccls_inter_cpu_figure(model: str, gbs: float) -> None:
    _, topo = _p(sockets=2, cpu_model=model, cpu="amd" if model == "zen" else None)
    cpu0, cpu1 = (next(n.id for n in topo.nodes if n.name == f"cpu{s}") for s in (0, 1))
    link = next(ch for v, ch in topo.neighbours(cpu0) if v == cpu1)
    assert topo.channel_bandwidth(link) == int(gbs * 8e9)
    route = topo.route(topo.node_of_rank(3), topo.node_of_rank(4))  # socket 0 to socket 1
    assert [topo.nodes[topo.channel_ends(c)[1]].name for c in route] == ["pcisw0", "cpu0", "cpu1", "pcisw1", "gpu4"]


def test_transports_follow_the_p2p_level() -> None:
    """Intel, 2 sockets: P2P inside a switch (PIX <= PXB), SHM across the CPUs (SYS); NCCL_P2P_LEVEL=SYS makes all
    P2P, NCCL_P2P_DISABLE=1 makes all SHM; numbers are the old levels (4 = SYS); root ports (PHB) are SHM by
    default and P2P from NCCL_P2P_LEVEL=PHB; AMD with two GPUs allows SYS."""
    p, _ = _p(sockets=2)
    assert p.pci is not None
    assert [transport(p.pci, 0, j) for j in (1, 3, 4, 7)] == ["P2P", "P2P", "SHM", "SHM"]
    for env, want in [({"NCCL_P2P_LEVEL": "SYS"}, "P2P"), ({"NCCL_P2P_LEVEL": "4"}, "P2P"),
                      ({"NCCL_P2P_DISABLE": "1"}, "SHM")]:  # fmt: skip
        q, _ = _p(env, sockets=2)
        assert q.pci is not None and {transport(q.pci, 0, j) for j in (1, 4)} == {want}
    roots, _ = _p(pcie_switch=False)
    phb, _ = _p({"NCCL_P2P_LEVEL": "PHB"}, pcie_switch=False)
    assert roots.pci is not None and phb.pci is not None
    assert (transport(roots.pci, 0, 1), transport(phb.pci, 0, 1)) == ("SHM", "P2P")
    two_amd, _ = _p(n=2, sockets=2, cpu="amd")
    two_intel, _ = _p(n=2, sockets=2)
    assert two_amd.pci is not None and two_intel.pci is not None
    assert (transport(two_amd.pci, 0, 1), transport(two_intel.pci, 0, 1)) == ("P2P", "SHM")


@pytest.mark.parametrize(
    ("kw", "env", "cap", "graph"),
    [
        # one switch: the GPU's link, 24; the search's 2 x 12 (test_nccl_pcie.py)
        ({}, {}, GEN4, (2, 12.0)),
        # two sockets: the CPU link binds (each channel crosses it once each way); fastest ampere speed <= cap
        ({"sockets": 2, "cpu_model": "skl"}, {}, QPI["skl"], (1, 10.0)),
        ({"sockets": 2, "cpu_model": "icx"}, {}, QPI["icx"], (1, 10.0)),
        ({"sockets": 2, "cpu_model": "bdw"}, {}, QPI["bdw"], (1, 6.0)),
        # 16: 15 (1 channel); 12, 10, 9 do no better; 7 / 15 < .49 stops before 4 x 4 = 16
        ({"sockets": 2, "cpu": "amd"}, {}, AMD_BW, (1, 15.0)),
        # 22: 20 (1); 10 x 2 only equals it; 9 / 20 < .49
        ({"sockets": 2, "cpu_model": "spr"}, {}, QPI["spr"], (1, 20.0)),
        ({"sockets": 2, "cpu_model": "emr"}, {}, GEN4, (2, 12.0)),  # 40 > 24: the GPU's link again
        # root ports, Intel: PHB hops take 6/5 off the GPU's link: 24 / 1.2 = 20, one channel; AMD: no charge
        ({"pcie_switch": False}, {}, GEN4 / INTEL, (1, 20.0)),
        ({"pcie_switch": False, "cpu": "amd"}, {}, GEN4, (2, 12.0)),
        # P2P off under one Intel switch: all 8 hops climb the uplink at 6/5: 24 / 9.6 = 2.5 < 3, NCCL's fallback
        ({}, {"NCCL_P2P_DISABLE": "1"}, GEN4 / (N * INTEL), (1, 0.1)),
        # P2P off, 2 Intel sockets: a socket's uplink carries its 3 PHB hops at 6/5 and 1 SYS hop: 24 / 4.6
        ({"sockets": 2}, {"NCCL_P2P_DISABLE": "1"}, GEN4 / (3 * INTEL + 1), (1, 5.0)),
        ({"sockets": 2, "cpu": "amd"}, {"NCCL_P2P_DISABLE": "1"}, GEN4 / 4, (1, 6.0)),
        # Gen5 on SKL: sm90 speeds 6 (1 channel), then 3 / 6 > .49: 3 x 3 = 9 beats it
        ({"sockets": 2, "gpu": "h100-pcie"}, {}, QPI["skl"], (3, 3.0)),
    ],
)
def test_the_ring_search_over_the_hosts_links(kw: dict, env: dict, cap: float, graph: tuple[int, float]) -> None:
    p, _ = _p(env, **kw)
    assert p.pci is not None
    assert ring_capacity(p.pci)[0] == pytest.approx(cap)
    g = ring_graph(p)
    assert (g.nchannels, g.bw_intra) == graph
    assert comm_channels(p, g, NcclSettings()) == 2 * graph[0]  # connectRings doubles


@pytest.mark.parametrize("cpu", ["intel", "amd"])
def test_two_sockets_keep_pci_latencies_and_the_ring_runs_at_the_cpu_link(cpu: str) -> None:
    """tuning.cc: the PCI hop latency (ring LL 1.0, Simple 5.7 µs) on SYS paths too, no LL128; ring Simple's bus
    bandwidth is channels x speed; a 1 GiB all-reduce through the flow engine runs at it, and each direction of the
    CPU link carries one ring hop's bytes, 2 (n - 1) / n of the size."""
    p, topo = _p(sockets=2, cpu=cpu)
    nch, bw = (1, 10.0) if cpu == "intel" else (1, 15.0)
    got = {(c.algorithm, c.protocol): c for c in tuning.costs("all_reduce", p, NcclSettings())}
    assert set(got) == {("ring", "LL"), ("ring", "Simple"), ("tree", "LL"), ("tree", "Simple")}
    assert got[("ring", "Simple")].lat_us == pytest.approx(8.4 + 2 * (N - 1) * 5.7)
    assert got[("ring", "LL")].lat_us == pytest.approx(6.6 + 2 * (N - 1) * 1.0)
    assert got[("ring", "Simple")].algbw == pytest.approx(nch * bw * N / (2 * (N - 1)))
    size = 1 << 30
    coll = Collective("all_reduce", tuple(range(N)), size, "fp32")
    dag = decompose(coll, topo, _opts())
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    t_ns = max(c.end_ns for c in sim.drain())
    choice = dag.choice or {}
    assert (choice["algorithm"], choice["protocol"]) == ("Ring", "Simple")
    assert choice["transport"] == {"P2P": 6, "SHM": 2} and choice["path"] == "SYS"
    t_us = 8.4 + 2 * (N - 1) * 5.7 + size / (1000 * nch * bw * N / (2 * (N - 1)))
    assert t_ns / 1000 == pytest.approx(t_us, rel=0.005)
    cpu0, cpu1 = (next(n.id for n in topo.nodes if n.name == f"cpu{s}") for s in (0, 1))
    moved = sim.channel_bytes()
    for a, b in ((cpu0, cpu1), (cpu1, cpu0)):
        ch = next(c for c in range(topo.num_channels) if topo.channel_ends(c) == (a, b))
        assert moved[ch] == pytest.approx(2 * (N - 1) / N * size, rel=1e-6)


def test_the_fallback_rates_the_choice_and_the_links_move_the_data() -> None:
    """P2P off under one Intel switch: no ring fits (24 / 9.6 = 2.5 GB/s is below ampere's slowest speed, 3), so
    NCCL's search falls back to one channel of 0.1 GB/s (search.cc). NCCL's tuner rates the ring with it (its
    model time for 64 MiB: 88.2 µs + size / 0.1 x 8/14 GB/s) and still picks Ring / Simple on 2 channels, but the
    kernel copies at what the links allow: each of the 8 SHM hops climbs the switch's uplink and comes down it at
    6/5 (INTEL_P2P_OVERHEAD), so the uplink carries 8 x 1.2 GB/s per GB/s of ring, a bus bandwidth of 24 / 9.6."""
    p, topo = _p({"NCCL_P2P_DISABLE": "1"})
    size = 64 << 20
    lat_us = 8.4 + 2 * (N - 1) * 5.7  # tuning.cc: ring Simple base + PCI hops
    alg_per_bus = N / (2 * (N - 1))
    nccl = {(c.algorithm, c.protocol): c for c in tuning.costs("all_reduce", p, NcclSettings())}
    assert nccl[("ring", "Simple")].algbw == pytest.approx(0.1 * alg_per_bus)
    nccl_us = tuning.model_time_us(nccl[("ring", "Simple")], "all_reduce", p, size, 2)
    assert nccl_us == pytest.approx(lat_us + size / (1000 * 0.1 * alg_per_bus))  # NCCL's own estimate: 1.17 s
    coll = Collective("all_reduce", tuple(range(N)), size, "fp32")
    dag = decompose(coll, topo, _opts(NCCL_P2P_DISABLE="1"))
    choice = dag.choice or {}
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Ring", "Simple", 2)
    assert choice["transport"] == {"SHM": N}
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    t_ns = max(c.end_ns for c in sim.drain())
    uplink_bus = GEN4 / (N * INTEL)  # 2.5 GB/s
    assert t_ns / 1000 == pytest.approx(lat_us + size / (1000 * uplink_bus * alg_per_bus), rel=0.005)


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"NCCL_P2P_LEVEL": "sys"}, "NCCL_P2P_LEVEL"),
        ({"NCCL_P2P_DISABLE": "yes"}, "NCCL_P2P_DISABLE"),
        ({"NCCL_SHM_DISABLE": "2"}, "NCCL_SHM_DISABLE"),
    ],
)
def test_bad_values_are_one_line_errors(env: dict[str, str], field: str) -> None:
    with pytest.raises(InputError) as err:
        settings_from_env(env)
    assert err.value.field == field and "\n" not in str(err.value)


def test_amds_sys_p2p_counts_the_communicators_gpus() -> None:
    """topo.cc builds NCCL's system from the communicator's GPUs only: on an 8-GPU AMD host a communicator of two
    GPUs on different sockets runs P2P (SYS allowed), the whole host's ring runs SHM across the sockets."""
    st = settings_from_env({})
    topo = pcie_host(N, sockets=2, cpu="amd")
    pair = platform_of(topo, (3, 4), st).pci
    whole = platform_of(topo, tuple(range(N)), st).pci
    assert pair is not None and whole is not None
    assert (transport(pair, 0, 1), transport(whole, 3, 4)) == ("P2P", "SHM")


def test_p2p_collectives_record_their_pairs_transports() -> None:
    """An all-to-all on two Intel sockets: 4 x 3 ordered pairs inside each socket run P2P, 2 x 4 x 4 across run
    SHM; a send/recv of the 8-GPU communicator from socket 0 to socket 1 runs SHM."""
    topo = pcie_host(N, sockets=2)
    a2a = choose(Collective("all_to_all", tuple(range(N)), 64 << 20, "fp32"), topo, _opts())
    assert a2a is not None and a2a.to_dict()["transport"] == {"P2P": 2 * 4 * 3, "SHM": 2 * 4 * 4}
    send = Collective("send_recv", (3, 4), 1 << 20, "fp32", None, tuple(range(N)))
    got = choose(send, topo, _opts())
    assert got is not None and (got.to_dict()["transport"], got.path) == ({"SHM": 1}, "SYS")
    amd = choose(send, pcie_host(N, sockets=2, cpu="amd"), _opts())
    assert amd is not None and amd.to_dict()["transport"] == {"SHM": 1}  # the communicator has 8 GPUs: PXB


def test_what_is_not_modelled_is_refused_clearly() -> None:
    coll = Collective("all_reduce", tuple(range(N)), 1 << 20, "fp32")
    with pytest.raises(InputError, match="network transport"):
        choose(coll, pcie_host(N, sockets=2), _opts(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1"))
    across = Collective("all_reduce", tuple(range(2 * N)), 1 << 20, "fp32")  # SHM hosts: test_nccl_shm_hosts
    with pytest.raises(InputError, match="NCCL_SHM_DISABLE=1"):  # no transport between a host's GPUs at all
        choose(
            across,
            rail_optimized(2, N, 2),
            _opts(NCCL_P2P_DISABLE="1", NCCL_NET_DISABLE_INTRA="1", NCCL_SHM_DISABLE="1"),
        )
    # P2P still on inside each switch: SHM off changes nothing there, and the SYS hops need it
    with pytest.raises(InputError, match="NCCL_SHM_DISABLE=1"):
        choose(coll, pcie_host(N, sockets=2), _opts(NCCL_SHM_DISABLE="1"))
    assert choose(coll, pcie_host(N), _opts(NCCL_SHM_DISABLE="1")) is not None  # one switch: all P2P


@pytest.mark.parametrize(
    ("env", "var"),
    [
        ({"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE"),
        ({"NCCL_P2P_LEVEL": "LOC"}, "NCCL_P2P_LEVEL"),
        ({"NCCL_P2P_LEVEL": "0"}, "NCCL_P2P_LEVEL"),
        ({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}, "NCCL_P2P_DISABLE"),
    ],
)
def test_p2p_off_on_nvlink_across_hosts_by_any_variable(env: dict[str, str], var: str) -> None:
    """Each way of turning P2P off (NCCL_P2P_DISABLE wins over NCCL_P2P_LEVEL, as in `ncclGetLevel`) runs NVLink
    GPUs of a communicator across hosts, kept on SHM inside each host by NCCL_NET_DISABLE_INTRA=1, as one NCCL node
    a host (test_nccl_shm_hosts.py): 2 NET hops, 14 SHM (its ring: NVLS, which P2P off leaves on, turned off); the
    variable is recorded."""
    coll = Collective("all_reduce", tuple(range(2 * N)), 1 << 20, "fp32")
    got = choose(coll, rail_optimized(2, N, 2), _opts(**env, NCCL_NET_DISABLE_INTRA="1", NCCL_NVLS_ENABLE="0"))
    assert got is not None and dict(got.transport) == {"NET": 2, "SHM": 2 * N - 2}
    assert var in dict(_opts(**env).nccl_env or ())


def test_the_variables_are_recorded_with_the_others() -> None:
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "PHB", "NCCL_SHM_DISABLE": "0", "OTHER": "x"}
    assert dict(nccl_env(env)) == {k: v for k, v in env.items() if k.startswith("NCCL_")}


def test_generator_checks_its_sockets() -> None:
    with pytest.raises(InputError) as err:
        pcie_host(6, sockets=4)
    assert err.value.field == "sockets"
    with pytest.raises(InputError) as err:
        pcie_host(8, sockets=2, cpu="amd", cpu_model="skl")
    assert err.value.field == "cpu_model"


@pytest.mark.ns3
def test_packet_mode_crosses_the_cpu_link_as_the_flow_network(ns3_lib) -> None:  # type: ignore[no-untyped-def]
    """A 4 MiB all-reduce on two Intel sockets through ns-3: the CPU link carries one ring hop's bytes each way,
    and the run ends within 10% of the flow network at the packets' goodput (ACKs and the packet model's pacing
    differ)."""
    topo = pcie_host(N, sockets=2)
    size = 4 << 20
    coll = Collective("all_reduce", tuple(range(N)), size, "fp32")
    dag = decompose(coll, topo, _opts())
    ends = flow_and_ns3_end_ns(topo, dag.flows)
    cpu0, cpu1 = (next(n.id for n in topo.nodes if n.name == f"cpu{s}") for s in (0, 1))
    crossing = [f for f in dag.flows if (cpu0, cpu1) in map(topo.channel_ends, topo.route(f.src, f.dst, f.key or 0))]
    assert sum(f.size for f in crossing) == pytest.approx(2 * (N - 1) / N * size, rel=1e-6)
    assert ends["ns3"] == pytest.approx(ends["flow"], rel=0.10)
