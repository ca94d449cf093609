"""torch.cuda.memory's allocator history on the simulated GPU: `_record_memory_history`, `_snapshot`.

A GPU's caching allocator records its actions (alloc, free_requested, free_completed, segment_alloc,
segment_free, oom) when `_record_memory_history` is on, and `_snapshot()` returns its segments with their
blocks and that trace, in the dictionary `torch.cuda._memory_viz` and pytorch.org/memory_viz read. Here the
actions are those of phantora's allocator model (caching_allocator.py) over the rank's tracked storages
(memory.py):

- large-pool segments and blocks are the model's own, at addresses given to each segment when it is first
  seen (one virtual address space per rank, 2 MiB aligned);
- the model counts the small pool packed (no placement); the snapshot places its blocks first-fit, in
  allocation order, in 2 MiB segments (`SmallPlacement`), so a fragmented small pool can show a segment more
  than `memory_reserved()` counts;
- a block's `requested_size` is its rounded size (the tracker keeps no unrounded byte count); one stream (0);
  frees complete at once (free_requested then free_completed); C++ frames (`stacks="all"`) are not recorded.

Off, nothing here runs: `start` puts recording methods in the tracker's and allocator's instance dictionaries
(the compiled per-op path then takes the Python one) and `stop` removes them.
"""

from __future__ import annotations

import bisect
import collections
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phantora.runtime.caching_allocator import SMALL_BUFFER, SMALL_SIZE, CachingAllocator, _Block, _Segment

BASE_ADDRESS = 0x7F0000000000  # where the rank's virtual device addresses start (as a CUDA VA range)
ALIGN = SMALL_BUFFER
EXPANDABLE_RANGE = 1 << 40  # virtual addresses kept for an expandable segment (1 TiB: more than any GPU holds)
ENABLED = ("state", "all")
CONTEXTS = (None, "state", "alloc", "all")
STACKS = ("python", "all")
ACTIONS = (
    *("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap"),
    *("oom", "snapshot"),
)
# torch._C._cuda_attach_out_of_memory_observer's observers: (device, bytes asked, bytes allocated, bytes free)
OOM_OBSERVERS: list[Callable[[int, int, int, int], Any]] = []
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep  # phantora/
# torch's frames between a program's call and phantora's dispatch mode (innermost, above the program's own frame)
_DISPATCH_FILES = tuple(
    os.path.join("torch", *p.split("/"))
    for p in ("utils/_python_dispatch.py", "utils/_device.py", "_dynamo/eval_frame.py", "_compile.py")
)


