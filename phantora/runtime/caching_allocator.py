"""A model of PyTorch's CUDA caching allocator: how many bytes a GPU *reserves* for what tensors hold.

A real program's `torch.cuda.memory_reserved()` and the memory figures frameworks log (torchtitan's
"memory" line, Megatron's "max reserved") count the allocator's segments, not the tensors' bytes. This
replays the simulated device's allocations and frees through the same rules as PyTorch's native
allocator (c10/cuda/CUDACachingAllocator.cpp):

- sizes round up to 512 bytes; requests of at most 1 MiB use the small pool, larger ones the large pool;
  the small pool is modelled as packed (its bytes rounded up to its 2 MiB segments: fragmentation there
  is not modelled, and the pool is small), which keeps the per-op cost of tiny tensors low;
- a request takes the smallest cached free block of its pool that fits, and splits it when what is left
  is worth keeping (at least 512 bytes in the small pool, more than 1 MiB in the large one);
- with no block to take, a segment is reserved from the device: 2 MiB for a small request, 20 MiB for
  a large one under 10 MiB, else the request rounded up to 2 MiB;
- a freed block merges with free neighbours of its segment and stays cached; segments go back to the
  device only on `empty_cache()`, or when a new segment would not fit under the limit (then every
  wholly free segment is released and the reservation retried);
- `max_split_size_mb:N` (PYTORCH_CUDA_ALLOC_CONF): blocks of N MiB or more are never split, a smaller
  request never takes one, and a larger request takes one only within 20 MiB of its size;
- `expandable_segments:True`: each pool has one segment that grows at its end in 2 MiB (small) or 20 MiB
  (large) pages, so a large request no longer strands the rest of a 20 MiB segment.

One stream: the real allocator keeps a pool per stream, and `record_stream` delays reuse across
streams; both are not modelled (collective outputs share the compute stream's pool).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK = 512  # every size rounds up to this
SMALL_SIZE = 1 << 20  # requests up to 1 MiB use the small pool
SMALL_BUFFER = 2 << 20  # a small-pool segment (and its expandable page)
LARGE_BUFFER = 20 << 20  # a large-pool segment for requests under MIN_LARGE_ALLOC (and its expandable page)
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20  # larger requests reserve their size rounded up to this


def segment_size(size: int) -> int:
    """Bytes reserved from the device for a request of `size` (rounded) with no cached block to take."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass
class AllocatorConfig:
    """The PYTORCH_CUDA_ALLOC_CONF options the model follows."""

    max_split_size: int | None = None  # bytes; None: unlimited
    expandable_segments: bool = False

    @classmethod
    def parse(cls, text: str | None) -> AllocatorConfig:
        """`"expandable_segments:True,max_split_size_mb:512"`; other options are accepted and not modelled."""
        cfg = cls()
        for item in filter(None, (text or "").replace(" ", "").split(",")):
            key, _, value = item.partition(":")
            if key == "expandable_segments":
                cfg.expandable_segments = value.lower() in ("true", "1")
            elif key == "max_split_size_mb" and value.isdigit():
                cfg.max_split_size = int(value) << 20
        return cfg


class _Segment:
    """Device memory reserved in one piece (or, expandable, grown at its end)."""

    __slots__ = ("addr", "expandable", "last", "pool", "size")
    addr: int  # its device address: unset until memory_history.py (torch.cuda.memory._snapshot) gives it one

    def __init__(self, pool: int, size: int, expandable: bool = False) -> None:
        self.pool = pool  # 0 small, 1 large
        self.size = size
        self.last: _Block | None = None
        self.expandable = expandable


class _Block:
    """A piece of a segment, held by a tensor or free; linked to its neighbours in the segment."""

    __slots__ = ("free", "next", "prev", "segment", "size")

    def __init__(self, segment: _Segment, size: int, prev: _Block | None = None, nxt: _Block | None = None) -> None:
        self.segment = segment
        self.size = size
        self.free = True
        self.prev = prev
        self.next = nxt


