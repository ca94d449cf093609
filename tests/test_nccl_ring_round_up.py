"""NCCL < 2.20 rounds a ring's LL / LL128 chunks up in the kernel (ring_round_up.py), checked against the kernel's
own arithmetic (all_reduce.h `runRing`, v2.18.5-1) worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from phantora.collectives.nccl import platform_of
from phantora.collectives.nccl.ring_round_up import busiest_over_mean, min_chunk_bytes
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


@pytest.mark.parametrize(
    ("proto", "size", "rounded"),
    [
        ("LL128", 4 * MiB, 2 * 19_200),  # even share 21,845.3 B -> two minimum chunks
        ("LL128", 8 * MiB, 3 * 19_200),  # 43,690.7 B -> three
        ("LL", 1 * MiB, 2 * 4_096),  # 5,461.3 B -> two LL minimum chunks of 512 threads
    ],
)
def test_one_loop_runs_at_its_largest_chunk(proto: str, size: int, rounded: int) -> None:
    slots = 24 * 8  # channels x ranks
    got = busiest_over_mean("all_reduce", proto, A100, _at((2, 18)), size, 24)
    assert got == pytest.approx(rounded / (size / slots), rel=1e-12)


def test_a_full_loop_and_a_rounded_rest() -> None:
    # LL128's chunk is one step's data, 4,915,200 B / 8 x 15/16 = 576,000 B: a loop of 192 slots is 110,592,000 B;
    # 128 MiB leaves 23,625,728 B, ceil(23,625,728 / (192 x 19,200)) = 7 minimum chunks
    got = busiest_over_mean("all_reduce", "LL128", A100, _at((2, 18)), 128 * MiB, 24)
    assert got == pytest.approx((576_000 + 7 * 19_200) / (128 * MiB / 192), rel=1e-12)


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
    """The tuner does not see the rounding (same choice); the bandwidth term is the largest chunk's."""
    old, new = select("all_reduce", A100, _at((2, 19)), 4 * MiB), select("all_reduce", A100, _at((2, 20)), 4 * MiB)
    assert old is not None and new is not None
    assert (old.algorithm, old.protocol, old.channels) == (new.algorithm, new.protocol, new.channels)
    assert new.protocol == "LL128" and new.channels == 24
    assert new.algbw / old.algbw == pytest.approx(2 * 19_200 / (4 * MiB / 192), rel=1e-9)
