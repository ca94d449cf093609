"""Lone sends that share a connection share its NCCL_STEPS slots per channel (collectives/handoff.py `send_slots`,
collectives/slot_window.py), read from NCCL v2.26.5-1.

A send is split over the pair's p2p channels (`addP2pToPlan`: parts rounded up to 4 KiB) and takes one slot per
chunk on each: the p2p chunk (NVLink 512 KiB, network 128 KiB, halved across hosts below 8 of them, a quarter below
one), stored as an 8-bit float. Inside a host (P2P, SHM) the receiver frees the slots as it consumes them, so sends
hand off while the unreceived ones' slots and their own fit in 8; across hosts the proxy runs one send's op per
channel at a time on its shared buffer (proxy.cc `ProxyAppend`, net.cc `sendProxyProgress`, whose slots the network
frees only once the receiver posted its buffer: net_ib.cc `ncclIbIsend`), so a second unreceived send there waits
for the first to be received. Closed forms: an H100 NVLink hand-off of 64 KiB (one channel) or 256 KiB (four) is
8.4 + 3.4 us + the bytes at 20.6 GB/s a channel = 14,981 ns (tests/test_handoff_transports.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from phantora.collectives.handoff import fp8_floor, part_bytes, send_slots
from phantora.collectives.nccl import tables as T
from phantora.collectives.slot_window import NCCL_STEPS, Slots, SlotWindow
from phantora.collectives.spec import AlgoOptions
from phantora.launcher import RunConfig, launch
from phantora.topology import load_topology
from phantora.topology.generators import leaf_spine

KIB = 1024
MIB = 1024 * KIB
NVL = round(11_800 + 64 * KIB / 20.6)  # 14,981 ns: 64 KiB on one channel, or 256 KiB on four (4 x 20.6 GB/s)


def _cross() -> object:
    return leaf_spine(1, 2, 1, nic_rate="100Gbps")


def test_the_steps_constant_is_nccls():
    assert NCCL_STEPS == T.NCCL_STEPS == 8


def test_chunks_round_down_to_nccls_8_bit_float_and_parts_to_4_kib():
    assert [fp8_floor(x) for x in (65536, 98304, 100_000, 131_071, 15)] == [65536, 98304, 98304, 122_880, 15]
    assert part_bytes(256 * KIB, 4) == [64 * KIB] * 4
    assert part_bytes(100_000, 3) == [36_864, 36_864, 26_272]  # ceil(100,000 / 3) = 33,334 -> 36,864


@pytest.mark.parametrize(
    ("nbytes", "steps"),
    [
        (0, (1,)),  # an empty send still posts one step
        (1 * KIB, (1,)),  # below one 128 KiB step: a 32 KiB chunk
        (256 * KIB, (4,)),  # below 8 steps: 64 KiB chunks
        (768 * KIB, (12,)),  # 64 KiB chunks too: 12 steps, more than the 8 slots (within the old 1 MiB bound)
        (1 * MIB, (8,)),  # 8 steps of 128 KiB
    ],
)
def test_across_hosts_one_channel_takes_a_slot_per_network_chunk(nbytes: int, steps: tuple[int, ...]):
    topo = _cross()
    s = send_slots(topo, AlgoOptions(), {}, 0, 1, nbytes)
    back = topo.path_latency_ns(topo.route(topo.node_of_rank(1), topo.node_of_rank(0)))  # the write's ACK back
    assert s == Slots(steps, True, back_ns=back) and s.fits == (max(steps) <= 8) and back > 0


def test_the_pairs_channels_split_a_send_and_nvlink_takes_512_kib_a_slot():
    topo = load_topology("testbed16")
    net, nvl = (topo.path_latency_ns(topo.route(topo.node_of_rank(d), topo.node_of_rank(0))) for d in (8, 1))
    assert net > nvl > 0  # the news of a freed slot: the write's ACK across hosts, the flag inside one
    assert send_slots(topo, AlgoOptions(), {}, 0, 8, 256 * KIB) == Slots((2, 2), True, back_ns=net)  # 2 x 128 KiB
    assert send_slots(topo, AlgoOptions(), {}, 0, 1, 256 * KIB) == Slots((1,) * 4, False, back_ns=nvl)  # 4 x 64 KiB
    big = send_slots(topo, AlgoOptions(), {}, 0, 1, 64 * MIB)
    assert big == Slots((8,) * 16, False, back_ns=nvl) and big.fits  # 16 channels x 8 slots x 512 KiB: NCCL's 64 MiB
    assert not send_slots(topo, AlgoOptions(), {}, 0, 1, 128 * MIB).fits
    private = AlgoOptions(nccl_env=(("NCCL_NET_SHARED_BUFFERS", "0"),))  # each connection its own buffer
    assert send_slots(topo, private, {}, 0, 8, 256 * KIB) == Slots((2, 2), False, back_ns=net)


def test_a_window_frees_the_oldest_sends_until_the_next_fits():
    w: SlotWindow[str] = SlotWindow()
    assert [w.admit(f"s{i}", Slots((1,), False)) for i in range(8)] == [[]] * 8  # 8 one-slot sends fit
    assert w.admit("s8", Slots((1,), False)) == ["s0"]  # the ninth waits for the first to be received
    assert w.admit("big", Slots((4, 1), False)) == ["s1", "s2", "s3", "s4"]  # 4 slots on part 0: 3 + 4 <= 8 after
    one: SlotWindow[str] = SlotWindow()
    assert one.admit("a", Slots((4,), True)) == [] and one.admit("b", Slots((1,), True)) == ["a"]


BURST = """
    import sys, torch, torch.distributed as dist
    mode, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group()
    r = dist.get_rank()
    peer = 1 - r
    xs = [torch.full((n,), float(10 * r + i), device="cuda") for i in range(k)]
    boxes = [torch.zeros(n, device="cuda") for _ in range(k)]
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(k + 1)]
    ev[0].record()
    if mode == "both" or r == 0:  # "both": each rank sends k then receives k; "one": rank 0 sends, rank 1 receives
        for i in range(k):
            dist.send(xs[i], peer)
            ev[i + 1].record()
    if mode == "one" and r == 1:
        a = torch.ones(2048, 2048, device="cuda")
        for _ in range(12):
            a = a @ a  # the receiver is late
    if mode == "both" or r == 1:
        for i in range(k):
            dist.recv(boxes[i], peer)
        assert [float(b[0]) for b in boxes] == [10 * peer + i for i in range(k)], boxes
    print("TIMES", *[e.t_ns for e in ev], flush=True)
    dist.destroy_process_group()
