"""The LL128 tree's chunk ladder in NCCL's own arithmetic (enqueue.cc `calcCollChunking`, v2.30.7-1): the bytes over
(channels x chunk) divide as integers (a size_t over an int), log2i rounds the node count's log down, and ppn is the
ranks over the nodes. The sizes here sit where real-number arithmetic would decide otherwise; the expected chunks
are worked out by hand in each docstring from the LL128 buffer (120 x 640 x 8 x 8 bytes, NCCL_LL128_ELEMS_PER_THREAD
x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8), its step (over NCCL_STEPS) and 120 data bytes of every 128."""

from __future__ import annotations

from phantora.collectives.nccl.chunking import chunk_bytes
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import settings_from_env

LL128_CHUNK = 120 * 640 * 8 * 8 // 8 // 128 * 120  # 576,000 data bytes of one LL128 step
CHANNELS = 24


def h100s(nodes: int, per_node: int) -> Platform:
    """`nodes` hosts of `per_node` H100s on NVSwitch and 400G NICs, as NCCL's tuner sees them."""
    return Platform("hopper", 90, nodes * per_node, nodes, per_node, "nvlink", True, 360.0, 50.0 if nodes > 1 else 0.0,
                    per_node if nodes > 1 else 0)  # fmt: skip


def test_integer_division_halves_where_the_real_quotient_would_not() -> None:
    """One node of 8: nstepsLL128 = 1 + 0 + 0.8 = 1.8, so the first rung halves while bytes / (24 x chunk) < 1.8 x
    64 / 8 = 14.4. At 14.5 chunks a channel the integer quotient is 14 < 14.4: NCCL halves to 288,000 (then 29
    chunks a channel, >= 14.4 and >= 3.6: it stops); the real quotient 14.5 would have kept 576,000."""
    nbytes = 29 * CHANNELS * LL128_CHUNK // 2
    got = chunk_bytes("tree", "LL128", h100s(1, 8), settings_from_env({}), nbytes, CHANNELS)
    assert got == LL128_CHUNK // 2


def test_log2i_rounds_the_node_count_down() -> None:
    """Three nodes of 8: log2i(3) = 1, so nstepsLL128 = 1 + 1 + 0.8 = 2.8 and the first rung is 2.8 x 64 / 8 = 22.4.
    At 23 chunks a channel the chunk stays 576,000 (23 >= 22.4 and >= 5.6); with log2(3) = 1.585 the rung would
    have been 27.1 and the chunk halved."""
    nbytes = 23 * CHANNELS * LL128_CHUNK
    got = chunk_bytes("tree", "LL128", h100s(3, 8), settings_from_env({}), nbytes, CHANNELS)
    assert got == LL128_CHUNK


def at(version: str, nbytes: int, nodes: int = 1) -> int:
    """The tree LL128 chunk NCCL `version` moves for an `nbytes` all-reduce on `nodes` hosts of 8 H100s."""
    st = settings_from_env({"PHANTORA_NCCL_VERSION": version})
    return chunk_bytes("tree", "LL128", h100s(nodes, 8), st, nbytes, CHANNELS)


def test_small_calls_halve_down_to_each_rung_before_grains() -> None:
    """NCCL 2.21, one node of 8 at 1 MiB: 1 MiB // (24 x 576,000) = 0 < 14.4, so the first rung halves to 288,000,
    144,000 and then 72,000 (no longer > 128 KiB); 1 MiB // (24 x 72,000) = 0 < 3.6, so the second halves to 36,000
    and 18,000 (no longer > 32 KiB). 2.21 has no grain rounding: 18,000 stays."""
    assert at("2.21", 1 << 20) == 18_000


def test_from_2_22_the_chunk_is_cut_to_whole_ll128_grains() -> None:
    """NCCL 2.22 on (v2.22.3-1 enqueue.cc `chunkSize / grainSize * grainSize`): the same ladder ends at 18,000, then
    rounds down to whole grains of ncclProtoGrainSize(LL128) = 32 lanes x 8 words / 16 words a line x 15 data words
    x 8 B = 1,920 B: 18,000 // 1,920 = 9 grains, 17,280 B. At 2.30 (the model's default) the same."""
    grain = 32 * 8 // 16 * 15 * 8
    assert at("2.22", 1 << 20) == 18_000 // grain * grain == 17_280
    assert chunk_bytes("tree", "LL128", h100s(1, 8), settings_from_env({}), 1 << 20, CHANNELS) == 17_280


def test_grain_rounding_spares_chunks_that_are_whole_grains() -> None:
    """576,000 = 300 grains and 288,000 = 150 grains: a large call keeps the full step at 2.21 and 2.26 alike; 144,000
    (75) too, while 72,000 (37.5 grains) becomes 37 x 1,920 = 71,040 from 2.22. On one node of 8, 72,000 is the
    chunk where bytes // (24 x 144,000) < 14.4 but bytes // (24 x 72,000) >= 3.6: 24 x 72,000 x 4 bytes."""
    big = 1 << 34
    assert at("2.21", big) == at("2.26", big) == LL128_CHUNK
    nbytes = 4 * CHANNELS * 72_000
    assert at("2.21", nbytes) == 72_000
    assert at("2.26", nbytes) == 71_040
