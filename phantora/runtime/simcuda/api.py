"""`torch.cuda` as the simulated GPU answers it: devices, properties, memory, RNG, and what is not simulated.

`install(gpu, device_count)` replaces the functions of `torch.cuda` (and the few of `torch.backends`,
`torch.version` and `torch.accelerator` that frameworks read) in this process. Device properties
come from the GPU table (phantora.perfmodel.gpus); memory figures from the rank's simulated device
memory (memory.py). The caching allocator is not modelled: reserved memory is reported equal to
allocated memory, and `memory_stats` says so under ``"phantora.reserved_model"``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from phantora.runtime.simcuda import devices, lazy, rng, streams, symm_mem
from phantora.runtime.simcuda import memory_summary as summary_text
from phantora.runtime.simcuda.cudart import SimCudart
from phantora.runtime.simcuda.devices import NotSimulatedError, current_device, index_of, set_device
from phantora.runtime.simcuda.tensor import program_uses_cuda

CUDA_VERSION = "12.4"
CUDNN_VERSION = 90100


def _select_device(device: Any) -> None:
    """`torch.cuda.set_device`: make `device` current; the program is a CUDA program from now on."""
    set_device(device)
    program_uses_cuda()


def device_count() -> int:
    return int(devices.state["count"])


class device:  # noqa: N801 - torch.cuda.device
    """``with torch.cuda.device(i):`` makes device i current inside."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else index_of(device)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        if self.idx >= 0:
            lazy.lazy_init()  # as torch's device exchange does
            set_device(self.idx)

    def __exit__(self, *exc: Any) -> None:
        if self.idx >= 0:
            set_device(self.prev)


class device_of(device):  # noqa: N801
    def __init__(self, obj: Any) -> None:
        super().__init__(obj.get_device() if getattr(obj, "is_cuda", False) else -1)


def _gpu() -> Any:
    return devices.state["gpu"]


def get_device_properties(device: Any = None) -> Any:
    g = _gpu()
    major, minor = g.capability
    return types.SimpleNamespace(
        name=g.cuda_name,
        major=major,
        minor=minor,
        total_memory=_total_memory(),
        multi_processor_count=g.sms,
        L2_cache_size=g.l2_bytes,
        is_integrated=False,
        is_multi_gpu_board=False,
        max_threads_per_multi_processor=2048,
        warp_size=32,
        gcnArchName="NA",
        uuid=f"phantora-simulated-{g.name}-{index_of(device)}",
        pci_bus_id=index_of(device),
        pci_device_id=0,
        pci_domain_id=0,
        regs_per_multiprocessor=65536,
        clock_rate=int(g.clock_hz / 1000),
        memory_clock_rate=0,
        memory_bus_width=0,
    )


def _total_memory() -> int:
    """What the driver reports for the GPU (the simulated device memory's capacity, memory.py)."""
    from phantora.runtime.memory import capacity_of

    return capacity_of(_gpu())


def get_device_name(device: Any = None) -> str:
    return str(_gpu().cuda_name)


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return tuple(_gpu().capability)  # type: ignore[return-value]


def get_arch_list() -> list[str]:
    major, minor = _gpu().capability
    return [f"sm_{major}{minor}"]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return _gpu().capability >= (8, 0)


# ----- memory -----------------------------------------------------------------------------------
def _tracker() -> Any:
    from phantora.runtime import session

    s = session.current()
    return None if s is None else s.memory


def memory_allocated(device: Any = None) -> int:
    m = _tracker()
    return 0 if m is None else int(m.current)


def max_memory_allocated(device: Any = None) -> int:
    m = _tracker()
    return 0 if m is None else int(m.program_peak)


def reset_peak_memory_stats(device: Any = None) -> None:
    m = _tracker()
    if m is not None:
        m.reset_program_peak()


def memory_reserved(device: Any = None) -> int:
    """Bytes the caching allocator holds from the device (runtime/caching_allocator.py)."""
    m = _tracker()
    return 0 if m is None else int(m.allocator.reserved)


def max_memory_reserved(device: Any = None) -> int:
    m = _tracker()
    return 0 if m is None else int(m.program_reserved_peak)


