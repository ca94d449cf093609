"""The NCCL model on a PCIe host (8 PCIe cards under one PCIe switch, `pcie_host`), against closed forms of NCCL's
own source (NVIDIA/nccl v2.30.7-1):

- src/graph/topo.cc `ncclTopoAddPci`: a PCIe link is worth width x speed / 80 GB/s, speed per lane in 100 Mb/s from
  `kvDictPciGen` (16 GT/s: 120, 32 GT/s: 240), so Gen4 x16 = 24 and Gen5 x16 = 48 GB/s.
- src/graph/search.cc `ncclTopoCompute`: start at the fastest candidate (`speedArrayIntra`, `sm90SpeedArrayIntra`)
  not above the GPU's bandwidth, stop once nChannels x bw reaches the GPU's total (`getTotalBw`: its PCIe link);
  else lower the speed while the next is over .49 of the best found. Gen4: 20 (1 channel), 18, 15, then 12 with 2
  channels = 24: done. Gen5: 40 (1), 30 (1), then 24 with 2 = 48: done. No duplication below 25 GB/s.
- src/graph/tuning.cc: PCI hardware latencies (ring LL 1.0, Simple 5.7; tree LL 1.0, Simple 4.0 µs a hop), base
  latencies, ring LL at half the bus bandwidth, tree x .92 and LL / 3.8; LL128 enabled by default only where the
  graph's typeIntra <= PATH_NVB, i.e. never on PCIe.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import tuning
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import NcclSettings, settings_from_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import pcie_host

N = 8
NSTEPS = 2 * (N - 1)  # ring all-reduce steps
PCI_GB_S = {"a100-pcie": 16 * 120 / 80.0, "h100-pcie": 16 * 240 / 80.0}  # Gen4 x16, Gen5 x16 (width * speed / 80)
RING = {"a100-pcie": (2, 12.0), "h100-pcie": (2, 24.0)}  # the search's outcome (docstring): channels, GB/s each
RING_LAT_US = {"LL": 6.6 + NSTEPS * 1.0, "Simple": 8.4 + NSTEPS * 5.7}  # base + steps x PCI hop


def _platform(gpu: str):  # type: ignore[no-untyped-def]
    return platform_of(pcie_host(N, gpu=gpu), tuple(range(N)))


def _ring_algbw(gpu: str, proto: str) -> float:
    """NCCL's ring all-reduce algorithm bandwidth (GB/s): channels x bw, LL at half, times n / nsteps."""
    nch, bw = RING[gpu]
    bus = nch * bw * (0.5 if proto == "LL" else 1.0)
    return bus * N / NSTEPS


@pytest.mark.parametrize("gpu", sorted(PCI_GB_S))
def test_pcie_host_is_a_pci_platform_at_nccls_link_bandwidth(gpu: str) -> None:
    p = _platform(gpu)
    assert (p.intra, p.nvswitch, p.nnodes, p.ppn) == ("pci", False, 1, N)
    assert p.gpu_intra_bw == pytest.approx(PCI_GB_S[gpu])


@pytest.mark.parametrize("gpu", sorted(PCI_GB_S))
def test_ring_graph_is_the_searchs_outcome(gpu: str) -> None:
    p = _platform(gpu)
    g = tuning.ring_graph(p)
    assert (g.nchannels, g.bw_intra) == RING[gpu]
    assert g.nchannels * g.bw_intra == pytest.approx(PCI_GB_S[gpu])  # fills the PCIe link: the search stops there
    assert tuning.comm_channels(p, g, NcclSettings()) == 2 * RING[gpu][0]  # connectRings doubles