class AddressSpace:
    """Device addresses for segments, handed out upward and never reused (as a fresh cudaMalloc range)."""

    def __init__(self) -> None:
        self.next = BASE_ADDRESS

    def take(self, size: int) -> int:
        addr = self.next
        self.next += -(-max(size, 1) // ALIGN) * ALIGN
        return addr


class SmallPlacement:
    """The small pool's blocks placed first-fit in 2 MiB segments: key -> (segment index, offset, size)."""

    def __init__(self, space: AddressSpace) -> None:
        self.space = space
        self.segments: list[tuple[int, list[tuple[int, int, int]]]] = []  # (address, sorted (offset, size, key))
        self.where: dict[int, tuple[int, int, int]] = {}

    def place(self, key: int, size: int) -> tuple[int, bool]:
        """Place `key`'s block; its address and whether a new segment was opened."""
        for i, (addr, blocks) in enumerate(self.segments):
            at = 0
            for off, sz, _ in blocks:
                if off - at >= size:
                    break
                at = off + sz
            if at + size <= SMALL_BUFFER:
                bisect.insort(blocks, (at, size, key))
                self.where[key] = (i, at, size)
                return addr + at, False
        addr = self.space.take(SMALL_BUFFER)
        self.segments.append((addr, [(0, size, key)]))
        self.where[key] = (len(self.segments) - 1, 0, size)
        return addr, True

    def address(self, key: int) -> int | None:
        w = self.where.get(key)
        return None if w is None else self.segments[w[0]][0] + w[1]

    def remove(self, key: int) -> int | None:
        """Take `key`'s block out; its address, or None if it was not placed."""
        w = self.where.pop(key, None)
        if w is None:
            return None
        addr, blocks = self.segments[w[0]]
        blocks.remove((w[1], w[2], key))
        return addr + w[1]

    def release_empty(self) -> list[int]:
        """Drop the segments holding no block (empty_cache); their addresses."""
        freed = [addr for addr, blocks in self.segments if not blocks]
        if freed:
            kept = [s for s in self.segments if s[1]]
            self.segments = kept
            self.where = {k: (i, off, sz) for i, (_, blocks) in enumerate(kept) for off, sz, k in blocks}
        return freed


def segment_address(seg: _Segment, space: AddressSpace) -> int:
    """The segment's address, given on first sight."""
    addr: int | None = getattr(seg, "addr", None)
    if addr is None:  # an expandable segment grows at its end: it gets a range for the whole device's worth
        addr = seg.addr = space.take(EXPANDABLE_RANGE if seg.expandable else seg.size)
    return addr


def block_address(block: _Block, space: AddressSpace) -> int:
    off = 0
    b = block.prev
    while b is not None:
        off += b.size
        b = b.prev
    return segment_address(block.segment, space) + off


def large_segments(alloc: CachingAllocator) -> list[_Segment]:
    """The model's large-pool segments (those holding a live or a cached block), in address order."""
    seen: dict[int, _Segment] = {}
    for b in (*alloc._live.values(), *alloc._free[1].blocks()):
        seen.setdefault(id(b.segment), b.segment)
    return list(seen.values())


def python_frames(skip: int) -> list[dict[str, Any]]:
    """The calling Python stack, innermost first, as torch's Frame dicts: phantora's own frames (its dispatch inside,
    its launcher outside the program), the dispatch's way in from torch and the launcher's `runpy` frames left out."""
    frames: list[dict[str, Any]] = []
    f: Any = sys._getframe(skip)
    while f is not None:
        code = f.f_code
        name = code.co_filename
        if not name.startswith(_PACKAGE) and (frames or not name.endswith(_DISPATCH_FILES)):
            frames.append({"filename": name, "line": f.f_lineno, "name": code.co_name})
        f = f.f_back
    while frames and frames[-1]["filename"].startswith("<frozen runpy"):
        frames.pop()
    return frames


class MemoryHistory:
    """One rank's recorder: the trace (a ring of `max_entries`) and each live block's allocation frames."""

    def __init__(self, tracker: Any, now_us: Callable[[], float], space: AddressSpace) -> None:
        self.tracker = tracker
        self.now_us = now_us
        self.space = space
        self.small = SmallPlacement(space)
        self.trace: collections.deque[dict[str, Any]] = collections.deque()
        self.frames: dict[int, list[dict[str, Any]]] = {}  # live key -> its allocation's frames
        self.record_trace = False
        self.context: str | None = None
        self.skip: frozenset[str] = frozenset()
        self.on = False

    # ----- switching ---------------------------------------------------------------------------------
    def configure(self, enabled: str, context: str | None, max_entries: int, clear: bool, skip: list[str]) -> None:
        self.record_trace = enabled == "all"
        self.context = context
        self.skip = frozenset(skip)
        if clear:
            self.trace.clear()
        self.trace = collections.deque(self.trace, maxlen=max(1, int(max_entries)))
        if not self.on:
            self.start()

    def start(self) -> None:
        """Place the live small blocks, then put the recording methods in the instance dictionaries."""
        tr, alloc = self.tracker, self.tracker.allocator
        for seg in large_segments(alloc):
            segment_address(seg, self.space)
        for key, e in tr.live.items():
            if 0 < e.size <= SMALL_SIZE and self.small.address(key) is None:
                self.small.place(key, e.size)
        tr.on_tensor = tr.on_outputs  # the compiled path then calls this (its replaced-tracker case)
        tr._reserve_block = self._reserve_block
        tr._release_block = self._release_block
        alloc._release_free_segments = self._release_free_segments
        tr._history = self
        self.on = True

    def stop(self) -> None:
        """`enabled=None`: stop recording and clear the trace (as the allocator's recordHistory does)."""
        tr = self.tracker
        for name in ("on_tensor", "_reserve_block", "_release_block"):
            tr.__dict__.pop(name, None)
        tr.allocator.__dict__.pop("_release_free_segments", None)
        tr._history = None
        self.trace.clear()
        self.frames.clear()
        self.on = False

    # ----- events ------------------------------------------------------------------------------------
    def _event(self, action: str, addr: int, size: int, frames: list[dict[str, Any]] | None = None) -> None:
        if self.record_trace and action not in self.skip:
            self.trace.append(
                {
                    "action": action,
                    "addr": addr,
                    "size": size,
                    "stream": 0,
                    "time_us": self.now_us(),
                    "frames": frames or [],
                    "compile_context": "N/A",
                    "user_metadata": "",
                }
            )

    def _reserve_block(self, key: int, size: int) -> None:
        tr = self.tracker
        frames = python_frames(3) if self.context is not None else []
        if size <= SMALL_SIZE:
            type(tr)._reserve_block(tr, key, size)
            addr, opened = self.small.place(key, size)
            if opened:
                self._event("segment_alloc", addr, SMALL_BUFFER)
        else:
            alloc = tr.allocator
            grown = alloc._expandable[1]
            before = 0 if grown is None else grown.size
            type(tr)._reserve_block(tr, key, size)
            block = alloc._live[key]
            seg = block.segment
            if seg.expandable:  # pages mapped at its end (torch's segment_map)
                more = seg.size - (before if seg is grown else 0)
                if more > 0:
                    self._event("segment_map", segment_address(seg, self.space) + seg.size - more, more)
            elif getattr(seg, "addr", None) is None:  # every segment from before recording has its address
                self._event("segment_alloc", segment_address(seg, self.space), seg.size)
            addr = block_address(block, self.space)
        self.frames[key] = frames
        self._event("alloc", addr, size, frames if self.context in ("alloc", "all") else None)

    def _release_block(self, key: int, size: int) -> None:
        self.note_free(key, size)
        type(self.tracker)._release_block(self.tracker, key, size)

    def note_free(self, key: int, size: int) -> None:
        """A block is freed (called before the model frees it)."""
        if size <= SMALL_SIZE:
            addr = self.small.remove(key)
        else:
            block = self.tracker.allocator._live.get(key)
            addr = None if block is None else block_address(block, self.space)
        self.frames.pop(key, None)
        if addr is None:
            return
        frames = python_frames(3) if self.context == "all" else None
        self._event("free_requested", addr, size, frames)
        self._event("free_completed", addr, size, frames)

    def note_oom(self, size: int, device_free: int) -> None:
        if self.record_trace and "oom" not in self.skip:
            self._event("oom", 0, size, python_frames(3) if self.context is not None else None)
            self.trace[-1]["device_free"] = device_free

    def _release_free_segments(self) -> None:
        alloc = self.tracker.allocator
        for free in alloc._free:
            for b in free.blocks():
                if b.prev is None and b.next is None:
                    action = "segment_unmap" if b.segment.expandable else "segment_free"
                    self._event(action, segment_address(b.segment, self.space), b.segment.size)
        CachingAllocator._release_free_segments(alloc)
        for addr in self.small.release_empty():
            self._event("segment_free", addr, SMALL_BUFFER)

    # ----- the snapshot ------------------------------------------------------------------------------
    def snapshot(self, device: int, devices: int) -> dict[str, Any]:
        traces: list[list[dict[str, Any]]] = [[] for _ in range(devices)]
        traces[device] = [dict(e) for e in self.trace]
        return {
            "segments": snapshot_segments(self.tracker, self.space, self.small, self.frames, device),
            "device_traces": traces,
        }


def _block(addr: int, size: int, active: bool, frames: list[dict[str, Any]]) -> dict[str, Any]:
    state = "active_allocated" if active else "inactive"
    return {"address": addr, "size": size, "requested_size": size if active else 0, "state": state, "frames": frames}


def _segment(addr: int, total: int, kind: str, blocks: list[dict[str, Any]], device: int, expandable: bool) -> dict:
    held = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": device,
        "address": addr,
        "total_size": total,
        "allocated_size": held,
        "active_size": held,
        "requested_size": held,
        "stream": 0,
        "segment_type": kind,
        "segment_pool_id": (0, 0),
        "is_expandable": expandable,
        "frames": [],
        "blocks": blocks,
    }


