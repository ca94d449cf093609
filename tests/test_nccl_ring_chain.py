"""The network hops on a ring's longest chain of steps (ring_chain.py) against a walk of the ring's step
dependencies, and the latency it adds over NCCL's, written out from NCCL 2.30's hwLat table (tuning.cc)."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl import platform_of
from phantora.collectives.nccl.ring_chain import nccl_inter_steps, net_crossings
from phantora.collectives.nccl.settings import settings_from_env
from phantora.collectives.nccl.tuning import select
from phantora.topology import rail_optimized

MiB = 1 << 20


def walked_crossings(nsteps: int, nnodes: int, ppn: int) -> int:
    """The most network hops on any rank's chain, found by walking the dependencies: rank r's step j (j >= 1)
    waits for rank r - 1's step j - 1, ranks laid out node by node around the ring (NCCL's connect.cc order), a
    hop crossing the network when it leaves a node. hops[r][j]: network hops on the chain ending at (r, j)."""
    n = nnodes * ppn
    node = [r // ppn for r in range(n)]
    hops = [[0] * (nsteps + 1) for _ in range(n)]
    for j in range(1, nsteps + 1):
        for r in range(n):
            prev = (r - 1) % n
            hops[r][j] = hops[prev][j - 1] + (node[prev] != node[r])
    return max(hops[r][nsteps] for r in range(n))


@pytest.mark.parametrize("nnodes", [2, 3, 4, 8])
@pytest.mark.parametrize("ppn", [1, 2, 3, 8])
def test_the_longest_chain_crosses_as_the_walk_of_the_ring_finds(nnodes: int, ppn: int) -> None:
    """All-reduce's 2 (n - 1) steps and all-gather's n - 1: the closed form ceil(steps / ppn) is the walk's count;
    NCCL's 2 (nNodes - 1) and nNodes - 1 is it only with one GPU per node."""
    n = nnodes * ppn
    for kind, nsteps in (("all_reduce", 2 * (n - 1)), ("all_gather", n - 1)):
        assert net_crossings(nsteps, nnodes, ppn) == walked_crossings(nsteps, nnodes, ppn)
        if ppn == 1:
            assert net_crossings(nsteps, nnodes, ppn) == nccl_inter_steps(kind, nnodes)
    if ppn >= 3:  # every chain of 2 (n - 1) hops covers both loops' boundaries but at most one of its 2 gaps' hops
        assert walked_crossings(2 * (n - 1), nnodes, ppn) == 2 * nnodes
        assert walked_crossings(n - 1, nnodes, ppn) == nnodes


def test_two_h100_hosts_ring_ll128_all_reduce_pays_two_more_net_hops() -> None:
    """16 ranks on 2 hosts of 8: the chain crosses the network 4 times where NCCL counts 2, each at hwLat NET
    ring LL128 (4.0 µs) in place of NVLink's 1.9: 4.2 µs on top of NCCL's 14 + 28 x 1.9 + 2 x 4.0 = 75.2."""
    p = platform_of(rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="h100"), tuple(range(16)))
    c = select("all_reduce", p, settings_from_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}), MiB)
    assert c is not None and (c.algorithm, c.protocol) == ("ring", "LL128")
    assert c.lat_us == pytest.approx(14.0 + 28 * 1.9 + 2 * 4.0)
    assert c.chain_us == pytest.approx(2 * (4.0 - 1.9))


def test_all_gather_pays_one_more_hop_and_one_host_none() -> None:
    """All-gather on 2 hosts: 2 crossings where NCCL counts 1 (LL: 2.7 - 1.0 on an Intel host, whose 1 µs net
    overhead is the floor of an NVLink step across nodes). One host: no network, nothing."""
    st = settings_from_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"})
    two = select("all_gather", platform_of(rail_optimized(2, 8, spines=8, gpu="h100"), tuple(range(16))), st, 4096)
    one = select("all_gather", platform_of(rail_optimized(1, 8, gpu="h100"), tuple(range(8))), st, 4096)
    assert two is not None and one is not None
    assert two.chain_us == pytest.approx(2.7 - 1.0)
    assert one.chain_us == 0.0


def test_simple_all_reduce_keeps_nccls_plateau_which_already_adds_more() -> None:
    """A Simple ring all-reduce across nodes: NCCL multiplies its latency by 1.4 (its plateau, a fit of measured
    rings): 0.4 x (8.4 + 28 x 3.4 + 2 x 14) = 52.6 µs, more than the 2 x (14 - 3.4) = 21.2 the chain adds, so
    nothing is added. An all-gather has no plateau: 1 x (14 - 3.4)."""
    p = platform_of(rail_optimized(2, 8, spines=8, nic_rate="400Gbps", gpu="h100"), tuple(range(16)))
    st = settings_from_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
    ar, ag = select("all_reduce", p, st, 256 * MiB), select("all_gather", p, st, 256 * MiB)
    assert ar is not None and ag is not None
    assert ar.chain_us == 0.0
    assert ag.chain_us == pytest.approx(14.0 - 3.4)