"""


def _burst(tmp_path: Path, topo: object, mode: str, floats: int, k: int):
    script = tmp_path / "burst.py"
    script.write_text(textwrap.dedent(BURST))
    cfg = RunConfig(str(script), [mode, str(floats), str(k)], topology=topo, nproc=2, trace="none", timeout_s=240)
    cfg.out_dir = str(tmp_path / "run")
    return launch(cfg)


def _times(log: str) -> list[int]:
    return [int(v) for v in next(x for x in log.splitlines() if x.startswith("TIMES")).split()[1:]]


def test_two_sends_then_two_receives_inside_a_host_both_hand_off(tmp_path: Path):
    """testbed16 GPU 0 <-> 1 (NVLink): each 256 KiB send takes one slot on each of 4 channels, 2 of 8 for both, so
    both hand off before either receive, 14,981 ns apart."""
    rep = _burst(tmp_path, load_topology("testbed16"), "both", 64 * KIB, 2)
    for me in (0, 1):
        t0, t1, t2 = _times(rep.logs[f"rank {me}"])
        assert (t1 - t0, t2 - t1) == (NVL, NVL), (t0, t1, t2)


def test_two_sends_then_two_receives_across_hosts_deadlock_naming_the_send(tmp_path: Path):
    """Two hosts: the second send's op waits behind the first's in the proxy, which waits for the receiver's
    buffer, which the peer posts only after its own second send: NCCL hangs, and so does the run."""
    with pytest.raises(BridgeError) as info:
        _burst(tmp_path, _cross(), "both", 64 * KIB, 2)
    text = str(info.value)
    assert text.startswith("deadlock") and "send#0" in text, text


def test_the_send_that_overflows_the_slots_waits_for_the_first_to_be_received(tmp_path: Path):
    """Rank 0 sends nine 64 KiB tensors (one slot each) to a late receiver: the first eight hand off back to back
    (14,981 ns each), the ninth once the first's flow has ended (its slot freed) and the receiver's flag is back
    across the NVLink path (its propagation, `Slots.back_ns`), then its own 14,981 ns."""
    topo = load_topology("testbed16")
    back = topo.path_latency_ns(topo.route(topo.node_of_rank(1), topo.node_of_rank(0)))
    assert back > 0
    rep = _burst(tmp_path, topo, "one", 16 * KIB, 9)
    t = _times(rep.logs["rank 0"])
    assert [b - a for a, b in zip(t[:8], t[1:9], strict=True)] == [NVL] * 8, t
    flows = sorted((c for c in rep.cosim.completions if c.size and c.src == 0), key=lambda c: c.start_ns)
    assert len(flows) == 9 and flows[0].start_ns > t[8], (flows[0], t)  # the receiver came after the eighth
    assert t[9] == flows[0].end_ns + back + NVL, (t, flows[0])