class _FreeBlocks:
    """One pool's cached free blocks: best fit by size (the first freed among equal sizes)."""

    __slots__ = ("by_size", "sizes", "total")

    def __init__(self) -> None:
        self.by_size: dict[int, dict[int, _Block]] = {}  # size -> {id(block): block}, in the order freed
        self.sizes: list[int] = []  # the sizes present, sorted
        self.total = 0

    def add(self, block: _Block) -> None:
        same = self.by_size.get(block.size)
        if same is None:
            same = self.by_size[block.size] = {}
            bisect.insort(self.sizes, block.size)
        same[id(block)] = block
        self.total += block.size

    def remove(self, block: _Block) -> None:
        same = self.by_size[block.size]
        del same[id(block)]
        self.total -= block.size
        if not same:
            del self.by_size[block.size]
            del self.sizes[bisect.bisect_left(self.sizes, block.size)]

    def smallest_fit(self, size: int) -> _Block | None:
        """The block best fit for `size` (not removed), or None."""
        same = self.by_size.get(size)
        if same is None:
            i = bisect.bisect_left(self.sizes, size)
            if i == len(self.sizes):
                return None
            same = self.by_size[self.sizes[i]]
        return next(iter(same.values()))

    def blocks(self) -> list[_Block]:
        return [b for same in self.by_size.values() for b in same.values()]