@pytest.mark.parametrize("gpu", sorted(PCI_GB_S))
def test_costs_are_tuning_cc_with_pci_latencies_and_no_ll128(gpu: str) -> None:
    p = _platform(gpu)
    got = {(c.algorithm, c.protocol): c for c in tuning.costs("all_reduce", p, NcclSettings())}
    assert set(got) == {("ring", "LL"), ("ring", "Simple"), ("tree", "LL"), ("tree", "Simple")}
    for proto in ("LL", "Simple"):
        assert got[("ring", proto)].lat_us == pytest.approx(RING_LAT_US[proto])
        assert got[("ring", proto)].algbw == pytest.approx(_ring_algbw(gpu, proto))
    nch, bw = RING[gpu]
    assert got[("tree", "Simple")].lat_us == pytest.approx(8.4 + 2 * (N - 1) * 4.0)
    assert got[("tree", "Simple")].algbw == pytest.approx(nch * bw * 0.92 * 0.5)  # under 24 GB/s a channel
    assert got[("tree", "LL")].lat_us == pytest.approx(6.8 + 2 * (N - 1) * 1.0)
    assert got[("tree", "LL")].algbw == pytest.approx(nch * bw * 0.92 / 3.8 * 0.5)
    forced = settings_from_env({"NCCL_PROTO": "LL128"})
    assert [c.protocol for c in tuning.costs("all_reduce", p, forced)] == ["LL128", "LL128"]  # asked for: allowed


@pytest.mark.parametrize("gpu", sorted(PCI_GB_S))
def test_ring_protocol_switches_where_ll_and_simple_times_cross(gpu: str) -> None:
    """With NCCL_ALGO=Ring, LL below and Simple above S* = (lat_Simple - lat_LL) / (1/bw_LL - 1/bw_Simple)."""
    ring_only = settings_from_env({"NCCL_ALGO": "Ring"})
    p = _platform(gpu)
    d_lat = RING_LAT_US["Simple"] - RING_LAT_US["LL"]
    cross = d_lat / (1 / (1000 * _ring_algbw(gpu, "LL")) - 1 / (1000 * _ring_algbw(gpu, "Simple")))
    below = tuning.select("all_reduce", p, ring_only, int(cross * 0.97))
    above = tuning.select("all_reduce", p, ring_only, int(cross * 1.03))
    assert below is not None and above is not None
    assert (below.algorithm, below.protocol) == ("ring", "LL")
    assert (above.algorithm, above.protocol) == ("ring", "Simple")


@pytest.mark.parametrize("gpu", sorted(PCI_GB_S))
def test_default_choice_at_the_ends(gpu: str) -> None:
    """8 B: ring LL (20.6 µs) beats tree LL (20.8 µs); 1 GiB: ring Simple (its bandwidth beats the tree's x .92)."""
    p = _platform(gpu)
    small = tuning.select("all_reduce", p, NcclSettings(), 8)
    big = tuning.select("all_reduce", p, NcclSettings(), 1 << 30)
    assert small is not None and big is not None
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    assert (big.algorithm, big.protocol) == ("ring", "Simple")


@pytest.mark.parametrize("gpu", sorted(PCI_GB_S))
def test_large_all_reduce_busbw_is_the_pcie_rings(gpu: str) -> None:
    """1 GiB all-reduce through the flow engine: busbw = channels x bw, less the ring Simple latency's share."""
    topo = pcie_host(N, gpu=gpu)
    size = 1 << 30
    coll = Collective("all_reduce", tuple(range(N)), size, "fp32")
    dag = decompose(coll, topo, AlgoOptions())
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    bus = size / max(c.end_ns for c in sim.drain()) * coll.busbw_factor()
    choice = dag.choice or {}
    nch, bw = RING[gpu]
    t_us = RING_LAT_US["Simple"] + size / (1000 * _ring_algbw(gpu, "Simple"))
    expected = size / (1000 * t_us) * NSTEPS / N
    assert choice["algorithm"] == "Ring" and choice["protocol"] == "Simple"
    assert bus == pytest.approx(expected, rel=0.005)
    assert bus < nch * bw  # never above the PCIe link NCCL's search filled


@pytest.mark.parametrize(("gpu", "gbps"), [("a100-pcie", 256), ("h100-pcie", 512)])  # x16 Gen4 / Gen5 per direction
def test_pcie_host_puts_every_gpu_on_one_switch(gpu: str, gbps: int) -> None:
    topo = pcie_host(4, gpu=gpu)
    switches = {n.id for n in topo.nodes if n.kind == "switch"}
    assert len(switches) == 1 and topo.num_ranks == 4
    for r in range(4):
        links = list(topo.neighbours(r))
        assert [v for v, _ in links] == [*switches]
        assert topo.channel_bandwidth(links[0][1]) == gbps * 10**9
