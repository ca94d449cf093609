"""The caching-allocator model against the rules of PyTorch's native CUDA allocator, case by case: each
expected figure is worked out by hand from the rules in phantora/runtime/caching_allocator.py's docstring."""

from __future__ import annotations

import pytest

from phantora.runtime.caching_allocator import AllocatorConfig, CachingAllocator

KiB, MiB = 1 << 10, 1 << 20


def test_small_requests_share_2_mib_segments() -> None:
    a = CachingAllocator()
    for k in range(2048):  # 2048 blocks of 1 KiB fill one 2 MiB segment exactly
        a.malloc(k, 1000)  # rounds up to 1024
    assert a.reserved == 2 * MiB and a.segments == 1
    a.malloc(2048, 1)  # a 512-byte block in a second segment
    assert a.reserved == 4 * MiB and a.segments == 2


def test_requests_under_10_mib_split_20_mib_segments() -> None:
    a = CachingAllocator()
    for k in range(4):
        a.malloc(k, 5 * MiB)
    assert a.reserved == 20 * MiB  # four 5 MiB blocks out of one 20 MiB segment
    a.malloc(4, 5 * MiB)
    assert a.reserved == 40 * MiB


def test_large_requests_round_up_to_2_mib() -> None:
    a = CachingAllocator()
    a.malloc(0, 30 * MiB + 1)
    assert a.reserved == 32 * MiB


def test_freed_blocks_are_cached_and_reused() -> None:
    a = CachingAllocator()
    a.malloc(0, 100 * MiB)
    a.free(0)
    assert a.reserved == 100 * MiB and a.cached_free == 100 * MiB  # freed, still reserved
    a.malloc(1, 50 * MiB)  # takes the cached block and splits it (50 MiB left > 1 MiB)
    a.malloc(2, 50 * MiB)
    assert a.reserved == 100 * MiB and a.cached_free == 0
    a.free(1)
    a.free(2)  # the halves merge back into one free block
    a.malloc(3, 100 * MiB)
    assert a.reserved == 100 * MiB


def test_fragmentation_reserves_more_than_is_held_and_empty_cache_returns_it() -> None:
    a = CachingAllocator()
    a.malloc(0, 60 * MiB)
    a.malloc(1, 60 * MiB)
    a.free(0)
    a.malloc(2, 80 * MiB)  # the cached 60 MiB block is too small: a new segment
    assert a.reserved == 200 * MiB  # 140 MiB held
    a.empty_cache()  # the wholly free 60 MiB segment goes back
    assert a.reserved == 140 * MiB and a.peak_reserved == 200 * MiB


def test_a_full_device_releases_cached_segments_and_retries() -> None:
    a = CachingAllocator(limit=100 * MiB)
    a.malloc(0, 60 * MiB)
    a.free(0)
    a.malloc(1, 70 * MiB)  # 60 + 70 > 100: the cached 60 MiB segment is released first
    assert a.reserved == 70 * MiB and a.alloc_retries == 1


def test_max_split_size_keeps_oversize_blocks_whole() -> None:
    a = CachingAllocator(AllocatorConfig.parse("max_split_size_mb:100"))
    a.malloc(0, 300 * MiB)
    a.free(0)
    a.malloc(1, 50 * MiB)  # under the limit: may not take the 300 MiB block
    assert a.reserved == 350 * MiB
    a.malloc(2, 290 * MiB)  # over it, and within 20 MiB of the block: takes it whole
    assert a.reserved == 350 * MiB
    b = CachingAllocator()
    b.malloc(0, 300 * MiB)
    b.free(0)
    b.malloc(1, 50 * MiB)  # without the option, the block is split
    assert b.reserved == 300 * MiB


def test_expandable_segments_grow_in_pages() -> None:
    a = CachingAllocator(AllocatorConfig.parse("expandable_segments:True"))
    a.malloc(0, 12 * MiB)  # one 20 MiB page: [12 held | 8 free]
    assert a.reserved == 20 * MiB
    a.malloc(1, 12 * MiB)  # the free tail grows by a page to 28 MiB, split 12 + 16
    a.malloc(2, 12 * MiB)  # the 16 MiB free block
    assert a.reserved == 40 * MiB and a.segments == 1
    plain = CachingAllocator()
    for k in range(3):
        plain.malloc(k, 12 * MiB)  # 12 MiB segments (rounded to 2 MiB)
    assert plain.reserved == 36 * MiB and plain.segments == 3


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:64"])
def test_reserved_covers_what_is_held_in_any_order(conf: str) -> None:
    a = CachingAllocator(AllocatorConfig.parse(conf))
    held: dict[int, int] = {}
    sizes = [1, 700, 4 * KiB, 900 * KiB, 3 * MiB, 11 * MiB, 64 * MiB, 130 * MiB]
    for k in range(400):  # a deterministic mix of allocations and frees
        size = sizes[(k * 7) % len(sizes)]
        a.malloc(k, size)
        held[k] = size
        if k % 3 == 2:
            gone = k - 2 - (k % 5 == 0)
            if gone in held:
                a.free(gone)
                del held[gone]
        assert a.reserved >= sum(held.values())
    for k in list(held):
        a.free(k)
    assert a.cached_free == a.reserved  # everything freed is cached, nothing is lost
    a.empty_cache()
    assert a.reserved == 0