def snapshot_segments(
    tracker: Any, space: AddressSpace, small: SmallPlacement, frames: dict[int, list[dict[str, Any]]], device: int
) -> list[dict[str, Any]]:
    """The allocator model's segments in torch's Segment format (small ones as `small` places them), by address."""
    alloc: CachingAllocator = tracker.allocator
    key_of = {id(b): k for k, b in alloc._live.items()}
    out: list[dict[str, Any]] = []
    for seg in large_segments(alloc):
        head = seg.last
        while head is not None and head.prev is not None:
            head = head.prev
        addr = segment_address(seg, space)
        blocks, at, b = [], addr, head
        while b is not None:
            key = key_of.get(id(b))
            blocks.append(_block(at, b.size, not b.free, frames.get(key, []) if key is not None else []))
            at += b.size
            b = b.next
        out.append(_segment(addr, seg.size, "large", blocks, device, seg.expandable))
    for addr, placed in small.segments:
        blocks, at = [], 0
        for off, size, key in placed:
            if off > at:
                blocks.append(_block(addr + at, off - at, False, []))
            blocks.append(_block(addr + off, size, True, frames.get(key, [])))
            at = off + size
        if at < SMALL_BUFFER:
            blocks.append(_block(addr + at, SMALL_BUFFER - at, False, []))
        out.append(_segment(addr, SMALL_BUFFER, "small", blocks, device, False))
    out.sort(key=lambda s: s["address"])
    return out