def empty_cache() -> None:
    m = _tracker()
    if m is not None:
        m.allocator.empty_cache()


def memory_stats(device: Any = None) -> dict[str, Any]:
    m = _tracker()
    cached = retries = segments = 0
    if m is not None:
        cached, retries, segments = m.allocator.cached_free, m.allocator.alloc_retries, m.allocator.segments
    out: dict[str, Any] = {
        "num_alloc_retries": retries,
        "num_ooms": 0,
        "segment.all.current": segments,
        "inactive_split_bytes.all.current": cached,
        "phantora.reserved_model": "PyTorch's caching allocator, one stream (phantora/runtime/caching_allocator.py)",
    }
    figures = {
        "allocated_bytes": (memory_allocated(), max_memory_allocated()),
        "active_bytes": (memory_allocated(), max_memory_allocated()),
        "reserved_bytes": (memory_reserved(), max_memory_reserved()),
    }
    for name, (cur, peak) in figures.items():
        out[f"{name}.all.current"] = cur
        out[f"{name}.all.peak"] = peak
    return out


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """`torch.cuda.memory_summary`: the modelled figures of `memory_stats`, in torch's frame (memory_summary.py)."""
    index = current_device() if device is None else torch.cuda._get_device_index(device, optional=True)
    return summary_text.summary(memory_stats(device), index, abbreviated)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    total = _total_memory()
    return max(0, total - memory_reserved()), total


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


# ----- the allocator's history (runtime/memory_history.py): what pytorch.org/memory_viz reads ------------
def _now_us() -> float:
    from phantora.runtime import session

    s = session.current()
    return 0.0 if s is None else s.now() / 1e3


def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
    """torch.cuda.memory._record_memory_history: record the allocator model's actions for `_snapshot()`."""
    from phantora.runtime import memory_history

    if isinstance(enabled, bool):  # the legacy form: (enabled, record_context, trace_alloc_max_entries, ...)
        old = ("record_context", "trace_alloc_max_entries", "trace_alloc_record_context", "device")
        legacy = {**dict(zip(old, args, strict=False)), **kwargs}
        context: str | None = "alloc" if legacy.get("trace_alloc_record_context") else "state"
        if not legacy.get("record_context", True):
            context = None
        kwargs = {"context": context, "max_entries": int(legacy.get("trace_alloc_max_entries", 1))}
        enabled, args = "all" if enabled else None, ()
    names = ("context", "stacks", "max_entries", "device", "clear_history", "compile_context")
    opts = {**dict(zip(names, args, strict=False)), **kwargs}
    m = _tracker()
    if m is None or not m.enabled:
        raise NotSimulatedError(
            "torch.cuda.memory._record_memory_history needs phantora's memory tracking, which is off "
            "(PHANTORA_MEMORY=off): unset PHANTORA_MEMORY"
        )
    memory_history.record(
        m,
        _now_us,
        enabled,
        context=opts.get("context", "all"),
        stacks=opts.get("stacks", "all"),
        max_entries=opts.get("max_entries", sys.maxsize),
        clear_history=bool(opts.get("clear_history", False)),
        skip_actions=opts.get("skip_actions"),
    )


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """torch.cuda.memory._snapshot: the allocator model's segments and recorded trace, in torch's format."""
    from phantora.runtime import memory_history

    m = _tracker()
    n = device_count()
    if m is None or not m.enabled:
        return {"segments": [], "device_traces": [[] for _ in range(n)]}
    return memory_history.snapshot(m, _now_us, current_device(), n)


def _attach_out_of_memory_observer(observer: Callable[[int, int, int, int], Any]) -> None:
    """torch._C._cuda_attach_out_of_memory_observer (Megatron's --record-memory-history dumps a snapshot in one):
    called as (device, bytes asked, bytes allocated, bytes free) when the simulated device runs out."""
    from phantora.runtime import memory_history

    memory_history.OOM_OBSERVERS.append(observer)


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """torch.cuda.memory_snapshot: the segments of `_snapshot()`."""
    return list(_snapshot()["segments"])


