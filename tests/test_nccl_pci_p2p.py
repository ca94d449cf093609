"""Send/recv and all-to-all with P2P off on a DGX host: each pair at its max-min share of NCCL's PCIe view of it.

NVIDIA/nccl v2.30.7-1: with NCCL_P2P_DISABLE=1 every pair runs SHM (shm.cc), its buffer on the receiver's side
(NCCL_SHM_LOCALITY=2): the sender's kernel stores into the receiver's host memory, which the receiver's kernel loads.
The bytes climb the sender's x16 link and switch uplink, cross the inter-CPU link when the sockets differ, and come
down the receiver's uplink and x16 link (addInterStep's path). paths.cc `ncclTopoGetNchannels` gives a PCIe peer 2
p2p channels. The DGX layout (nvlink_pci.py): GPUs 0-3 on socket 0 (switches {0,1}, {2,3}), 4-7 on socket 1; x16 is
24 GB/s at Gen4 (A100) and 48 at Gen5 (H100, B200: width x speed / 80); the CPUs by GPU from NVIDIA's DGX data
sheets (A100: AMD EPYC 7742, AMD_BW 16; H100: Xeon 8480C, SRP_QPI_BW 22; B200: Xeon 8570, ERP_QPI_BW 40).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.pci_p2p import pair_rates
from phantora.collectives.nccl.pci_paths import all_pairs
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, dgx_host, rail_optimized

N = 8
GEN4, GEN5 = 16 * 120 / 80.0, 16 * 240 / 80.0
SKL, SPR, ERP, AMD = 10.0, 22.0, 40.0, 16.0  # topo.h
SIMPLE = T.PROTOCOLS.index("Simple")
LAT_US = T.BASE_LAT["ring"][SIMPLE] + T.HW_LAT["pci"]["ring"][SIMPLE]  # one launch, one PCIe step
OFF = {"NCCL_P2P_DISABLE": "1"}


def _run(coll: Collective, topo_gpu: str, cpu_model: str | None = None) -> tuple[float, dict[str, object]]:
    topo = dgx_host(N, gpu=topo_gpu, cpu_model=cpu_model)
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(OFF)))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000, dag.choice or {}


@pytest.mark.parametrize(
    ("gpu", "cpu_model", "rate"),
    [
        ("h100", None, min(GEN5, SPR)),  # 22: SPR's link under the Gen5 x16
        ("a100", None, min(GEN4, AMD)),  # 16: AMD's link under the Gen4 x16
        ("b200", None, min(GEN5, ERP)),  # 40: EMR's link under the Gen5 x16
        ("h100", "skl", min(GEN5, SKL)),  # overridden: Skylake's 10
    ],
)
def test_a_cross_socket_sendrecv_is_bounded_by_the_cpu_link(gpu: str, cpu_model: str | None, rate: float) -> None:
    """256 MiB from GPU 3 (socket 0) to GPU 4 (socket 1): one launch and PCIe step, then the bytes at the CPU
    link's rate, on NCCL's 2 channels of a PCIe peer; the choice records one SHM pair on a SYS path."""
    size = 256 << 20
    t_us, choice = _run(Collective("send_recv", (3, 4), size, "fp32"), gpu, cpu_model)
    assert (choice["protocol"], choice["channels"], choice["transport"], choice["path"]) == (
        "Simple",
        2,
        {"SHM": 1},
        "SYS",
    )
    assert t_us == pytest.approx(LAT_US + size / (1000 * rate), rel=0.002)


@pytest.mark.parametrize(("gpu", "x16"), [("h100", GEN5), ("a100", GEN4)])
@pytest.mark.parametrize("dst", [1, 2])
def test_a_same_socket_sendrecv_runs_at_the_pcie_link(gpu: str, x16: float, dst: int) -> None:
    """GPU 0 to GPU 1 (one switch) or 2 (the socket's other switch), P2P off: up to the CPU and down, each link once
    each way, so the x16 rate, with no CPU link in the path (PHB)."""
    size = 256 << 20
    t_us, choice = _run(Collective("send_recv", (0, dst), size, "fp32"), gpu)
    assert choice["path"] == "PHB"
    assert t_us == pytest.approx(LAT_US + size / (1000 * x16), rel=0.002)


@pytest.mark.parametrize(("gpu", "x16", "cpu"), [("h100", GEN5, SPR), ("a100", GEN4, AMD), ("b200", GEN5, ERP)])
def test_all_to_all_shares_the_cpu_link_and_the_uplinks(gpu: str, x16: float, cpu: float) -> None:
    """8 GPUs, every ordered pair at once: each direction of the CPU link carries the 4 x 4 cross-socket pairs,
    `cpu / 16` each; a switch uplink carries its 2 GPUs' 7 sends each, 8 of them crossing, so the 6 in-socket ones
    get `(x16 - 8 cpu / 16) / 6`. The call ends with its cross-socket blocks: 1 GiB / 8 at `cpu / 16`."""
    p = platform_of(dgx_host(N, gpu=gpu), tuple(range(N)), settings_from_env(OFF))
    assert p.pci is not None
    rates = pair_rates(p.pci, all_pairs(p.pci))
    for (i, j), r in rates.items():
        want = cpu / 16 if (i < 4) != (j < 4) else (x16 - 8 * cpu / 16) / 6
        assert r == pytest.approx(want), (i, j)
    size = 1 << 30
    t_us, choice = _run(Collective("all_to_all", tuple(range(N)), size, "fp32"), gpu)
    assert choice["transport"] == {"SHM": N * (N - 1)} and choice["peer_bw_gbs"] == pytest.approx(cpu / 16, abs=1e-3)
    assert t_us == pytest.approx(LAT_US + size / N / (1000 * cpu / 16), rel=0.002)


def test_p2p_on_keeps_the_nvlink_model() -> None:
    """P2P on: no PCIe view, the NVLink p2p model (32 channels a peer need, no pair rates)."""
    p = platform_of(dgx_host(N, gpu="h100"), (3, 4), settings_from_env({}))
    assert p.pci is None and p.intra == "nvlink"
    dag = decompose(Collective("send_recv", (3, 4), 256 << 20, "fp32"), dgx_host(N, gpu="h100"), AlgoOptions())
    assert "transport" not in (dag.choice or {})


@pytest.mark.parametrize("make", [lambda **kw: dgx_host(N, **kw), lambda **kw: rail_optimized(2, N, 2, **kw)])
def test_a_bad_cpu_model_is_one_line_naming_the_field(make: Callable[..., Topology]) -> None:
    with pytest.raises(InputError) as err:
        make(cpu_model="epyc")
    assert err.value.field == "cpu_model" and "\n" not in str(err.value)
    assert all(name in str(err.value) for name in ("skl", "spr", "emr", "zen"))
    with pytest.raises(InputError) as err:
        make(cpu="amd", cpu_model="spr")  # an Intel model on AMD hosts
    assert err.value.field == "cpu_model" and "amd" in str(err.value)


def test_cpu_model_sets_the_vendor_and_the_fabrics_hosts() -> None:
    """A fabric's DGX hosts take `cpu_model` too; it names the vendor NCCL's tuner reads when `cpu` is not given
    (NCCL_NET_DISABLE_INTRA=1 keeps the host's SHM ring: test_nccl_net_intra.py has its NET between sockets)."""
    topo = rail_optimized(2, N, 2, gpu="h100", cpu_model="zen")
    assert topo.meta["cpu"] == "amd"
    p = platform_of(topo, tuple(range(N, 2 * N)), settings_from_env({**OFF, "NCCL_NET_DISABLE_INTRA": "1"}))
    assert p.pci is not None and (p.pci.cpu, p.pci.inter_cpu_bw) == ("amd", AMD)
