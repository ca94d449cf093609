"""Send/recv and all-to-all on a `pcie_host` (no NVSwitch) move at their pairs' shares of NCCL's PCIe view, as on a
DGX host with P2P off (5bf2e56, `pci_p2p.py`), not at the simulated links' raw rate.

NVIDIA/nccl v2.30.7-1: a GPU's x16 link is width x speed / 80 (topo.cc ncclTopoAddPci: 24 GB/s at Gen4), which the
generator builds at 256 Gbps (32 GB/s raw); under one PCIe switch a P2P pair copies GPU to GPU (PIX), a SHM pair
(NCCL_P2P_DISABLE=1) stores into the receiver's host memory, up the sender's link and the switch's uplink and down
again (shm.cc, addInterStep). The audit of `phantora nccl-tests` on pcie_host found alltoall_perf and sendrecv_perf at
a bus bandwidth of 31.98 GB/s with P2P on and off alike: the pairs' rates were flow caps only where an NVSwitch
joins the pair, so here the flows ran uncapped, up to ten times faster than the choice's own model time.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.settings import nccl_env
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.report import nccl_tests as nt
from phantora.topology import pcie_host

N = 8
GEN4 = 16 * 120 / 80.0  # 24 GB/s
SIMPLE = T.PROTOCOLS.index("Simple")
LAT_US = T.BASE_LAT["ring"][SIMPLE] + T.HW_LAT["pci"]["ring"][SIMPLE]  # one launch, one PCIe step


def _opts(env: dict[str, str]) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


def _end_us(coll: Collective, env: dict[str, str]) -> float:
    topo = pcie_host(N)
    dag = decompose(coll, topo, _opts(env))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000


@pytest.mark.parametrize(
    ("env", "pair_gbs"),
    [
        ({}, GEN4 / (N - 1)),  # P2P: each GPU's x16 carries its 7 sends
        ({"NCCL_P2P_DISABLE": "1"}, GEN4 / (N * (N - 1))),  # SHM: the uplink carries all 56 pairs' bytes up
    ],
)
def test_all_to_all_under_one_switch_moves_at_its_pairs_shares(env: dict[str, str], pair_gbs: float) -> None:
    size = 1 << 30
    t_us = _end_us(Collective("all_to_all", tuple(range(N)), size, "fp32"), env)
    assert t_us == pytest.approx(LAT_US + size / N / (1000 * pair_gbs), rel=0.002)


def test_a_lone_send_recv_moves_at_nccls_x16_not_the_raw_link() -> None:
    size = 256 << 20
    t_us = _end_us(Collective("send_recv", (0, 1), size, "fp32"), {})
    assert t_us == pytest.approx(LAT_US + size / (1000 * GEN4), rel=0.002)


@pytest.mark.parametrize(
    ("env", "sockets", "pair_gbs"),
    [
        ({}, 1, GEN4),  # P2P under one switch: each GPU's x16 sends one pair and receives one
        ({"NCCL_P2P_DISABLE": "1"}, 1, GEN4 / N),  # SHM: all 8 pairs climb the one uplink
        ({"NCCL_P2P_DISABLE": "1"}, 2, GEN4 / (N // 2)),  # 4 pairs up each socket's uplink (the CPU link: 1 pair)
    ],
)
def test_sendrecv_perfs_pairs_share_the_hosts_links_as_one_group(
    env: dict[str, str], sockets: int, pair_gbs: float
) -> None:
    """nccl-tests' sendrecv: every rank sends to the next in one NCCL group, all 8 pairs in flight at once
    (`Collective.inflight`), so they share the links they cross; each pair then moves 1 GiB at its share."""
    topo = pcie_host(N, sockets=sockets)
    ranks = tuple(range(N))
    size = 1 << 30
    it = nt.build_iteration(nt.find_test("sendrecv_perf"), ranks, size, "fp32", 0, topo, _opts(env), 0, "sr")
    assert it.choice is not None and it.choice["peer_bw_gbs"] == pytest.approx(pair_gbs, abs=1e-3)
    sim = FlowSimulator(topo)
    assert nt.run_iteration(sim, it) / 1000 == pytest.approx(LAT_US + size / (1000 * pair_gbs), rel=0.002)


def test_a_group_that_leaves_out_the_transfer_is_one_line_naming_inflight() -> None:
    with pytest.raises(InputError) as err:
        Collective("send_recv", (0, 1), 1 << 20, "fp32", None, (0, 1, 2), ((1, 2),))
    assert err.value.field == "inflight" and "\n" not in str(err.value)
