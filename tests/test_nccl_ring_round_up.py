"""NCCL < 2.20 rounds a ring's LL / LL128 chunks up in the kernel (ring_round_up.py), checked against the kernel's
own arithmetic (all_reduce.h `runRing`, v2.18.5-1) worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from phantora.collectives.nccl import platform_of
from phantora.collectives.nccl.ring_pipeline import calls, chunk_at, loop_time, slowest_loop_time
from phantora.collectives.nccl.ring_round_up import busiest_over_mean, loop_chunks, min_chunk_bytes, streamed_over_even
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.tuning import select
from phantora.topology import dgx_host

MiB = 1 << 20
A100 = platform_of(dgx_host(gpu="a100"), tuple(range(8)))


def _at(version: tuple[int, int]) -> NcclSettings:
    return dataclasses.replace(NcclSettings(), nccl_version=version)


def test_minimum_chunks_are_nccl_s() -> None:
    # LL: nthreads x sizeof(uint64_t); LL128: nthreads x (8 words x 15/16 data x 8 B) / 2
    assert min_chunk_bytes("LL", 512) == 512 * 8
    assert min_chunk_bytes("LL128", 640) == 640 * (8 * 15 * 8 // 16) // 2 == 19_200


def _busiest_link(sizes: list[int]) -> int:
    """A lower bound on a ring loop's time, worked from runRing's chunk order: rank x sends every chunk in its
    first n calls and again in the next n-2, all but chunks x and x+1, so its link carries 2 x total - s(x) -
    s(x+1) bytes."""
    n = len(sizes)
    return max(2 * sum(sizes) - sizes[x] - sizes[(x + 1) % n] for x in range(n))


def test_chunk_order_is_run_ring_s() -> None:
    # rank x: step 0 sends chunk x-1, steps 1 .. n-2 chunks x-2 .. x-n+1, step n-1 chunk x, then x-1 .. x-n+2, x+1
    assert [chunk_at(0, s, 3) for s in range(calls(3))] == [2, 1, 0, 2, 1]
    assert [chunk_at(1, s, 3) for s in range(calls(3))] == [0, 2, 1, 0, 2]


def test_even_chunks_take_2_times_n_minus_1_chunk_times() -> None:
    for n in (2, 3, 8):
        assert loop_time((5,) * n) == 2 * (n - 1) * 5


def test_three_ranks_uneven_worked_by_hand() -> None:
    # chunks (2, 1, 0): ends call by call (ranks 0, 1, 2): (0, 2, 1), (1, 2, 3), (3, 3, 3), (3, 5, 4), (4, 5, 5);
    # the busiest link (rank 1: 2 x 3 - 1 - 0) gives the same 5, the largest-chunk rule 4 x 2 = 8
    assert loop_time((2, 1, 0)) == 5 == _busiest_link([2, 1, 0])
    assert loop_time((2, 2, 0)) == 6 == _busiest_link([2, 2, 0])
    # a buffer of 2 steps: rank 0's call 2 waits for rank 1's call 1 (ends 2), and so on: (0, 2, 1), (1, 2, 3),
    # (4, 4, 3), (4, 6, 5), (5, 6, 6)
    assert loop_time((2, 1, 0), steps_ahead=2) == 6
    assert slowest_loop_time([[2, 1, 0], [1, 1, 1]]) == 5


def test_last_loop_is_laid_out_as_calc_offset() -> None:
    # 7 B, 3 ranks, 2 channels, minimum 2 B: realChunkSize = ceil(7 / 12) x 2 = 2; chunk c of channel b at
    # (2c + b) x 2: channel 0 [0,2) [4,6) [8,..) -> 2, 2, 0; channel 1 [2,4) [6,7) -> 2, 1, 0
    assert loop_chunks(7, 3, 2, 2, 100) == [[2, 2, 0], [2, 1, 0]]
    # the slowest channel (6) over the even split's 4 sends of 7/6 B: 6 x 6 / (4 x 7)
    assert streamed_over_even(7, 3, 2, 2, 100) == pytest.approx(9 / 7, rel=1e-12)


@pytest.mark.parametrize(
    ("proto", "size", "real", "full", "partial"),
    [
        ("LL", 1 * MiB, 2 * 4_096, 128, 0),  # 8,192 B chunks: indices 0 .. 127 full, channels 0-7 six of 8
        ("LL128", 4 * MiB, 2 * 19_200, 109, 4 * MiB - 109 * 38_400),  # 0 .. 108 full, 109 part
        ("LL128", 8 * MiB, 3 * 19_200, 145, 8 * MiB - 145 * 57_600),
    ],
)
def test_a100_all_reduce_runs_at_its_busiest_link(proto: str, size: int, real: int, full: int, partial: int) -> None:
    """On 8 A100 x 24 channels the streamed loop takes its busiest link's bytes, not 2(n-1) largest chunks."""
    at = [[c * 24 + b for c in range(8)] for b in range(24)]  # calcOffset: chunk c of channel b
    chunks = [[real if i < full else partial if i == full else 0 for i in row] for row in at]
    slowest = max(_busiest_link(sizes) for sizes in chunks)
    got = busiest_over_mean("all_reduce", proto, A100, _at((2, 18)), size, 24)
    assert got == pytest.approx(slowest / (14 * size / 192), rel=1e-12)
    assert 1.0 < got < real / (size / 192)  # slower than even, faster than the largest-chunk rule


def test_all_gather_rounds_over_channels_only() -> None:
    # all_gather.h: one rank's part (4 MiB / 8) over nChannels x minChunkSizeLL128
    got = busiest_over_mean("all_gather", "LL128", A100, _at((2, 18)), 4 * MiB, 24)
    assert got == pytest.approx(2 * 19_200 / (4 * MiB / 8 / 24), rel=1e-12)
    assert busiest_over_mean("all_gather", "LL", A100, _at((2, 18)), 4 * MiB, 24) == 1.0  # host-set LL chunk


@pytest.mark.parametrize("version", [(2, 20), (2, 30)])
def test_even_from_2_20_and_never_for_simple(version: tuple[int, int]) -> None:
    assert busiest_over_mean("all_reduce", "LL128", A100, _at(version), 4 * MiB, 24) == 1.0
    assert busiest_over_mean("all_reduce", "Simple", A100, _at((2, 18)), 4 * MiB, 24) == 1.0


def test_the_choice_carries_the_slower_rate() -> None:
    """The tuner does not see the rounding (same choice); the bandwidth term is the streamed loop's."""
    old, new = select("all_reduce", A100, _at((2, 19)), 4 * MiB), select("all_reduce", A100, _at((2, 20)), 4 * MiB)
    assert old is not None and new is not None
    assert (old.algorithm, old.protocol, old.channels) == (new.algorithm, new.protocol, new.channels)
    assert new.protocol == "LL128" and new.channels == 24
    # the busiest link: 10 chunks of 38,400 B over 14 even shares (test_a100_all_reduce_runs_at_its_busiest_link)
    assert new.algbw / old.algbw == pytest.approx(10 * 38_400 / (14 * 4 * MiB / 192), rel=1e-9)
