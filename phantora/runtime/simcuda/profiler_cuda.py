"""`torch.profiler` asked for CUDA activity on the simulated GPU: the simulated kernels, copies and collectives of the
profiled window, at their simulated times, in what it exports.

This CPU build of torch has no CUPTI: a profiler started with `ProfilerActivity.CUDA` (or the autograd profiler with
`use_device="cuda"`) printed a C++ traceback at every op of a simulated-GPU tensor ("Failed to record CUDA event. CUDA
used in profiler but not enabled."). So `install()` drops CUDA from what torch's profiler is given and, for a profile
that asked for it, records the rank's simulated GPU work while its `torch.autograd.profiler.profile` (the one
torch.profiler's profiles run for each active window) records (runtime/gpu_window.py). Its `export_chrome_trace`
then writes Kineto's trace with that work added and every time on the simulated timeline, and its function events
(what `key_averages()` and `events()` read) have the kernels in their CUDA columns (profiler_export.py).
The CPU ops move to simulated time too: a trace with host wall-clock CPU ops beside simulated kernels would put
them on two unrelated clocks. A profile that asked for the CPU alone is left as torch makes it (wall-clock times).
"""

from __future__ import annotations

import functools
import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.autograd.profiler import profile as AutogradProfile
from torch.profiler import ProfilerActivity
from torch.profiler.profiler import _KinetoProfile

from phantora.runtime.gpu_window import GpuWindow
from phantora.runtime.simcuda import devices
from phantora.runtime.simcuda.profiler_export import simulated_chrome_trace, simulated_function_events

_told: list[bool] = []
GPU_CATS = ("kernel", "gpu_memcpy")  # Kineto's categories of a GPU's kernels (collectives too) and copies
SAID = (
    "phantora: torch.profiler's CUDA activity is the simulated GPU's: its kernels, copies and collectives at their "
    "simulated times, and the CPU ops placed on the same simulated timeline (docs/runtime.md)"
)


def without_cuda(activities: Any) -> Any:
    """`activities` without CUDA (an activity, or a key of a dict item); None stays None (torch's default, which on
    this build is the CPU). What is left empty becomes the CPU alone."""
    if activities is None:
        return None
    kept: list[Any] = []
    for a in activities:
        if isinstance(a, dict):
            a = {k: v for k, v in a.items() if k != ProfilerActivity.CUDA}
            if a:
                kept.append(a)
        elif a != ProfilerActivity.CUDA:
            kept.append(a)
    return kept or [ProfilerActivity.CPU]


def _asks_cuda(activities: Any) -> bool:
    return activities is not None and any(
        (ProfilerActivity.CUDA in a) if isinstance(a, dict) else a == ProfilerActivity.CUDA for a in activities
    )


def _session() -> Any:
    from phantora.runtime import session

    return session.current()


def _gpu_name() -> str:
    gpu = devices.state.get("gpu")
    return str(getattr(gpu, "cuda_name", None) or getattr(gpu, "name", "simulated GPU"))


def _say_once() -> None:
    if not _told:
        _told.append(True)
        print(SAID, file=sys.stderr, flush=True)


def _wrap(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(cls, name)
    if getattr(original, "_phantora", False):
        return
    wrapped = functools.wraps(original)(make(original))
    wrapped._phantora = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapped)


def _kineto_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(self: Any, *args: Any, activities: Any = None, **kwargs: Any) -> None:
        self._phantora_cuda = _asks_cuda(activities)
        if self._phantora_cuda:
            _say_once()
            activities = without_cuda(list(activities))
        original(self, *args, activities=activities, **kwargs)

    return init


def _prepare_trace(original: Callable[..., Any]) -> Callable[..., Any]:
    def prepare_trace(self: Any) -> None:
        original(self)
        if getattr(self, "_phantora_cuda", False) and self.profiler is not None:
            self.profiler._phantora_cuda = True  # the autograd profile it runs records the simulated GPU

    return prepare_trace


def _autograd_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        cuda = bool(kwargs.get("use_cuda")) or kwargs.get("use_device") == "cuda"
        if cuda:
            _say_once()
            kwargs["use_cuda"], kwargs["use_device"] = False, None
        self._phantora_cuda = cuda
        self._phantora_open = self._phantora_window = None
        original(self, *args, **kwargs)

    return init


