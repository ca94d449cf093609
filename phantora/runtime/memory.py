"""Simulated device memory of one rank: live bytes by category, peaks, and a simulated CUDA OOM.

`MemoryTracker.on_outputs` sees the outputs of every aten op the dispatch mode runs (real CPU
tensors and meta tensors alike). Each new storage is counted once, keyed by its StorageImpl
(`untyped_storage()._cdata`), at its `nbytes()` rounded up to the CUDA caching allocator's 512-byte
block; a weak reference on the storage object (which PyTorch keeps alive exactly as long as the
StorageImpl) frees it when the last tensor or view sharing it dies. The simulated GPU's compiled per-op path
counts its outputs' storages without that object: a C++ hook on the StorageImpl's data
(simcuda/tensorinfo.cc) calls the same free when it dies, and hands the entry back (`_lost`) to a weak
reference if its data is replaced while it lives (a resize, share_memory_). Categories:

- parameters: `nn.Module` parameter registration (a global hook), and the optimizer's param groups;
- gradients: `param.grad` after gradient accumulation (a post-accumulate-grad hook on every
  registered parameter) and around every optimizer step (global pre/post step hooks);
- optimizer: the tensors in `optimizer.state` after every step (global post step hook);
- activations: storages that autograd saves for backward (a global saved-tensors pack hook);
- temporaries: everything else.

A storage only moves to a category of higher rank (parameters > optimizer > gradients >
activations > temporaries) and keeps it until it is freed. Per-category sums are kept
incrementally, so the breakdown at the peak is a copy of five integers made when the peak rises.
When the live bytes would exceed the limit (HBM capacity minus a reserve for the CUDA context and
NCCL), the allocating op raises `torch.OutOfMemoryError`. Configuration, from the environment:

- `PHANTORA_MEMORY`: `on` (default) or `off` (no tracking at all);
- `PHANTORA_MEMORY_LIMIT`: `gpu` (default: capacity minus reserve), `off` (track, never raise),
  or a size (`75GiB`, `80e9`, `1024MiB`; a bare number is bytes);
- `PHANTORA_MEMORY_RESERVE`: the reserve subtracted from the capacity (default 2GiB).
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from phantora.perfmodel.gpus import GpuSpec
from phantora.runtime import memory_history
from phantora.runtime.caching_allocator import SMALL_SIZE, AllocatorConfig, CachingAllocator
from phantora.runtime.compute import tensors_in
from phantora.runtime.simcuda.tensor import SimCudaTensor, cuda_seen
from phantora.units import parse_size_bytes

BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes
GIB = 1 << 30
DEFAULT_RESERVE = 2 * GIB  # CUDA context (~0.5 GiB) + NCCL communicators and buffers (~1.5 GiB)

# Category indices, in rank order (a storage only moves to a lower index).
PARAM, OPT, GRAD, ACT, TEMP = range(5)
NAMES = ("parameters", "optimizer", "gradients", "activations", "temporaries")
REPORT_ORDER = (PARAM, GRAD, OPT, ACT, TEMP)


def fmt_bytes(n: float) -> str:
    """Bytes in the unit CUDA's messages use (GiB, MiB, KiB, B)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


# Device memory as the driver reports it (nvidia-smi's total, MiB; torch's OOM messages use it too),
# which is a little below the data-sheet figure (ECC and firmware reservations): A100 SXM 80GB 81920,
# A100 SXM 40GB 40960, H100 SXM 81559, H200 SXM 143771, B200 183359, L40S 46068 (ECC on). Keyed by the
# GPU table's short names; a variant not listed here gets its nominal (data-sheet) memory.
DEVICE_MIB = {"a100": 81920, "a100-40gb": 40960, "h100": 81559, "h200": 143771, "b200": 183359, "l40s": 46068}


