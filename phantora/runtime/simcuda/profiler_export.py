"""A torch.profiler window's results on the simulated timeline: the simulated GPU's work (runtime/gpu_window.py) added
to what torch's profiler exports, and the CPU ops moved to simulated time.

`simulated_chrome_trace` rewrites Kineto's chrome-trace document: every host event's time becomes the rank's
simulated time (`GpuWindow.sim_ns`: the compute stream's time as of the last GPU event the host had made by then), and
the window's kernels ("cat": "kernel"), copies ("gpu_memcpy") and collectives (NCCL kernels, "cat": "kernel") are
added on the GPU's process (`pid`: the device index) and its streams (`tid`): the default stream is 7 (as CUDA numbers
it in Kineto's traces), a side stream of phantora's id N is 7 + N, and collectives run on NCCL streams from 100 (one
more where they overlap, as trace.json's comm lanes; from the next hundred where side streams reach 100). Times are
µs of simulated time since the run began (`baseTimeNanoseconds` 0); the document's "phantora" entry says so.

`simulated_function_events` does the same for the events `key_averages()` and `events()` read: each CPU op's time range
in simulated time, each kernel, copy and collective appended to the CPU op that launched it (the innermost one open on
the program's thread when it was launched or issued) and listed as a CUDA event of its own, so that the CUDA columns
hold the simulated times. In the chrome trace, each GPU event's "External id" is that op's, as Kineto links them,
and a flow arrow goes from the op to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from phantora.runtime.gpu_window import GpuSpan, GpuWindow

DEFAULT_STREAM = 7  # the default stream's id in Kineto's traces of CUDA
NCCL_STREAM_BASE = 100  # the first NCCL stream's id here
MACHINERY = frozenset({"PythonDispatchMode"})  # the simulated GPU's own dispatch (a CPU op inside the op it runs)
_OP_CATS = ("cpu_op", "user_annotation")  # Kineto's CPU-op categories a kernel's launching op is one of
_SEQ = re.compile(r"#\d+.*$")  # trace.json's collective names go on from their sequence number: "all_reduce#3 ..."

NOTE = (
    "phantora simulated this GPU: its kernels, copies and collectives are the simulated ones, at their simulated "
    "times; every time in this trace (the CPU ops' too) is the rank's simulated time in microseconds since the run "
    "began. A CPU op is placed at the compute stream's simulated time as of the last GPU event the host had made "
    "when it started or ended (phantora's host waits for the GPU: a CPU op that launches a kernel spans it); "
    "CPU work phantora does not charge takes no simulated time."
)


def stream_id(span: GpuSpan) -> int:
    """The Kineto stream id of a kernel or copy: 7 for the default stream, 7 + N for phantora's side stream N."""
    return DEFAULT_STREAM + (span.stream or 0)


def kernel_name(span: GpuSpan) -> str:
    """A span's kernel name: a collective's is "nccl:" and its kind, without its sequence number and what follows
    (trace.json's full name is in the event's "collective" argument)."""
    return span.name if span.stream is not None else "nccl:" + _SEQ.sub("", span.name)


