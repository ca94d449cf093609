"""nccl-tests' -J output: the JSON file its util.cu writes (JSON_FILE_VERSION 3), same keys, nesting and text.

The document is {"version", "start_time", "args", "env", "nccl_version", "config": {... "devices": [...]},
"results": [one object per table line], "out_of_bounds", "average_bus_bandwidth", "errors", "end_time"}. As
nccl-tests writes it: no spaces, doubles as C's "%lf", booleans as the strings "true" / "false", a line's root as
its "%6i" text, "/" escaped; the file is created only if it does not exist (else FILE.0, FILE.1, ...), only for a
.json name, and under mpirun "devices" holds each process's first GPU (parseRankInfo reads the first line of each
process's block).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

JSON_FILE_VERSION = 3
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\t": "\\t", "\n": "\\n"}


def is_json_name(path: str) -> bool:
    """nccl-tests' classifyOutputFile: the text after the last '.' of the last path part is 'json' (any case)."""
    base = path.rsplit("/", 1)[-1]
    return "." in base and not base.endswith(".") and base.rsplit(".", 1)[1].lower() == "json"


def open_exclusive(path: str) -> tuple[Path | None, str]:
    """Create the file as jsonOutputInit does (fopen "wx"; if it exists, PATH.0, PATH.1, ...): (the path, the line
    nccl-tests prints) or (None, its skipping line)."""
    candidate, n = path, 0
    while True:
        try:
            with open(candidate, "x", encoding="ascii"):
                pass
        except FileExistsError:
            candidate, n = f"{path}.{n}", n + 1
            continue
        except OSError:
            return None, f"# skipping json output; {candidate} not accessible"
        return Path(candidate), f"# Writing JSON output to {candidate}"


def time_string(seconds: float) -> str:
    """formatNow's local time text of an epoch time."""
    return time.strftime(TIME_FORMAT, time.localtime(seconds))


class Double(float):
    """A value the writer prints as jsonDouble does ("%lf", "nan" quoted)."""


def encode(value: Any) -> str:
    """The compact text util.cu's writer produces for `value` (dicts keep their order; None is null; bool is a
    string; int is "%d"; Double / float is "%lf")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f'"{"true" if value else "false"}"'
    if isinstance(value, float):
        return '"nan"' if value != value else f"{value:f}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(_ESCAPES.get(c, c) for c in value) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(f"{encode(str(k))}:{encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(encode(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as nccl-tests JSON")


def config(
    *,
    nthreads: int,
    ngpus: int,
    minbytes: int,
    maxbytes: int,
    step_factor: int | None,
    step_bytes: int,
    warmup: int,
    iters: int,
    agg: int,
    check: int,
    graph: int,
    blocking: int,
    per_iter: bool,
    per_iter_skip: int,
    parallel_init: bool,
    devices: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """writeDeviceReport's "config" object."""
    step = {"step_factor": step_factor} if step_factor is not None and step_factor > 1 else {"step_bytes": step_bytes}
    return {
        "nthreads": nthreads,
        "ngpus": ngpus,
        "minimum_bytes": minbytes,
        "maximum_bytes": maxbytes,
        **step,
        "warmup_iters": warmup,
        "iterations": iters,
        "aggregated_iterations": agg,
        "validation": check,
        "graph": graph,
        "blocking_collectives": bool(blocking),
        "per_iter_timing": per_iter,
        "per_iter_skip": per_iter_skip,
        "parallel_init": parallel_init,
        "devices": list(devices),
    }


def device(rank: int, group: int, pid: int, hostname: str, dev: int, hex_id: str, info: str) -> dict[str, Any]:
    """jsonRankInfo's object of one device line."""
    return {"rank": rank, "group": group, "pid": pid, "hostname": hostname, "device": dev, "device_hex": hex_id,
            "device_info": info}  # fmt: skip


def body(time_us: float, algbw: float, busbw: float, wrong: float | None, cputime: bool) -> dict[str, Any]:
    """writeBenchmarkLineBody's "out_of_place" / "in_place" object."""
    return {
        "cpu_time" if cputime else "time": Double(time_us),
        "alg_bw": Double(algbw),
        "bus_bw": Double(busbw),
        "nwrong": None if wrong is None else Double(wrong),
    }


def per_iter(stats: Any, times_us: Sequence[float], skipped: int, processes: int = 1) -> dict[str, Any]:
    """writePerIterReport's "*_per_iter" object (stats in us). Under mpirun (`processes` > 1) it adds each process's
    row of times (the max over its GPUs; every GPU's time is the same in the simulation)."""
    rows = {"per_process_max_times_us": [[Double(t) for t in times_us]] * processes} if processes > 1 else {}
    return {
        "skipped_iterations": skipped,
        "min_us": Double(stats.min),
        "max_us": Double(stats.max),
        "avg_us": Double(stats.avg),
        "p50_us": Double(stats.p50),
        "p95_us": Double(stats.p95),
        "p99_us": Double(stats.p99),
        "stdev_us": Double(stats.stdev),
        "cv_pct": Double(stats.cv_pct),
        "times_us": [Double(t) for t in times_us],
        **rows,
    }


def result(
    size: int, count: int, typename: str, op: str, root: int, groups: Sequence[tuple[str, dict[str, Any]]], iters: int
) -> dict[str, Any]:
    """One table line's object: writeBenchmarkLinePreamble's keys, the column groups in order, then
    writeBenchmarkLineTerminator's."""
    out: dict[str, Any] = {"size": size, "count": count, "type": typename, "redop": op, "root": f"{root:6d}"}
    out.update(groups)
    out.update({"actual_iterations": iters, "experiment_name": ""})
    return out


def document(
    *,
    start: float,
    end: float,
    argv: Sequence[str],
    nccl_version: int,
    config_obj: dict[str, Any],
    results: Sequence[dict[str, Any]],
    avg_busbw: float,
    avg_okay: bool | str = "unchecked",
) -> dict[str, Any]:
    """The whole file: jsonOutputInit's keys, "config", "results", writeResultFooter's and writeErrors' keys (no
    NCCL error: ncclGetLastError's empty string) and "end_time". `avg_okay`: the average's NCCL_TESTS_MIN_BW check,
    a bool, or the string "unchecked" without one (writeResultFooter)."""
    return {
        "version": JSON_FILE_VERSION,
        "start_time": time_string(start),
        "args": list(argv),
        "env": [f"{k}={v}" for k, v in os.environ.items()],
        "nccl_version": nccl_version,
        "config": config_obj,
        "results": list(results),
        "out_of_bounds": {"count": 0, "okay": True},
        "average_bus_bandwidth": {"bandwidth": Double(avg_busbw), "okay": avg_okay},
        "errors": [""],
        "end_time": time_string(end),
    }