def capacity_of(gpu: Any) -> int:
    """Device memory of a GPU in bytes: the driver-reported total of DEVICE_MIB, else its nominal memory."""
    v = getattr(gpu, "hbm_bytes", 0)
    if v:
        return int(v)
    if isinstance(gpu, GpuSpec):  # a GPU of the table: its own entry or its nominal memory, never another variant's
        return DEVICE_MIB[gpu.name] << 20 if gpu.name in DEVICE_MIB else gpu.mem_bytes
    for name in (getattr(gpu, "name", ""), str(gpu)):
        squashed = "".join(c for c in str(name).lower() if c.isalnum())
        for key, mib in DEVICE_MIB.items():
            if squashed.startswith(key):
                return mib << 20
    for attr in ("memory", "mem_bytes"):
        v = getattr(gpu, attr, 0)
        if v:
            return int(v)
    return 0


class _Entry(weakref.ref):
    """A live storage: a weak reference to its Python storage object, its key, size, category and the op that
    allocated it."""

    __slots__ = ("cat", "changed", "key", "site", "size")
    cat: int
    changed: int
    key: int
    site: Any
    size: int


class _HookedEntry:
    """A live storage that a C++ hook on its StorageImpl watches (simcuda/tensorinfo.cc; made by simcuda/_fastop.c):
    an _Entry's fields without the weak reference."""

    __slots__ = ("cat", "changed", "key", "site", "size")
    cat: int
    changed: int
    key: int
    site: Any
    size: int


def _storage(t: torch.Tensor) -> Any:
    """The storage object of a tensor (the local shard of a DTensor), or None if it has none."""
    local = getattr(t, "_local_tensor", None)
    if local is not None:
        t = local
    if isinstance(t, SimCudaTensor):
        t = t.elem
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _on_simulated_gpu(t: torch.Tensor) -> bool:
    """Is `t` (or a DTensor's local shard) a tensor of the simulated CUDA device?"""
    return isinstance(getattr(t, "_local_tensor", t), SimCudaTensor)


