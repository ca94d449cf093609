"""The bytes each channel's flows carry (phantora/collectives/channel_shares.py): NCCL 2.22+'s unequal parts of
whole cells (enqueue.cc `scheduleCollTasksToPlan`), worked by hand below, 2.20-2.21's aligned parts, and an even
split before 2.20."""

from __future__ import annotations

from collections import Counter

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import dgx_host

MiB = 1 << 20
KiB = 1 << 10
RING_EDGES = 14  # an 8-rank ring all-reduce channel's flows carry 2(n-1) x its share (coarse: one flow per edge)


def _channel_bytes(size: int, kind: str = "all_reduce", channels: int = 0, **env: str) -> tuple[dict[int, int], dict]:
    """Payload bytes on each channel's flows of a Simple ring `kind` over 8 A100s (Simple: wire = payload);
    `channels`: the option that overrides NCCL's count of the algorithm's channels (0: NCCL's)."""
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", **env}
    coll = Collective(kind, tuple(range(8)), size, "fp32")
    dag = decompose(coll, dgx_host(gpu="a100"), AlgoOptions(nccl_env=nccl_env(env), channels=channels))
    out: Counter = Counter()
    for f in dag.flows:
        out[int(f.tag.split("/ch")[1].split("/")[0])] += f.size
    return dict(out), dag.choice or {}


def test_a_count_four_bytes_past_whole_cells_is_dealt_as_nccl_2_30_deals_it():
    """8 MiB + 4 B all-reduce, NCCL 2.30, 24 channels: cells of 32 KiB of traffic = 16,384 B, 513 cells (the last
    holds 4 B); traffic 2 x 8,388,612 over 24 = 699,051, rounded up to 16 B: 699,056 -> 22 cells a channel
    (360,448 B). lo 22, mid 22 x 22, hi 7 cells = 114,688 B less the 16,380 B excess = 98,308 B: 24 parts."""
    size = 8 * MiB + 4
    got, choice = _channel_bytes(size)
    assert choice["channels"] == 24
    want = {c: RING_EDGES * 360_448 for c in range(23)} | {23: RING_EDGES * 98_308}
    assert got == want
    assert sum(got.values()) == RING_EDGES * size  # every byte, once per ring step


def test_nccl_2_21_splits_on_the_host_in_aligned_parts():
    """The same count on NCCL 2.21 (enqueue.cc `computeColl`, v2.21.5-1): countPerChannels = alignUp(divUp(count,
    24), NCCL_SIMPLE_ALIGNMENT = 32 x 8 x 16 = 4,096 B) = alignUp(349,526, 4,096) = 352,256 B, the channels used
    divUp(8,388,612, 352,256) = 24, the last the rest: 8,388,612 - 23 x 352,256 = 286,724 B."""
    got, _ = _channel_bytes(8 * MiB + 4, PHANTORA_NCCL_VERSION="2.21")
    assert got == {c: RING_EDGES * (352_256 if c < 23 else 286_724) for c in range(24)}


def test_before_2_20_every_channel_strides_the_buffer_evenly():
    """NCCL 2.19: every channel strides the whole buffer (no parts): 8,388,612 / 24 = 349,525.5, the first 12
    channels one byte more."""
    got, _ = _channel_bytes(8 * MiB + 4, PHANTORA_NCCL_VERSION="2.19")
    assert got == {c: RING_EDGES * (349_526 if c < 12 else 349_525) for c in range(24)}


def test_a_small_collective_fills_only_the_cells_it_needs():
    """64 KiB all-reduce, NCCL 2.30 (cells of 16 KiB = 32 KiB of traffic; traffic 128 KiB): on NCCL's 2 channels
    the budget is 64 KiB of traffic, 2 cells each: 2 parts of 32 KiB; on 8 channels it is 16 KiB, below one cell,
    so each channel takes one cell and 4 of the 8 carry it all."""
    got, choice = _channel_bytes(64 * KiB)
    assert choice["channels"] == 2
    assert got == {c: RING_EDGES * 32 * KiB for c in range(2)}
    got, _ = _channel_bytes(64 * KiB, channels=8)
    assert got == {c: RING_EDGES * 16 * KiB for c in range(4)}


def test_split_past_the_algorithms_channels_uses_the_communicators_next_ones():
    """524,292 B all-reduce on 16 of the communicator's 24 channels (NCCL_MAX_NCHANNELS would shrink the
    communicator too, so 16 is the option's channels): 2.30 cells of 16,384 B, budget 65,536 B of traffic = 2 cells
    a channel; 33 cells -> lo 2, 15 mid of 2, hi 1 cell less 16,380 B = 4 B: 17 channels."""
    got, _ = _channel_bytes(524_292, channels=16)
    assert got == {c: RING_EDGES * 32 * KiB for c in range(16)} | {16: RING_EDGES * 4}


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_all_gather_and_reduce_scatter_carry_their_part_of_each_ranks_count(kind):
    """8 MiB all-gather / reduce-scatter, NCCL 2.30: the count is 1 MiB; traffic x 8 a byte, cells of 4,096 B
    (32 KiB of traffic), 256 of them; 8 MiB of traffic over 24 = 349,525 -> 349,536, 11 cells a channel (lo 11,
    22 mid, hi 3 cells): 23 channels of 8 x 45,056 B and one of 8 x 12,288 B; a ring channel's 8 edges carry
    7 of its 8 slices each in all: 7 x its bytes."""
    got, _ = _channel_bytes(8 * MiB, kind)
    want = {c: 7 * 8 * 45_056 for c in range(23)} | {23: 7 * 8 * 12_288}
    assert got == want
    assert sum(got.values()) == 7 * 8 * MiB