def _start_trace(original: Callable[..., Any]) -> Callable[..., Any]:
    def start_trace(self: Any) -> None:
        original(self)
        s = _session()
        if getattr(self, "_phantora_cuda", False) and s is not None:
            self._phantora_open = GpuWindow.open(s)
            self._phantora_device = devices.current_device()

    return start_trace


def _exit(original: Callable[..., Any]) -> Callable[..., Any]:
    def exit_(self: Any, *args: Any) -> Any:
        w = getattr(self, "_phantora_open", None)
        if w is not None:
            w.close()
            self._phantora_open = None
            self._phantora_window = w
        return original(self, *args)

    return exit_


def exported(path: str, window: GpuWindow, events: int) -> str:
    """What the rank says of a trace it exported with `events` of the simulated GPU: where it is, and its window on
    the simulated timeline (trace.json's, in ms since the run began), to find the same spans there."""
    return (
        f"phantora: torch.profiler's trace {path}: the simulated GPU's {events} kernels, copies and collectives "
        f"of {window.start_ns / 1e6:.3f}-{window.end_ns / 1e6:.3f} ms simulated (trace.json's timeline)"
    )


def _export_chrome_trace(original: Callable[..., Any]) -> Callable[..., Any]:
    def export_chrome_trace(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        out = original(self, path, *args, **kwargs)
        w = getattr(self, "_phantora_window", None)
        if w is not None:
            self._phantora_events = rewrite_trace(Path(path), w, self._phantora_device, _gpu_name())
            if not getattr(self, "_phantora_inner", False):  # torch.profiler's export names its own path below
                print(exported(path, w, self._phantora_events), file=sys.stderr, flush=True)
        return out

    return export_chrome_trace


def _kineto_export(original: Callable[..., Any]) -> Callable[..., Any]:
    def export_chrome_trace(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        inner = self.profiler
        if inner is not None:
            inner._phantora_inner = True  # a `.gz` path: its profile writes a temporary file, gzipped to `path`
        try:
            out = original(self, path, *args, **kwargs)
        finally:
            if inner is not None:
                inner._phantora_inner = False
        w = getattr(inner, "_phantora_window", None)
        if w is not None:
            print(exported(str(path), w, inner._phantora_events), file=sys.stderr, flush=True)
        return out

    return export_chrome_trace


def rewrite_trace(path: Path, window: GpuWindow, device: int, gpu_name: str) -> int:
    """The chrome trace torch wrote at `path` (JSON, or gzip-compressed JSON) on the simulated timeline with
    `window`'s GPU work; how many GPU events (kernels, copies, collectives) it holds."""
    raw = path.read_bytes()
    zipped = raw[:2] == b"\x1f\x8b"
    try:
        doc = json.loads(gzip.decompress(raw) if zipped else raw)
    except ValueError as e:
        raise ValueError(f"{path}: torch.profiler's trace is not JSON ({e})") from e
    doc = simulated_chrome_trace(doc, window, device, gpu_name)
    text = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(text) if zipped else text)
    return sum(1 for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") in GPU_CATS)


def _ensure_function_events(original: Callable[..., Any]) -> Callable[..., Any]:
    def ensure(self: Any) -> None:
        original(self)
        w = getattr(self, "_phantora_window", None)
        if w is not None and self._function_events is not None and self.kineto_results is not None:
            start = int(self.kineto_results.trace_start_ns())
            simulated_function_events(self._function_events, w, start, self._phantora_device)

    return ensure


def install() -> None:
    """Patch torch's profilers (idempotent)."""
    _wrap(_KinetoProfile, "__init__", _kineto_init)
    _wrap(_KinetoProfile, "prepare_trace", _prepare_trace)
    _wrap(_KinetoProfile, "export_chrome_trace", _kineto_export)
    _wrap(AutogradProfile, "__init__", _autograd_init)
    _wrap(AutogradProfile, "_start_trace", _start_trace)
    _wrap(AutogradProfile, "__exit__", _exit)
    _wrap(AutogradProfile, "export_chrome_trace", _export_chrome_trace)
    _wrap(AutogradProfile, "_ensure_function_events", _ensure_function_events)