class MemoryTracker:
    """Live device bytes of one rank, by category, with the peak and a per-step peak."""

    def __init__(
        self,
        gpu_name: str = "",
        capacity: int = 0,
        *,
        limit: int | None = None,
        reserve: int = 0,
        enabled: bool = True,
        rank: int = 0,
        alloc_config: AllocatorConfig | None = None,
    ) -> None:
        self.gpu_name = gpu_name
        self.capacity = capacity
        self.limit = limit  # None: never raise (a property: it keeps `_limit`, the same as a number, in step)
        self.reserve = reserve
        self.enabled = enabled
        self._paused = 0  # inside `paused()`: new storages are not device memory (yet)
        self._deferred: dict[int, Any] = {}  # storages created while paused -> weak references
        self._deferred_cat: dict[int, int] = {}  # their category, if a hook classified one meanwhile
        self.rank = rank
        self.live: dict[int, _Entry | _HookedEntry] = {}
        self.by_cat = [0, 0, 0, 0, 0]
        self.current = 0
        self.peak = 0
        self.peak_by_cat = [0, 0, 0, 0, 0]
        self.step_peak = 0
        self.step_peaks: list[int] = []
        self.program_peak = 0  # what torch.cuda.max_memory_allocated reports; the program may reset it
        self.allocations = 0
        self.site: Any = None  # the op whose outputs on_outputs is counting (for the OOM report)
        self._event = 0  # counts additions, resizes and moves; `_peak_event` is its value at the peak
        self._peak_event = 0
        self._free_cb = self._free
        self._lost_cb = self._lost
        self._saved_hooks: Any = None
        self._in_step: Any = None  # weak reference to the optimizer whose step() is running
        self._depth = 0
        self._prev_active: list[MemoryTracker | None] = []
        # reserved bytes: PyTorch's caching allocator replayed over the same allocations and frees
        self.allocator = CachingAllocator(alloc_config, limit=limit)
        self.reserved_step_peak = 0
        self.reserved_step_peaks: list[int] = []
        self.program_reserved_peak = 0  # torch.cuda.max_memory_reserved
        self._history: Any = None  # memory_history.MemoryHistory while torch.cuda.memory._record_memory_history is on

    @property
    def limit(self) -> int | None:
        """The bytes the device may hold before an op raises the simulated OutOfMemoryError; None: no limit."""
        return self._limit_or_none

    @limit.setter
    def limit(self, value: int | None) -> None:
        self._limit_or_none = value
        self._limit: float = math.inf if value is None else value

    @classmethod
    def from_env(cls, gpu: Any, rank: int = 0, env: dict[str, str] | None = None) -> MemoryTracker:
        """A tracker for `gpu` configured by PHANTORA_MEMORY, PHANTORA_MEMORY_LIMIT, PHANTORA_MEMORY_RESERVE."""
        env = dict(os.environ) if env is None else env
        capacity = capacity_of(gpu)
        enabled = env.get("PHANTORA_MEMORY", "on").strip().lower() not in ("off", "0", "false", "no")
        reserve_text = env.get("PHANTORA_MEMORY_RESERVE", "").strip()
        reserve = parse_size_bytes(reserve_text, "PHANTORA_MEMORY_RESERVE") if reserve_text else DEFAULT_RESERVE
        spec = env.get("PHANTORA_MEMORY_LIMIT", "gpu").strip().lower() or "gpu"
        if spec in ("off", "none", "0"):
            limit = None
        elif spec == "gpu":
            limit = max(0, capacity - reserve) if capacity else None
        else:
            limit = parse_size_bytes(spec, "PHANTORA_MEMORY_LIMIT")
        alloc = AllocatorConfig.parse(env.get("PYTORCH_CUDA_ALLOC_CONF"))
        name = gpu.display_name if isinstance(gpu, GpuSpec) else str(getattr(gpu, "name", gpu))
        return cls(name, capacity, limit=limit, reserve=reserve, enabled=enabled, rank=rank, alloc_config=alloc)

    # ----- the hot path: every op's outputs ----------------------------------------------------------
    def on_outputs(self, out: Any, site: Any = None) -> None:
        """Count the storages of the outputs of the op `site` that are new (and notice resized ones)."""
        self.site = site
        if isinstance(out, torch.Tensor):
            self._track(out)
        else:
            for t in tensors_in(out):
                self._track(t)

    def on_tensor(self, t: torch.Tensor, site: Any) -> None:
        """`on_outputs` of an op whose output is one plain tensor, in fewer steps (the simulated GPU's fast path):
        `_add` and `_note_peak` inline."""
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            self.on_outputs(t, site)
            return
        if self._paused:
            self.on_outputs(t, site)
            return
        size = (st.nbytes() + (BLOCK - 1)) & -BLOCK
        key = st._cdata
        live = self.live
        e = live.get(key)
        if e is not None:
            if e.size != size:
                self.site = site
                self._resize(e, size)
            return
        if not size:
            return
        cur = self.current + size
        if cur > self._limit:
            self.site = site
            self._oom(size)
        e = _Entry(st, self._free_cb)
        e.key = key
        e.size = size
        e.cat = TEMP
        e.site = site
        self._event = e.changed = self._event + 1
        live[key] = e
        alloc = self.allocator
        if size <= SMALL_SIZE:  # `_reserve_block`, inline: the small pool counted without a key
            held = alloc.small_held = alloc.small_held + size
            if held > alloc.small_reserved:
                alloc.grow_small()
                self._note_reserved()
        else:
            alloc.malloc(key, size)
            self._note_reserved()
        self.allocations += 1
        self.by_cat[TEMP] += size
        self.current = cur
        if cur > self.step_peak:  # `_note_peak()`, inline (the reserved bytes grew above, if at all)
            self.step_peak = cur
        if cur > self.program_peak:
            self.program_peak = cur
        if cur >= self.peak:
            self.peak = cur
            self.peak_by_cat = self.by_cat.copy()
            self._peak_event = self._event

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Deferred init: storages created inside count only if they are still alive at the end.

        A model built and then sharded inside (as with meta-device init, `to_empty` after
        sharding) costs its shards, not the full model it was built as.
        """
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            if not self._paused:
                deferred, self._deferred = self._deferred, {}
                cats, self._deferred_cat = self._deferred_cat, {}
                for key, ref in deferred.items():
                    st = ref()
                    if st is not None and st._cdata not in self.live:
                        self._track_storage(st, cats.get(key, TEMP))

    def _track(self, t: torch.Tensor) -> None:
        if isinstance(t, SimCudaTensor):  # a wrapper's own storage is no memory: its data's is
            t = t.elem
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            st = _storage(t)
            if st is None:
                return
        if self._paused:
            if st._cdata not in self.live:
                self._deferred[st._cdata] = weakref.ref(st)
            return
        self._track_storage(st)

    def _track_storage(self, st: Any, cat: int = TEMP) -> None:
        size = (st.nbytes() + (BLOCK - 1)) & -BLOCK
        e = self.live.get(st._cdata)
        if e is not None:
            if e.size != size:  # resize_ in place (FSDP2 frees and refills its buffers this way)
                self._resize(e, size)
            return
        if size:
            self._add(st, size, cat, check=True)

    def check_fits(self, size: int) -> None:
        """Raise the simulated OutOfMemoryError now if `size` more bytes would not fit (before a host allocation)."""
        if self.enabled and self.limit is not None and self.current + size > self.limit:
            self._oom(size)

    def _add(self, st: Any, size: int, cat: int, check: bool) -> None:
        cur = self.current + size
        if check and self.limit is not None and cur > self.limit:
            self._oom(size)
        e = _Entry(st, self._free_cb)
        e.key = st._cdata
        e.size = size
        e.cat = cat
        e.site = self.site
        self._event += 1
        e.changed = self._event
        self.live[e.key] = e
        self._reserve_block(e.key, size)
        self.allocations += 1
        self.by_cat[cat] += size
        self.current = cur
        self._note_peak()

    def _resize(self, e: _Entry | _HookedEntry, size: int) -> None:
        delta = size - e.size
        if delta > 0 and self.limit is not None and self.current + delta > self.limit:
            self._oom(delta)
        self._release_block(e.key, e.size)  # resize_ reallocates: the old block freed, a new one taken
        e.size = size
        if size:
            self._reserve_block(e.key, size)
        self._event += 1
        e.changed = self._event
        self.by_cat[e.cat] += delta
        self.current += delta
        self._note_peak()

    def _reserve_block(self, key: int, size: int) -> None:
        """The caching-allocator model takes a block of `size` bytes for storage `key`: a small one without its key
        (the tracker knows the sizes; caching_allocator.py), a large one by key."""
        alloc = self.allocator
        if size <= SMALL_SIZE:
            alloc.small_held += size
            if alloc.small_held > alloc.small_reserved:
                alloc.grow_small()
        else:
            alloc.malloc(key, size)

    def _release_block(self, key: int, size: int) -> None:
        """The block `_reserve_block` took for storage `key` goes back to the allocator's cache."""
        if size <= SMALL_SIZE:
            self.allocator.small_held -= size
        else:
            self.allocator.free(key)

    def _note_reserved(self) -> None:
        """After the allocator reserved more: raise the step's and the program's reserved peaks (only a growth of
        the reserved bytes can raise them)."""
        reserved = self.allocator.reserved
        if reserved > self.reserved_step_peak:
            self.reserved_step_peak = reserved
        if reserved > self.program_reserved_peak:
            self.program_reserved_peak = reserved

    def _note_peak(self) -> None:
        """After a growth: raise the step's and the run's peak, snapshotting the categories at a new peak."""
        self._note_reserved()
        cur = self.current
        if cur > self.step_peak:
            self.step_peak = cur
        if cur > self.program_peak:
            self.program_peak = cur
        if cur >= self.peak:
            self.peak = cur
            self.peak_by_cat = self.by_cat.copy()
            self._peak_event = self._event

    def _free(self, e: _Entry | _HookedEntry) -> None:
        key = e.key
        live = self.live
        if live.get(key) is e:
            if self._history is not None:
                self._history.note_free(key, e.size)
            del live[key]
            size = e.size
            if size <= SMALL_SIZE:  # `_release_block`, inline
                self.allocator.small_held -= size
            else:
                self.allocator.free(key)
            self.by_cat[e.cat] -= size
            self.current -= size

    def _lost(self, e: _HookedEntry, st: Any) -> None:
        """The C++ hook on a live counted storage `st` went with its old data (replaced by a resize or share_memory_):
        its entry goes on as a weak reference on `st`, as `_add` makes one (the size is checked by the next op that
        outputs it, as for any resize)."""
        if self.live.get(e.key) is not e:
            return
        n = _Entry(st, self._free_cb)
        n.key, n.size, n.cat, n.site, n.changed = e.key, e.size, e.cat, e.site, e.changed
        self.live[e.key] = n

    # ----- categories --------------------------------------------------------------------------------
    def classify(self, t: Any, cat: int) -> None:
        """Move the storage of `t` to category `cat` if that ranks higher; count it if it was not seen."""
        if not isinstance(t, torch.Tensor):
            return
        st = _storage(t)
        if st is None:
            return
        if self._paused:  # remembered for the end of the deferred init
            key = st._cdata
            if key not in self.live:
                self._deferred[key] = weakref.ref(st)
                self._deferred_cat[key] = min(cat, self._deferred_cat.get(key, TEMP))
                return
        e = self.live.get(st._cdata)
        if e is None:
            if cuda_seen() and not _on_simulated_gpu(t):
                return  # a CUDA program's host tensor, or its meta-device model before `to_empty`: no GPU memory
            size = (st.nbytes() + (BLOCK - 1)) & -BLOCK
            if size:  # created outside the mode (or by another thread): count it from now on
                self._add(st, size, cat, check=False)
        elif cat < e.cat:
            self.by_cat[e.cat] -= e.size
            self.by_cat[cat] += e.size
            if e.changed <= self._peak_event:
                # Alive and unchanged since before the peak: it was this at the peak too (optimizer
                # state is created as temporaries inside the step that reaches the peak).
                self.peak_by_cat[e.cat] -= e.size
                self.peak_by_cat[cat] += e.size
            e.cat = cat
            self._event += 1
            e.changed = self._event

    def classify_optimizer(self, opt: Any, with_state: bool) -> None:
        """Parameters, gradients and (after a step) state tensors of an optimizer."""
        for group in opt.param_groups:
            for p in group["params"]:
                self.classify(p, PARAM)
                g = p.grad
                if g is not None:
                    self.classify(g, GRAD)
        if with_state:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        self.classify(v, OPT)

    # ----- activation ------------------------------------------------------------------------------
    def activate(self) -> None:
        """Start receiving the global hooks (parameters, gradients, optimizer, saved tensors)."""
        global _ACTIVE
        if not self.enabled:
            return
        _install_global_hooks()
        self._prev_active.append(_ACTIVE)
        _ACTIVE = self
        if self._depth == 0:
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
            self._saved_hooks.__enter__()
        self._depth += 1

    def deactivate(self) -> None:
        global _ACTIVE
        if not self.enabled or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        _ACTIVE = self._prev_active.pop() if self._prev_active else None

    # ----- steps and results -------------------------------------------------------------------------
    def end_step(self) -> None:
        """Record this step's peak and start the next step's peak at the current bytes."""
        self.step_peaks.append(self.step_peak)
        self.step_peak = self.current
        self.reserved_step_peaks.append(self.reserved_step_peak)
        self.reserved_step_peak = self.allocator.reserved

    def reset_program_peak(self) -> None:
        """torch.cuda.reset_peak_memory_stats: the program's peaks restart; the run's and steps' do not."""
        self.program_peak = self.current
        self.program_reserved_peak = self.allocator.reserved

    def breakdown(self, by_cat: list[int] | None = None) -> dict[str, int]:
        v = self.by_cat if by_cat is None else by_cat
        return {NAMES[c]: v[c] for c in REPORT_ORDER}

    def results(self) -> dict[str, Any]:
        """msgpack-able summary for RankSession.results()."""
        return {
            "tracked": self.enabled,
            "capacity_bytes": self.capacity,
            "reserve_bytes": self.reserve,
            "limit_bytes": self.limit,
            "block_bytes": BLOCK,
            "peak_bytes": self.peak,
            "peak_breakdown": self.breakdown(self.peak_by_cat),
            "step_peak_bytes": list(self.step_peaks),
            "current_bytes": self.current,
            "current_breakdown": self.breakdown(),
            "allocations": self.allocations,
            "reserved_peak_bytes": self.allocator.peak_reserved,
            "step_reserved_peak_bytes": list(self.reserved_step_peaks),
            "allocator": {
                "expandable_segments": self.allocator.config.expandable_segments,
                "max_split_size_bytes": self.allocator.config.max_split_size,
                "segments": self.allocator.segments,
                "alloc_retries": self.allocator.alloc_retries,
            },
        }

    def _oom(self, size: int) -> None:
        free = max(0, (self.limit or 0) - self.current)
        if self._history is not None:
            self._history.note_oom(size, free)
        if memory_history.OOM_OBSERVERS:  # torch._C._cuda_attach_out_of_memory_observer's, as on a GPU
            from phantora.runtime.simcuda.devices import current_device

            for observer in list(memory_history.OOM_OBSERVERS):
                observer(current_device(), size, self.current, free)
        opt = self._in_step() if self._in_step is not None else None
        if opt is not None:  # inside optimizer.step(): its new state is optimizer state, not temporaries
            self._in_step = None
            self.classify_optimizer(opt, with_state=True)
        parts = ", ".join(f"{NAMES[c]} {fmt_bytes(self.by_cat[c])}" for c in REPORT_ORDER)
        cap = f", {fmt_bytes(self.capacity)}" if self.capacity else ""
        if self.capacity and self.limit == max(0, self.capacity - self.reserve):
            why = f"capacity minus {fmt_bytes(self.reserve)} reserved for the CUDA context and NCCL"
        else:
            why = "set by PHANTORA_MEMORY_LIMIT"
        # torch's own opening ("CUDA out of memory. Tried to allocate ..."), which frameworks read to retry with a
        # smaller batch (accelerate's find_executable_batch_size and Trainer's auto_find_batch_size: " out of
        # memory."; Lightning's batch-size finder: "CUDA" and "out of memory"), then the simulated device's account
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {fmt_bytes(size)} (simulated {self.gpu_name}{cap}, rank "
            f"{self.rank}); {fmt_bytes(self.current)} allocated: {parts}; limit {fmt_bytes(self.limit or 0)} "
            f"({why}); peak {fmt_bytes(self.peak)}. Largest live allocations by op: {self.largest_sites()}. "
            "Set PHANTORA_MEMORY_LIMIT=off to run on without the limit."
        )

    def largest_sites(self, top: int = 5) -> str:
        """The ops whose live allocations hold the most bytes now: 'n x op (category) bytes', largest first."""
        sums: dict[tuple[str, int], list[int]] = {}
        for e in self.live.values():
            acc = sums.setdefault((str(e.site or "outside an op"), e.cat), [0, 0])
            acc[0] += e.size
            acc[1] += 1
        rows = sorted(sums.items(), key=lambda kv: -kv[1][0])[:top]
        return "; ".join(f"{n} x {site} ({NAMES[cat]}) {fmt_bytes(b)}" for (site, cat), (b, n) in rows)