# ----- random numbers (rng.py: a counter-based generator per device, as CUDA's Philox) --------------
def manual_seed(seed: int) -> None:
    rng.manual_seed(current_device(), seed)


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        rng.manual_seed(i, seed)


def initial_seed() -> int:
    return rng.get_state(current_device())[0]


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    """16 bytes, as a CUDA generator's: the seed, then the offset."""
    state = torch.tensor(list(rng.get_state(index_of(device))), dtype=torch.uint64, device="cpu")
    return state.view(torch.uint8).clone()  # a host tensor, as torch.cuda.get_rng_state gives (phantom mode too)


def set_rng_state(state: torch.Tensor, device: Any = "cuda") -> None:
    from phantora.runtime.simcuda.tensor import local

    data = local(state)
    if data.is_meta:  # phantom mode: DTensor's RNG tracker computed the offsets on meta tensors; no draws
        return
    raw = bytes(data.detach().to("cpu").to(torch.uint8).tolist())
    if len(raw) != 16:
        raise RuntimeError(f"a CUDA RNG state is 16 bytes (Philox seed and offset), got {len(raw)}")
    rng.set_state(index_of(device), int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little"))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for i, st in enumerate(states):
        set_rng_state(st, i)


class Generator:
    """`torch.cuda.default_generators[i]`: device i's generator, as the frameworks' RNG trackers use it
    (Megatron-Core's saves and sets its state around tensor-parallel regions). Its state is rng.py's."""

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)

    def _index(self) -> int:
        return self.device.index or 0

    def get_state(self) -> torch.Tensor:
        return get_rng_state(self._index())

    def set_state(self, state: torch.Tensor) -> Generator:
        set_rng_state(state, self._index())
        return self

    graphsafe_get_state = get_state
    graphsafe_set_state = set_state

    def manual_seed(self, seed: int) -> Generator:
        rng.manual_seed(self._index(), seed)
        return self

    def initial_seed(self) -> int:
        return rng.get_state(self._index())[0]

    def get_offset(self) -> int:
        return rng.get_state(self._index())[1]

    def set_offset(self, offset: int) -> Generator:
        rng.set_state(self._index(), rng.get_state(self._index())[0], offset)
        return self