class CachingAllocator:
    """Reserved bytes of one device under the caching allocator's rules; `malloc`/`free` by a caller's key."""

    def __init__(self, config: AllocatorConfig | None = None, limit: int | None = None) -> None:
        self.config = config or AllocatorConfig()
        self.limit = limit  # device bytes segments may take (None: unlimited)
        self.reserved = 0
        self.peak_reserved = 0
        self.segments = 0
        self.alloc_retries = 0  # reservations retried after releasing cached segments
        self._free = (_FreeBlocks(), _FreeBlocks())  # small pool, large pool
        self._live: dict[int, _Block] = {}  # caller's key -> allocated block (large pool)
        self._expandable: list[_Segment | None] = [None, None]
        self._small: dict[int, int] = {}  # caller's key -> block size (small pool, modelled as packed)
        self.small_held = 0
        self.small_reserved = 0

    # ----- the caller's side -------------------------------------------------------------------
    # A caller that keeps its own keys and sizes (the memory tracker) may count a small block (a multiple of
    # MIN_BLOCK, at most SMALL_SIZE) without a key: add it to `small_held` (subtract it when freed), and call
    # `grow_small()` when `small_held` exceeds `small_reserved`. Blocks counted so must be freed so, not by key.
    def grow_small(self) -> None:
        """Reserve 2 MiB segments until the small pool's packed bytes (`small_held`) fit."""
        grow = -(-(self.small_held - self.small_reserved) // SMALL_BUFFER) * SMALL_BUFFER
        if grow > 0:
            self.small_reserved += grow
            self.segments += grow // SMALL_BUFFER
            self._add_reserved(grow)

    def malloc(self, key: int, nbytes: int) -> None:
        """Allocate `nbytes` for `key` (a key already live is freed first: a resize reallocates)."""
        if key in self._live or key in self._small:
            self.free(key)
        size = MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        if size <= SMALL_SIZE:
            self._small[key] = size
            self.small_held += size
            if self.small_held > self.small_reserved:
                self.grow_small()
            return
        pool = 1
        block = self._take_cached(pool, size) or self._reserve(pool, size)
        block.free = False
        if block.size > size and self._should_split(block, size):
            self._split(block, size)
        self._live[key] = block

    def free(self, key: int) -> None:
        """Free `key`'s block (unknown keys are ignored): it merges with free neighbours and stays cached."""
        block = self._live.pop(key, None)
        if block is None:
            small = self._small.pop(key, None)
            if small is not None:
                self.small_held -= small
            return
        block.free = True
        pool = self._free[block.segment.pool]
        prev, nxt = block.prev, block.next
        if nxt is not None and nxt.free:
            pool.remove(nxt)
            self._absorb(block, nxt)
        if prev is not None and prev.free:
            pool.remove(prev)
            self._absorb(prev, block)
            block = prev
        pool.add(block)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): give every wholly free segment back to the device."""
        self._release_free_segments()

    def reset_peak(self) -> None:
        self.peak_reserved = self.reserved

    @property
    def cached_free(self) -> int:
        """Bytes reserved but held by no tensor."""
        return self.small_reserved - self.small_held + self._free[1].total

    # ----- blocks ------------------------------------------------------------------------------
    def _take_cached(self, pool: int, size: int) -> _Block | None:
        free = self._free[pool]
        block = free.smallest_fit(size)
        if block is None:
            return None
        limit = self.config.max_split_size
        if limit is not None and (
            (size < limit <= block.size) or (size >= limit and block.size >= size + LARGE_BUFFER)
        ):
            return None  # an oversize block is kept for requests of about its own size
        free.remove(block)
        return block

    def _should_split(self, block: _Block, size: int) -> bool:
        rest = block.size - size
        if block.segment.pool == 0:
            return rest >= MIN_BLOCK
        limit = self.config.max_split_size
        return rest > SMALL_SIZE and (limit is None or size < limit)

    def _split(self, block: _Block, size: int) -> None:
        rest = _Block(block.segment, block.size - size, block, block.next)
        if block.next is not None:
            block.next.prev = rest
        else:
            block.segment.last = rest
        block.next = rest
        block.size = size
        self._free[block.segment.pool].add(rest)

    @staticmethod
    def _absorb(first: _Block, second: _Block) -> None:
        """`second`, the block right after `first` in its segment, becomes part of `first`."""
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        else:
            first.segment.last = first

    # ----- segments ----------------------------------------------------------------------------
    def _reserve(self, pool: int, size: int) -> _Block:
        if self.config.expandable_segments:
            return self._grow_expandable(pool, size)
        nbytes = segment_size(size)
        if self.limit is not None and self.reserved + nbytes > self.limit:
            self.alloc_retries += 1
            self._release_free_segments()  # the caller's own OOM check decides whether it fits
        seg = _Segment(pool, nbytes)
        block = seg.last = _Block(seg, nbytes)
        self._add_reserved(nbytes)
        self.segments += 1
        return block

    def _grow_expandable(self, pool: int, size: int) -> _Block:
        """Expandable segments: map pages at the end of the pool's segment until `size` fits there."""
        page = SMALL_BUFFER if pool == 0 else LARGE_BUFFER
        seg = self._expandable[pool]
        if seg is None:
            seg = self._expandable[pool] = _Segment(pool, 0, expandable=True)
            self.segments += 1
        tail = seg.last if seg.last is not None and seg.last.free else None
        have = tail.size if tail is not None else 0
        grow = -(-(size - have) // page) * page
        self._add_reserved(grow)
        seg.size += grow
        if tail is not None:
            self._free[pool].remove(tail)
            tail.size += grow
            return tail
        block = _Block(seg, grow, seg.last)
        if seg.last is not None:
            seg.last.next = block
        seg.last = block
        return block

    def _release_free_segments(self) -> None:
        packed = -(-self.small_held // SMALL_BUFFER) * SMALL_BUFFER
        self.reserved -= self.small_reserved - packed
        self.segments -= (self.small_reserved - packed) // SMALL_BUFFER
        self.small_reserved = packed
        for free in self._free:
            for block in free.blocks():
                if block.prev is None and block.next is None:  # the whole segment is free
                    seg = block.segment
                    free.remove(block)
                    self.reserved -= seg.size
                    self.segments -= 1
                    if seg.expandable:
                        self._expandable[seg.pool] = None

    def _add_reserved(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