def nccl_streams(spans: Sequence[GpuSpan]) -> dict[int, int]:
    """The NCCL stream of each collective (by its index in `spans`): the first free at its start, in order of their
    starts, from NCCL_STREAM_BASE (or the first hundred above the side streams' ids, where they reach it)."""
    sides = [stream_id(s) for s in spans if s.stream is not None]
    base = max(NCCL_STREAM_BASE, (max(sides, default=0) // 100 + 1) * 100)
    ends: list[int] = []
    out: dict[int, int] = {}
    indexed = [(i, s) for i, s in enumerate(spans) if s.stream is None]
    for i, s in sorted(indexed, key=lambda x: (x[1].start, x[1].end)):
        lane = next((k for k, t in enumerate(ends) if t <= s.start), len(ends))
        if lane == len(ends):
            ends.append(s.end)
        ends[lane] = s.end
        out[i] = base + lane
    return out


def simulated_chrome_trace(doc: dict[str, Any], window: GpuWindow, device: int, gpu_name: str) -> dict[str, Any]:
    """Kineto's chrome-trace document `doc` on the simulated timeline with the window's GPU work (in place)."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("torch.profiler's trace has no traceEvents list")
    base = int(doc.get("baseTimeNanoseconds", 0))
    launchers = launching_events(events, base, window.spans)  # from the CPU ops' real times, before they move
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") == "M" or "ts" not in ev:
            continue
        wall = base + round(float(ev["ts"]) * 1000)
        start = window.sim_ns(wall)
        if "dur" in ev:
            ev["dur"] = (window.sim_ns(wall + round(float(ev["dur"]) * 1000)) - start) / 1000.0
        ev["ts"] = start / 1000.0
    events.extend(gpu_events(window.spans, device, launchers))
    doc["baseTimeNanoseconds"] = 0
    props = doc.get("deviceProperties")
    if not props:
        doc["deviceProperties"] = [{"id": device, "name": gpu_name}]
    doc["phantora"] = {
        "simulated_gpu": gpu_name,
        "device": device,
        "window_ns": [window.start_ns, window.end_ns],
        "note": NOTE,
    }
    return doc


def launching_events(events: list[Any], base: int, spans: Sequence[GpuSpan]) -> dict[int, dict[str, Any]]:
    """The CPU op event (of Kineto's `events`, their times µs after `base` ns, not yet moved to simulated time) that
    launched each span (by index): the innermost "cpu_op" or "user_annotation" with an "External id" open on the
    program's thread at its launch (for a collective, "cpu_op" only, as `launching_ops`)."""
    ops = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in _OP_CATS
           and e.get("name") not in MACHINERY and "External id" in (e.get("args") or {})]  # fmt: skip
    main = busiest(e.get("tid") for e in ops)
    mine, plain = [], []
    for e in ops:
        if e.get("tid") == main:
            start = base + round(float(e["ts"]) * 1000)
            mine.append((start, start + round(float(e.get("dur", 0)) * 1000), e))
            if e.get("cat") == "cpu_op":
                plain.append(mine[-1])
    return innermost(mine, launches(spans, False)) | innermost(plain, launches(spans, True))


def gpu_events(
    spans: Sequence[GpuSpan], device: int, launchers: dict[int, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The chrome-trace events of `spans` on GPU `device`: names of its process and streams, then one "X" event each;
    where `launchers` has the CPU op event that launched it, its "External id" and a flow from that op's start to
    the kernel ("cat": "ac2g", as Kineto draws a launch)."""
    nccl = nccl_streams(spans)
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": device, "args": {"name": f"GPU {device} (simulated)"}},
        {"name": "process_sort_index", "ph": "M", "pid": device, "args": {"sort_index": 1000 + device}},
    ]
    named: set[int] = set()
    for i, s in enumerate(spans):
        tid = nccl[i] if s.stream is None else stream_id(s)
        if tid not in named:
            named.add(tid)
            out.append({"name": "thread_name", "ph": "M", "pid": device, "tid": tid, "args": {"name": f"stream {tid}"}})
        args: dict[str, Any] = {"device": device, "stream": tid, "correlation": i + 1, "simulated": True}
        op = launchers.get(i) if launchers else None
        if op is not None:
            args["External id"] = op["args"]["External id"]
            flow = {"id": i + 1, "cat": "ac2g", "name": "ac2g"}
            out.append({"ph": "s", "pid": op["pid"], "tid": op["tid"], "ts": op["ts"], **flow})
            out.append({"ph": "f", "bp": "e", "pid": device, "tid": tid, "ts": s.start / 1000.0, **flow})
        if s.args:
            args.update(s.args)
            args["collective"] = s.name
        cat = "gpu_memcpy" if s.kind == "memcpy" else "kernel"
        out.append(
            {
                "ph": "X",
                "cat": cat,
                "name": kernel_name(s),
                "pid": device,
                "tid": tid,
                "ts": s.start / 1000.0,
                "dur": (s.end - s.start) / 1000.0,
                "args": args,
            }
        )
    return out


def simulated_function_events(events: Any, window: GpuWindow, trace_start_ns: int, device: int) -> None:
    """torch's `EventList` of a window (times in µs since `trace_start_ns`, real epoch ns) on the simulated timeline
    (µs since the window's start), its kernels appended to the CPU ops that launched them and listed as CUDA events,
    its CUDA columns on (in place). Once a window: events already moved (an earlier window's, which torch's
    `acc_events` keeps) stay as they are."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    if getattr(events, "_phantora_window", None) is window:
        return
    events._phantora_window = window
    origin = window.start_ns

    def sim_us(rel_us: float) -> float:
        return (window.sim_ns(trace_start_ns + round(rel_us * 1000)) - origin) / 1000.0

    cpu = [e for e in events if e.device_type == DeviceType.CPU and not getattr(e, "_phantora", False)]
    walls = {id(e): (trace_start_ns + round(e.time_range.start * 1000), trace_start_ns + round(e.time_range.end * 1000))
             for e in cpu}  # fmt: skip
    launcher = launching_ops([e for e in cpu if not e.is_async and e.name not in MACHINERY], walls, window.spans)
    for e in cpu:
        e.time_range.start, e.time_range.end = sim_us(e.time_range.start), sim_us(e.time_range.end)
        e.use_device, e._phantora = "cuda", True
    next_id = max((e.id for e in events), default=0) + 1
    nccl = nccl_streams(window.spans)
    for i, s in enumerate(window.spans):
        name, dur = kernel_name(s), (s.end - s.start) / 1000.0
        op = launcher.get(i)
        if op is not None:
            op.append_kernel(name, device, dur)
        tid = nccl[i] if s.stream is None else stream_id(s)
        start = (s.start - origin) / 1000.0
        fe = FunctionEvent(id=next_id + i, name=name, thread=tid, start_us=start, end_us=start + dur, trace_name=name,
                           overload_name="", input_shapes=[], concrete_inputs=[], kwinputs={}, stack=[],
                           use_device="cuda", device_type=DeviceType.CUDA, device_index=device,
                           device_resource_id=tid)  # fmt: skip
        fe._phantora = True  # type: ignore[attr-defined]
        events.append(fe)
    events._use_device = "cuda"


def innermost(intervals: Sequence[tuple[float, float, Any]], points: Iterable[tuple[float, int]]) -> dict[int, Any]:
    """For each point (moment, key), the innermost of the nested `intervals` ((start, end, item)) open at its moment,
    by key; none where no interval is."""
    ordered = sorted(intervals, key=lambda x: (x[0], -x[1]))
    out: dict[int, Any] = {}
    stack: list[tuple[float, float, Any]] = []
    k = 0
    for moment, key in sorted(points):
        while k < len(ordered) and ordered[k][0] <= moment:
            while stack and stack[-1][1] < ordered[k][0]:
                stack.pop()
            stack.append(ordered[k])
            k += 1
        while stack and stack[-1][1] < moment:
            stack.pop()
        if stack:
            out[key] = stack[-1][2]
    return out


def launches(spans: Sequence[GpuSpan], collectives: bool) -> list[tuple[float, int]]:
    """(real epoch ns of its launch, index) of each kernel and copy (`collectives`: each collective) the program's
    thread launched in the window."""
    return [
        (s.wall, i) for i, s in enumerate(spans) if s.main and s.wall is not None and (s.stream is None) == collectives
    ]


def busiest(threads: Iterable[Any]) -> Any:
    """The thread most of the CPU ops are on: the program's, which runs the profiled loop (torch numbers its
    threads its own way)."""
    counts: dict[int, int] = {}
    for t in threads:
        counts[t] = counts.get(t, 0) + 1
    return max(counts, key=lambda t: counts[t]) if counts else None


def launching_ops(ops: Sequence[Any], walls: dict[int, tuple[int, int]], spans: Sequence[GpuSpan]) -> dict[int, Any]:
    """The CPU op (of torch's function events `ops`, whose real epoch intervals `walls` gives by id) that launched
    each span of `spans` (by index) on the program's thread: the innermost op open at its launch (`innermost`); for
    a collective, the innermost that is not a user annotation (phantora's collectives record no op of torch's: one
    issued in `record_function("x")` is not x's own)."""
    main = busiest(e.thread for e in ops)
    mine = [(*walls[id(e)], e) for e in ops if e.thread == main]
    kernels = innermost(mine, launches(spans, False))
    return kernels | innermost([x for x in mine if not x[2].is_user_annotation], launches(spans, True))