# ----- global hooks: installed once per process, they act on the active tracker ------------------------
_ACTIVE: MemoryTracker | None = None
_HOOKS_INSTALLED = False


def _pack(t: Any) -> Any:
    """Saved-tensor pack hook: count the storage as activations; keep the same data.

    Returning a saved *output* as is would make a reference cycle that Python's GC cannot see
    (output -> grad_fn -> saved variable -> output), so a tensor with a grad_fn is kept as `t.data`
    (same storage, no autograd history, no dispatch). Hooks switch off autograd's check that a saved
    tensor was not modified in place, so the version is recorded here and checked at unpack.
    """
    if torch.compiler._is_exporting_flag:  # torch.export traces fake tensors of symbolic sizes: no device memory
        return (t, None, t._version)
    tr = _ACTIVE
    if tr is not None:
        st = _storage(t)
        if st is not None:
            e = tr.live.get(st._cdata)
            if e is None or e.cat > ACT:
                tr.classify(t, ACT)
    if t.grad_fn is None:
        return (t, None, t._version)
    return (t.data, weakref.ref(t), t._version)


def _unpack(packed: Any) -> Any:
    data, ref, version = packed
    src = data if ref is None else ref()
    if src is not None and src._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: [{src.type()} {list(src.shape)}] is at version {src._version}; expected version "
            f"{version} instead (checked by phantora's saved-tensor hook, PHANTORA_MEMORY)"
        )
    return data


