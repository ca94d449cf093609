"""`torch.profiler` asked for CUDA activity on the simulated GPU: the simulated kernels, copies and collectives of the
profiled window, at their simulated times, in what it exports.

This CPU build of torch has no CUPTI: a profiler started with `ProfilerActivity.CUDA` printed a C++ traceback at every
op of a simulated-GPU tensor ("Failed to record CUDA event. CUDA used in profiler but not enabled."). So `install()`
drops CUDA from the activities torch's profiler is given, and, for a profile that asked for it, records the rank's
simulated GPU work from its `start_trace` to its `stop_trace` (its active steps under a schedule;
runtime/gpu_window.py). `export_chrome_trace` then writes Kineto's trace with that work added and every time on the
simulated timeline, and `key_averages()` / `events()` have the kernels in their CUDA columns (profiler_export.py).
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

from torch.profiler import ProfilerActivity
from torch.profiler.profiler import _KinetoProfile

from phantora.runtime.gpu_window import GpuWindow
from phantora.runtime.simcuda import devices
from phantora.runtime.simcuda.profiler_export import simulated_chrome_trace, simulated_function_events

_told: list[bool] = []
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


def _wrap(name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(_KinetoProfile, name)
    if getattr(original, "_phantora", False):
        return
    wrapped = functools.wraps(original)(make(original))
    wrapped._phantora = True  # type: ignore[attr-defined]
    setattr(_KinetoProfile, name, wrapped)


def _init(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(self: Any, *args: Any, activities: Any = None, **kwargs: Any) -> None:
        self._phantora_cuda = _asks_cuda(activities)
        self._phantora_open = self._phantora_window = None
        if self._phantora_cuda:
            if not _told:
                _told.append(True)
                print(SAID, file=sys.stderr, flush=True)
            activities = without_cuda(list(activities))
        original(self, *args, activities=activities, **kwargs)

    return init


def _start_trace(original: Callable[..., Any]) -> Callable[..., Any]:
    def start_trace(self: Any) -> None:
        original(self)
        s = _session()
        if getattr(self, "_phantora_cuda", False) and s is not None:
            self._phantora_open = GpuWindow.open(s)
            self._phantora_device = devices.current_device()

    return start_trace


def _stop_trace(original: Callable[..., Any]) -> Callable[..., Any]:
    def stop_trace(self: Any) -> None:
        w = getattr(self, "_phantora_open", None)
        if w is not None:
            w.close()
            self._phantora_open = None
        self._phantora_window = w
        self._phantora_events = None  # the function events these were made for
        original(self)

    return stop_trace


def _export_chrome_trace(original: Callable[..., Any]) -> Callable[..., Any]:
    def export_chrome_trace(self: Any, path: str, use_python_export: bool = False) -> Any:
        out = original(self, path, use_python_export)
        w = getattr(self, "_phantora_window", None)
        if w is not None:
            rewrite_trace(Path(path), w, self._phantora_device, _gpu_name())
        return out

    return export_chrome_trace


def rewrite_trace(path: Path, window: GpuWindow, device: int, gpu_name: str) -> None:
    """The chrome trace torch wrote at `path` (JSON, or gzip-compressed JSON for a name ending ".gz") on the
    simulated timeline with `window`'s GPU work."""
    zipped = path.name.endswith(".gz")
    raw = gzip.decompress(path.read_bytes()) if zipped else path.read_bytes()
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{path}: torch.profiler's trace is not JSON ({e})") from e
    text = json.dumps(simulated_chrome_trace(doc, window, device, gpu_name)).encode()
    path.write_bytes(gzip.compress(text) if zipped else text)


def _simulated_events(self: Any) -> None:
    """The window's function events on the simulated timeline, with its kernels (once a window)."""
    w = getattr(self, "_phantora_window", None)
    if w is None or self.profiler is None:
        return
    events = self.profiler.function_events
    if events is None or getattr(self, "_phantora_events", None) is events:
        return
    self._phantora_events = events
    simulated_function_events(events, w, int(self.profiler.kineto_results.trace_start_ns()), self._phantora_device)


def _reads_events(original: Callable[..., Any]) -> Callable[..., Any]:
    def reads(self: Any, *args: Any, **kwargs: Any) -> Any:
        _simulated_events(self)
        return original(self, *args, **kwargs)

    return reads


def install() -> None:
    """Patch torch.profiler's profiles (idempotent)."""
    _wrap("__init__", _init)
    _wrap("start_trace", _start_trace)
    _wrap("stop_trace", _stop_trace)
    _wrap("export_chrome_trace", _export_chrome_trace)
    _wrap("key_averages", _reads_events)
    _wrap("events", _reads_events)