# ----- what is not simulated ---------------------------------------------------------------------
def _not_simulated(call: str, workaround: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulatedError(f"{call} is not simulated by phantora's CUDA device: {workaround}")

    refuse.__name__ = call.rsplit(".", 1)[-1]
    return refuse


def _not_simulated_class(call: str, workaround: str) -> type:
    """A stand-in for a refused class: it still works in annotations (`torch.cuda.CUDAGraph | None`) and
    isinstance checks, and refuses to be made."""
    refuse = _not_simulated(call, workaround)
    return type(call.rsplit(".", 1)[-1], (), {"__init__": refuse, "__doc__": f"{call}: not simulated"})


_NO_GRAPHS = (
    "run without CUDA graphs (torchtitan: --training.disable_cuda_graphs; torch.compile: a mode other than "
    "'reduce-overhead'); a graph replays the same kernels, so eager execution has the same simulated time"
)
_REFUSED = {
    "CUDAGraph": ("torch.cuda.CUDAGraph", _NO_GRAPHS),
    "graph": ("torch.cuda.graph", _NO_GRAPHS),
    "graph_pool_handle": ("torch.cuda.graph_pool_handle", _NO_GRAPHS),
    "make_graphed_callables": ("torch.cuda.make_graphed_callables", "call the modules directly"),
    "ipc_collect": ("torch.cuda.ipc_collect", "CUDA IPC between processes is not simulated"),
}


@contextlib.contextmanager
def _nvtx_range(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield


def _nvtx() -> types.ModuleType:
    mod = types.ModuleType("torch.cuda.nvtx", "NVTX markers: no-ops on the simulated GPU")
    mod.range_push = lambda msg: 0  # type: ignore[attr-defined]
    mod.range_pop = lambda: 0  # type: ignore[attr-defined]
    mod.range_start = lambda msg: 0  # type: ignore[attr-defined]
    mod.range_end = _nothing  # type: ignore[attr-defined]
    mod.mark = _nothing  # type: ignore[attr-defined]
    mod.range = _nvtx_range  # type: ignore[attr-defined]
    return mod


_sync_debug = [0]  # torch.cuda.set_sync_debug_mode's level: 0 default, 1 warn, 2 error


def _set_sync_debug_mode(level: int) -> None:
    """torch._C's setter under `torch.cuda.set_sync_debug_mode` (torch maps the names to 0-2 and checks them): the
    level is kept and read back; the simulated GPU does not report synchronising calls, and says so once."""
    if level and not _sync_debug[0]:
        import sys

        print(
            "phantora: torch.cuda.set_sync_debug_mode is kept but not acted on: the simulated GPU neither warns of "
            "nor refuses synchronising calls",
            file=sys.stderr,
            flush=True,
        )
    _sync_debug[0] = int(level)


def _get_sync_debug_mode() -> int:
    return _sync_debug[0]


def nccl_version() -> tuple[int, int, int]:
    """`torch.cuda.nccl.version()` as a CUDA build answers it: the NCCL whose model the run follows
    (PHANTORA_NCCL_VERSION, else the one phantora restates), patch 0 where that names none."""
    import os

    from phantora.collectives.nccl.settings import nccl_release_of

    return nccl_release_of(os.environ)


def install(gpu: Any, count: int) -> None:
    """Make `torch.cuda` (and friends) answer as `count` simulated GPUs of type `gpu` (a perfmodel GpuSpec)."""
    import sys

    devices.state.update(gpu=gpu, count=max(1, count), current=0)
    cuda = torch.cuda
    init = lazy.initialising  # the functions torch.cuda initialises CUDA in (lazy.py)
    plain: dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lazy.is_initialized,
        "init": lazy.lazy_init,
        "_lazy_init": lazy.lazy_init,
        "_lazy_call": lazy.lazy_call,
        "device_count": device_count,
        "current_device": init(current_device),
        "set_device": init(_select_device),
        "device": device,
        "device_of": device_of,
        "get_device_properties": init(get_device_properties),
        "get_device_name": init(get_device_name),
        "get_device_capability": init(get_device_capability),
        "get_arch_list": get_arch_list,
        "is_bf16_supported": init(is_bf16_supported),
        "synchronize": init(streams.synchronize),
        "Stream": streams.Stream,
        "ExternalStream": streams.ExternalStream,
        "Event": streams.Event,
        "current_stream": init(streams.current_stream),
        "default_stream": init(streams.default_stream),
        "set_stream": streams.set_stream,
        "stream": streams.stream,
        "StreamContext": streams.StreamContext,
        "is_current_stream_capturing": lambda: False,
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved,
        "max_memory_reserved": max_memory_reserved,
        "memory_stats": memory_stats,
        "memory_summary": memory_summary,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "reset_accumulated_memory_stats": _nothing,
        "mem_get_info": init(mem_get_info),
        "empty_cache": empty_cache,
        "set_per_process_memory_fraction": _nothing,
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed_all,
        "seed": _nothing,
        "seed_all": _nothing,
        "initial_seed": init(initial_seed),
        "get_rng_state": init(get_rng_state),
        "set_rng_state": set_rng_state,
        "get_rng_state_all": get_rng_state_all,
        "set_rng_state_all": set_rng_state_all,
    }
    generators = tuple(Generator(i) for i in range(device_count()))
    # torch.cuda's submodules hold the same functions, and frameworks call them there too
    # (Megatron-Core: torch.cuda.random.get_rng_state)
    submodules = [getattr(cuda, m) for m in ("random", "memory", "streams") if hasattr(cuda, m)]
    for name, value in plain.items():
        for mod in (cuda, *submodules):
            if mod is cuda or hasattr(mod, name):
                setattr(mod, name, value)
    for mod in (cuda, *submodules):
        if hasattr(mod, "default_generators"):
            mod.default_generators = generators
    lazy.reset()  # uninitialised until the program first needs the device, as a real process
    for name, (call, hint) in _REFUSED.items():
        refuse = _not_simulated_class if isinstance(getattr(cuda, name, None), type) else _not_simulated
        setattr(cuda, name, refuse(call, hint))
    # torch's own _dump_snapshot pickles what this `_snapshot` returns (it looks `_snapshot` up in its module)
    cuda.memory._record_memory_history = _record_memory_history  # type: ignore[attr-defined]
    cuda.memory._snapshot = _snapshot  # type: ignore[attr-defined]
    cuda.memory_snapshot = cuda.memory.memory_snapshot = memory_snapshot  # type: ignore[attr-defined]
    torch._C._cuda_attach_out_of_memory_observer = _attach_out_of_memory_observer  # type: ignore[attr-defined]
    nvtx = _nvtx()
    cuda.nvtx = nvtx  # type: ignore[attr-defined]
    sys.modules["torch.cuda.nvtx"] = nvtx
    torch.version.cuda = CUDA_VERSION  # type: ignore[misc]
    torch.backends.cuda.is_built = lambda: True  # type: ignore[assignment]
    torch.backends.cuda.is_flash_attention_available = lambda: True  # type: ignore[assignment]  # CUDA wheels have it
    torch.cuda.nccl.version = nccl_version  # type: ignore[assignment]  # torch._C has no NCCL on this build
    cuda._cudart = SimCudart(mem_get_info)  # type: ignore[attr-defined]  # what torch.cuda.cudart() returns
    symm_mem.install()  # torch.distributed._symmetric_memory: its GPU calls said not simulated
    torch._C._cuda_set_sync_debug_mode = _set_sync_debug_mode  # type: ignore[assignment]  # no CUDA in this build
    torch._C._cuda_get_sync_debug_mode = _get_sync_debug_mode
    torch.backends.cudnn.is_available = lambda: True  # type: ignore[assignment]
    torch.backends.cudnn.version = lambda: CUDNN_VERSION  # type: ignore[assignment]
    _install_accelerator()


def _install_accelerator() -> None:
    """`torch.accelerator` (used by DeviceMesh and FSDP2 to find the device) names the simulated GPU."""
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return
    acc.is_available = lambda check_fork=False: True
    acc.current_accelerator = lambda check_available=False: torch.device("cuda")
    # Distinct function objects from torch.cuda's: torch.compile keys its handlers by function, and
    # refuses one function under two names (torch.cuda.current_stream, torch.accelerator.current_stream).
    init = lazy.initialising
    for name, fn in (
        ("device_count", device_count),
        ("current_device_index", init(current_device)),
        ("current_device_idx", init(current_device)),
        ("set_device_index", init(_select_device)),
        ("set_device_idx", init(_select_device)),
        ("synchronize", init(streams.synchronize)),
        ("current_stream", streams.current_stream),
        ("set_stream", streams.set_stream),
    ):
        setattr(acc, name, functools.wraps(fn)(functools.partial(fn)))
    acc.device_index = device  # `with torch.accelerator.device_index(i):`, as torch.cuda.device
    acc.get_device_capability = _accelerator_capability
    memory: tuple[tuple[str, Callable[..., Any]], ...] = (  # torch.accelerator.memory's, also torch.accelerator's
        ("memory_allocated", memory_allocated),
        ("max_memory_allocated", max_memory_allocated),
        ("memory_reserved", memory_reserved),
        ("max_memory_reserved", max_memory_reserved),
        ("memory_stats", memory_stats),
        ("reset_peak_memory_stats", reset_peak_memory_stats),
        ("reset_accumulated_memory_stats", _nothing),
        ("empty_cache", empty_cache),
        ("get_memory_info", mem_get_info),
    )
    for name, reader in memory:
        for mod in (acc, getattr(acc, "memory", None)):
            if mod is not None and hasattr(mod, name):
                setattr(mod, name, functools.wraps(reader)(functools.partial(reader)))


def _accelerator_capability(device: Any = None, /) -> dict[str, Any]:
    """`torch.accelerator.get_device_capability`: the dtypes a CUDA device holds (every non-quantized one)."""
    dtypes = {d for d in vars(torch).values() if isinstance(d, torch.dtype) and not str(d).startswith("torch.q")}
    return {"supported_dtypes": dtypes}
