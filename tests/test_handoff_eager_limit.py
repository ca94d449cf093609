"""A lone send's only size limit is its connection's slots (collectives/slot_window.py `Slots.fits`), read from NCCL
v2.26.5-1: the send kernel waits only for a free slot of its channel's NCCL_STEPS (prims_simple.h), on every
transport (P2P write and read, SHM, NET), so any send whose parts fit 8 chunks a channel ends before its receiver
runs. There used to be a second cap, 8 x the least p2p step (1 MiB by default), which made NVLink sends from 1 MiB
to 64 MiB wait for their receivers.

Closed forms: inside an H100 host (testbed16 GPU 0 -> 1, P2P write) a send takes 16 channels of 8 slots of 512 KiB,
64 MiB, and hands off at 8.4 + 3.4 us + its bytes at 16 x 20.6 GB/s (tests/test_handoff_transports.py); across
two H100 hosts (GPU 0 -> 8) 4 channels of 8 x 128 KiB, 4 MiB; one GPU a host (leaf_spine(1, 2, 1)) 1 channel, 1 MiB.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from phantora.collectives.handoff import handoff_ns, send_slots
from phantora.collectives.slot_window import NCCL_STEPS
from phantora.collectives.spec import AlgoOptions
from phantora.launcher import RunConfig, launch
from phantora.topology import load_topology
from phantora.topology.generators import leaf_spine

KIB = 1024
MIB = 1024 * KIB


def _nvl_handoff(nbytes: int) -> int:
    """An H100 NVLink hand-off on 16 channels: Simple's 8.4 us + NVLink's 3.4 us, then 16 x 20.6 GB/s."""
    return round(11_800 + nbytes / (16 * 20.6))


@pytest.mark.parametrize(
    ("src", "dst", "window"),
    [
        (0, 1, 16 * NCCL_STEPS * 512 * KIB),  # NVLink: 64 MiB
        (0, 8, 4 * NCCL_STEPS * 128 * KIB),  # two H100 hosts: 4 MiB
    ],
)
def test_a_send_fits_up_to_its_channels_slots_and_not_a_4_kib_part_more(src: int, dst: int, window: int):
    topo = load_topology("testbed16")
    assert send_slots(topo, AlgoOptions(), {}, src, dst, window).fits
    assert not send_slots(topo, AlgoOptions(), {}, src, dst, window + 4 * KIB).fits


@pytest.mark.parametrize(
    ("env", "window"),
    [
        ((), 8 * 128 * KIB),  # one channel of the net p2p chunk, 128 KiB
        ((("NCCL_P2P_NET_CHUNKSIZE", "65536"),), 8 * 64 * KIB),
        ((("NCCL_P2P_NET_CHUNKSIZE", "1048576"),), 8 * 512 * KIB),  # a step never exceeds 4 MiB / NCCL_STEPS
        ((("NCCL_BUFFSIZE", "262144"),), 262144),  # ... nor the Simple buffer over NCCL_STEPS
    ],
)
def test_across_one_channel_the_window_follows_nccls_chunk_settings(env: tuple[tuple[str, str], ...], window: int):
    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    opts = AlgoOptions(nccl_env=env)
    assert send_slots(topo, opts, {}, 0, 1, window).fits
    assert not send_slots(topo, opts, {}, 0, 1, window + 4 * KIB).fits


def test_the_hand_off_closed_form_of_8_and_64_mib_over_nvlink():
    topo = load_topology("testbed16")
    assert handoff_ns(topo, AlgoOptions(), {}, 0, 1, 8 * MIB) == _nvl_handoff(8 * MIB) == 37_251
    assert handoff_ns(topo, AlgoOptions(), {}, 0, 1, 64 * MIB) == _nvl_handoff(64 * MIB) == 215_407


SENDS = """
    import sys, torch, torch.distributed as dist
    mode, n = sys.argv[1], int(sys.argv[2])
    dist.init_process_group()
    r = dist.get_rank()
    peer = 1 - r
    x, box = torch.ones(n, dtype=torch.uint8, device="cuda"), torch.zeros(n, dtype=torch.uint8, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    if mode == "both" or r == 0:  # "both": each rank sends, then receives; "one": rank 0 sends to a late receiver
        dist.send(x, peer)
        e1.record()
    if mode == "one" and r == 1:
        a = torch.ones(4096, 4096, device="cuda")
        for _ in range(8):
            a = a @ a
    if mode == "both" or r == 1:
        dist.recv(box, peer)
    print("TIMES", e0.t_ns, e1.t_ns if (mode == "both" or r == 0) else 0, flush=True)
    dist.destroy_process_group()
"""


def _run(tmp_path: Path, topo: object, mode: str, nbytes: int):
    script = tmp_path / "sends.py"
    script.write_text(textwrap.dedent(SENDS))
    cfg = RunConfig(
        str(script), [mode, str(nbytes)], topology=topo, nproc=2, trace="none", timeout_s=240, tensors="phantom",
        dedup="off",
    )  # fmt: skip
    cfg.out_dir = str(tmp_path / "run")
    return launch(cfg)


def _times(log: str) -> tuple[int, int]:
    t0, t1 = (int(v) for v in next(x for x in log.splitlines() if x.startswith("TIMES")).split()[1:])
    return t0, t1


def _flows(rep) -> tuple[int, int]:
    """The first start and last end of rank 0's send, one flow a channel."""
    flows = [c for c in rep.cosim.completions if c.size and c.src == 0]
    assert len(flows) == 16, flows
    return min(c.start_ns for c in flows), max(c.end_ns for c in flows)


def test_two_ranks_sending_8_mib_first_inside_a_host_both_hand_off(tmp_path: Path):
    """8 MiB over NVLink takes one slot on each of 16 channels: each rank's send ends at 37,251 ns, before either
    receive (with the old 1 MiB cap both sends waited for their receivers: a deadlock)."""
    rep = _run(tmp_path, load_topology("testbed16"), "both", 8 * MIB)
    for me in (0, 1):
        t0, t1 = _times(rep.logs[f"rank {me}"])
        assert t1 - t0 == _nvl_handoff(8 * MIB) == 37_251, (t0, t1)


def test_a_64_mib_send_hands_off_before_a_late_receiver(tmp_path: Path):
    """64 MiB fills all 16 x 8 slots: it ends at 215,407 ns, before its flow starts (the receiver is late)."""
    rep = _run(tmp_path, load_topology("testbed16"), "one", 64 * MIB)
    t0, t1 = _times(rep.logs["rank 0"])
    start, _ = _flows(rep)
    assert t1 - t0 == _nvl_handoff(64 * MIB) == 215_407 and start > t1, (t0, t1, start)


def test_a_send_a_part_over_the_slots_waits_for_its_late_receiver(tmp_path: Path):
    """64 MiB + 4 KiB takes 9 slots on its first channels: its kernel waits for the receiver, so its send ends
    with its flow."""
    rep = _run(tmp_path, load_topology("testbed16"), "one", 64 * MIB + 4 * KIB)
    t0, t1 = _times(rep.logs["rank 0"])
    start, end = _flows(rep)
    assert t1 == end and start > t0 + _nvl_handoff(64 * MIB), (t0, t1, start, end)


def test_across_one_channel_a_send_past_1_mib_still_deadlocks_a_send_first_exchange(tmp_path: Path):
    """leaf_spine(1, 2, 1): one net channel of 8 x 128 KiB, so 1 MiB + 4 KiB waits for its receiver: NCCL hangs."""
    with pytest.raises(BridgeError) as info:
        _run(tmp_path, leaf_spine(1, 2, 1, nic_rate="100Gbps"), "both", MIB + 4 * KIB)
    assert str(info.value).startswith("deadlock"), str(info.value)
