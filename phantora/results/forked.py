"""A large results file's rows formatted by forked processes side by side (issue 38, item 3).

The driver writes its results after every partition worker has finished, so that CPU is serial, and it is nearly
all formatting rows (`phantora.results.write`: one `%` template a row), block by independent block. A file of
`rows` rows is split into up to `procs(rows)` ranges in row order, each formatted by a forked child into a part
file beside the file, and the parts are appended in order, so the file is byte for byte the one a single process
writes. A child only formats and writes (the collector off: no finaliser of the parent's objects, such as a
socket's, runs in it); a child that fails fails the write with its one-line error, and no part file is left behind.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import IO

from phantora.errors import InputError, PhantoraError

PROCS_ENV = "PHANTORA_WRITE_PROCS"  # the most processes formatting one file (1: this one alone)
MIN_ROWS = 400_000  # the least rows a process formats
# the most by default (at most the CPUs): each fork copies this process's page tables, about 0.1 CPU s at 1.5 GB
# of RSS (bench/bench_results_write.py), serial here, so past about 8 the forks cost more than the rows they share
MOST = 8
last_child_cpu_s: list[float] = []  # each child's CPU seconds in the last `write_blocks` that forked (benches)


def most_procs() -> int:
    """`PROCS_ENV`, else the CPUs this process may run on, at most `MOST`; 1 where there is no fork."""
    env = os.environ.get(PROCS_ENV, "").strip()
    if env:
        try:
            most = int(env)
        except ValueError:
            raise InputError(f"{PROCS_ENV}={env!r} is not a whole number", field=PROCS_ENV) from None
        if most < 1:
            raise InputError(f"{PROCS_ENV}={env!r} must be at least 1", field=PROCS_ENV)
    else:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        most = min(cpus, MOST)
    return most if hasattr(os, "fork") else 1


def procs(rows: int) -> int:
    """How many processes format `rows` rows: one per `MIN_ROWS`, at least 1, at most `most_procs()`."""
    return max(1, min(most_procs(), rows // MIN_ROWS))


def _write_range(out: IO[str], text: Callable[[int, int], str], lo: int, hi: int, block: int) -> None:
    for a in range(lo, hi, block):
        out.write(text(a, min(a + block, hi)))


def write_blocks(f: IO[str], path: Path, rows: int, text: Callable[[int, int], str], block: int) -> None:
    """Write text(a, b) of the blocks [a, b) of at most `block` rows covering [0, rows) to `f` (the file being
    written to `path`), in order; with `procs(rows)` > 1 each range is formatted by a forked child into a part file
    beside `path`, appended to `f` in order. This process only forks and appends: rows it formatted while children
    run would cost it a copy of each page it touches that they share (copy on write), besides the forks."""
    k = procs(rows)
    if k == 1:
        _write_range(f, text, 0, rows, block)
        return
    step = -(-rows // k)
    parts: list[tuple[int, Path]] = []
    try:
        for i in range(k):
            part = path.with_name(f".{path.name}.{os.getpid()}.part{i}")
            pid = os.fork()
            if pid == 0:  # the child: format its range, nothing else
                _child(part, text, i * step, min((i + 1) * step, rows), block)
            parts.append((pid, part))
        f.flush()
        last_child_cpu_s.clear()
        while parts:
            pid, part = parts.pop(0)
            _reap(pid, part, path)
            with part.open("rb") as src:
                shutil.copyfileobj(src, f.buffer)  # type: ignore[attr-defined]
            part.unlink()
    finally:
        for pid, part in parts:  # the write failed: stop the children still running, leave no part behind
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            part.unlink(missing_ok=True)
            _err(part).unlink(missing_ok=True)


def _child(part: Path, text: Callable[[int, int], str], lo: int, hi: int, block: int) -> None:
    """A forked child's whole life: its range into `part`, its error (one line) beside it; never returns."""
    gc.disable()
    code = 0
    try:
        with part.open("w") as out:
            _write_range(out, text, lo, hi, block)
    except BaseException as e:  # noqa: BLE001 - every failure goes to the parent, which raises it
        code = 1
        try:
            _err(part).write_text(f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else repr(e))
        except BaseException:  # noqa: BLE001 - the exit code still says it failed
            pass
    os._exit(code)


def _err(part: Path) -> Path:
    return part.with_name(part.name + ".err")


def _reap(pid: int, part: Path, path: Path) -> None:
    """Wait for the child `pid` (its CPU into `last_child_cpu_s`); raise its error if it failed."""
    _, status, usage = os.wait4(pid, 0)
    last_child_cpu_s.append(usage.ru_utime + usage.ru_stime)
    if os.waitstatus_to_exitcode(status) != 0:
        err = _err(part)
        why = err.read_text() if err.exists() else f"exit status {os.waitstatus_to_exitcode(status)}"
        part.unlink(missing_ok=True)
        err.unlink(missing_ok=True)
        raise PhantoraError(f"writing {path.name}: a process formatting its rows failed ({why})")
