"""When a lone send's kernel ends, per transport (collectives/handoff.py, read from NCCL v2.26.5-1).

Closed forms from NCCL's tables: Simple's ring base latency 8.4 us, NVLink's Simple hop 3.4 us, 1 us a proxy op on
an Intel host, one channel's copy 20.6 GB/s on Hopper and 20.0 on Ampere (tables.NVLINK_BW_PER_LINK).
"""

from __future__ import annotations

import pytest

from phantora.collectives.handoff import handoff_ns
from phantora.collectives.nccl import choose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology import load_topology
from phantora.topology.generators import leaf_spine

KIB = 1024
N = 256 * KIB


def _lone_transfer_ns(topo, src: int, dst: int, nbytes: int, opts: AlgoOptions) -> int:
    c = choose(Collective("send_recv", (src, dst), nbytes, "uint8"), topo, opts)
    assert c is not None
    return round(c.time_us * 1000)


def test_across_hosts_the_kernel_ends_once_its_bytes_are_in_its_proxys_buffer():
    """NET: latency 8.4 us + its own proxy op (1 channel) + 262,144 B at 20.6 GB/s = 22,125 ns, half the lone
    transfer (8.4 + 14.0 + 2 x 1.0 us + the bytes at the NIC's 12.5 GB/s = 45,372 ns), which it used to be."""
    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    assert handoff_ns(topo, AlgoOptions(), {}, 0, 1, N) == round(9_400 + N / 20.6) == 22_125
    assert _lone_transfer_ns(topo, 0, 1, N, AlgoOptions()) == 45_372


def test_across_hosts_each_channel_posts_its_own_slots():
    """testbed16 GPU 0 -> GPU 8 (two H100 hosts): 2 channels, so two proxy ops and 2 x 20.6 GB/s."""
    topo = load_topology("testbed16")
    assert handoff_ns(topo, AlgoOptions(), {}, 0, 8, N) == round((8.4 + 2 * 1.0) * 1000 + N / 41.2) == 16_763


def test_over_nvlink_with_p2p_write_the_kernel_writes_across_the_link():
    """Hopper NVLink (testbed16 GPU 0 -> 1) writes into the receiver's slots: the lone transfer, 4 channels at
    20.6 GB/s after 8.4 + 3.4 us."""
    topo = load_topology("testbed16")
    want = round((8.4 + 3.4) * 1000 + N / (4 * 20.6))
    assert handoff_ns(topo, AlgoOptions(), {}, 0, 1, N) == _lone_transfer_ns(topo, 0, 1, N, AlgoOptions()) == want


def test_over_nvlink_with_p2p_read_the_kernel_copies_into_its_own_buffer():
    """A100 pairs read (ncclTopoCheckP2p, compute capability 8.0): no NVLink hop on the sender's path, 4 channels
    at 20.0 GB/s; NCCL_P2P_READ_ENABLE=0 makes them write (the lone transfer, 3.4 us later)."""
    topo = load_topology("a100x64")
    assert handoff_ns(topo, AlgoOptions(), {}, 0, 1, N) == round(8_400 + N / 80.0) == 11_677
    off = AlgoOptions(nccl_env=(("NCCL_P2P_READ_ENABLE", "0"),))
    assert handoff_ns(topo, off, {}, 0, 1, N) == _lone_transfer_ns(topo, 0, 1, N, off) == round(11_800 + N / 80.0)


@pytest.mark.parametrize("nbytes", [1 * KIB, 4 * KIB])
def test_ll_keeps_its_slots_at_the_receiver_even_under_p2p_read(nbytes: int):
    """A small A100 send runs LL, whose buffer p2p.cc leaves at the receiver: it writes across the link."""
    topo = load_topology("a100x64")
    c = choose(Collective("send_recv", (0, 1), nbytes, "uint8"), topo, AlgoOptions())
    assert c is not None and c.protocol == "LL"
    assert handoff_ns(topo, AlgoOptions(), {}, 0, 1, nbytes) == _lone_transfer_ns(topo, 0, 1, nbytes, AlgoOptions())


def test_the_ideal_model_times_no_hand_off():
    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    assert handoff_ns(topo, AlgoOptions(model="ideal"), {}, 0, 1, N) is None