def _on_grad(p: torch.Tensor) -> None:
    tr = _ACTIVE
    if tr is not None and p.grad is not None:
        tr.classify(p.grad, GRAD)


def _on_param(module: Any, name: str, param: Any) -> None:
    tr = _ACTIVE
    if tr is None or param is None:
        return
    tr.classify(param, PARAM)
    if param.requires_grad and param.is_leaf:
        param.register_post_accumulate_grad_hook(_on_grad)


def _on_opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
    if _ACTIVE is not None:
        _ACTIVE.classify_optimizer(opt, with_state=True)
        _ACTIVE._in_step = weakref.ref(opt)


def _on_opt_post(opt: Any, args: Any, kwargs: Any) -> None:
    if _ACTIVE is not None:
        _ACTIVE._in_step = None
        _ACTIVE.classify_optimizer(opt, with_state=True)


def _install_global_hooks() -> None:
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    from torch.nn.modules.module import register_module_parameter_registration_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_module_parameter_registration_hook(_on_param)
    register_optimizer_step_pre_hook(_on_opt_pre)
    register_optimizer_step_post_hook(_on_opt_post)
    _watch_fsdp_storage_resizes()
    _HOOKS_INSTALLED = True


def _watch_fsdp_storage_resizes() -> None:
    """FSDP2 frees and refills its unsharded parameters with `storage.resize_()`, which is no aten op.

    Wrap its two helpers so the tracker sees each resize when it happens (else a freed parameter
    would count until the next op that touches its storage: tens of GiB over a large model).
    """
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:
        return

    def watched(fn: Any) -> Any:
        def run(tensor: torch.Tensor) -> None:
            fn(tensor)
            tr = _ACTIVE
            if tr is not None and tr.enabled:
                tr.on_outputs(tensor, "FSDP2 storage resize")

        return run

    alloc, free = watched(_fsdp_param.alloc_storage), watched(_fsdp_param.free_storage)
    _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc, free
    if hasattr(_fsdp_param_group, "alloc_storage"):
        _fsdp_param_group.alloc_storage = alloc


def active() -> MemoryTracker | None:
    """The tracker receiving the global hooks (the one of the entered dispatch mode), if any."""
    return _ACTIVE


@contextmanager
def tracking(tracker: MemoryTracker) -> Iterator[MemoryTracker]:
    """Activate `tracker`'s hooks inside (the dispatch mode does it for a whole run)."""
    tracker.activate()
    try:
        yield tracker
    finally:
        tracker.deactivate()