def history_of(tracker: Any, now_us: Callable[[], float]) -> MemoryHistory:
    """The tracker's recorder (made on first use; kept while the tracker lives)."""
    h: MemoryHistory | None = tracker.__dict__.get("_recorder")
    if h is None:
        h = tracker._recorder = MemoryHistory(tracker, now_us, AddressSpace())
    return h


def snapshot(tracker: Any, now_us: Callable[[], float], device: int, devices: int) -> dict[str, Any]:
    """torch.cuda.memory._snapshot() of the tracker's device: recorded, or (history off) the state alone."""
    h = history_of(tracker, now_us)
    if h.on:
        return h.snapshot(device, devices)
    small = SmallPlacement(AddressSpace())
    small.space.next = h.space.next  # placed past every address handed out, without taking them
    for key, e in tracker.live.items():
        if 0 < e.size <= SMALL_SIZE:
            small.place(key, e.size)
    segments = snapshot_segments(tracker, h.space, small, {}, device)
    return {"segments": segments, "device_traces": [[] for _ in range(devices)]}


def record(
    tracker: Any,
    now_us: Callable[[], float],
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    clear_history: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    """torch.cuda.memory._record_memory_history's arguments, checked as torch checks them, applied to the tracker."""
    if enabled not in (None, *ENABLED):
        raise ValueError(f"_record_memory_history: enabled must be None, 'state' or 'all', not {enabled!r}")
    if context not in CONTEXTS:
        raise ValueError(f"_record_memory_history: context must be None, 'state', 'alloc' or 'all', not {context!r}")
    if stacks not in STACKS:
        raise ValueError(f"_record_memory_history: stacks must be 'python' or 'all', not {stacks!r}")
    bad = [a for a in skip_actions or [] if a not in ACTIONS]
    if bad:
        raise ValueError(f"_record_memory_history: skip_actions has unknown actions {bad}; known: {list(ACTIONS)}")
    h = history_of(tracker, now_us)
    if enabled is None:
        if h.on:
            h.stop()
        return
    h.configure(enabled, context, max_entries, clear_history, list(skip_actions or []))
