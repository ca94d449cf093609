"""The optional Ray backend of `phantora sweep --ray ADDRESS`: one Ray task (one CPU) per run.

Each task runs `python -m phantora.cli ...` on whichever node Ray picks, in a private temporary
output directory, and sends the files it wrote back to the driver, which stores them in the run
directory; so the nodes need no shared file system for outputs. Inputs (workloads, topologies)
are read on the worker: give paths that exist on every node (the same checkout, or shared storage),
or shipped names. ADDRESS is a cluster address (``ray://host:10001`` or ``host:6379``), ``auto`` for
the cluster this machine belongs to, or ``local`` for a private Ray instance on this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from phantora.errors import PhantoraError
from phantora.sweep_local import RunOutcome, RunSpec, error_line, write_log

MAX_FILE_BYTES = 256 * 2**20  # larger outputs are not shipped back (their names are listed in the log)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PhantoraError("--ray needs the optional Ray extra: pip install 'ray[default]'") from None
    return ray


def execute(args: list[str], out_token: str, cwd: str, timeout_s: float | None) -> dict[str, Any]:
    """Run one configuration on this node; return its exit status, output and files (the Ray task body)."""
    with tempfile.TemporaryDirectory(prefix="phantora-sweep-") as tmp:
        argv = [sys.executable, "-m", "phantora.cli", *(a.replace(out_token, tmp) for a in args)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
                cwd=cwd if os.path.isdir(cwd) else None,
            )
            rc, out, err, timed_out = proc.returncode, proc.stdout, proc.stderr, False
        except subprocess.TimeoutExpired as exc:
            rc, timed_out = None, True
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        wall = time.perf_counter() - t0
        files: dict[str, bytes] = {}
        skipped: list[str] = []
        for p in sorted(Path(tmp).rglob("*")):
            if p.is_file():
                rel = str(p.relative_to(tmp))
                if p.stat().st_size > MAX_FILE_BYTES:
                    skipped.append(rel)
                else:
                    files[rel] = p.read_bytes()
        return {
            "returncode": rc,
            "stdout": out,
            "stderr": err,
            "timed_out": timed_out,
            "wall_s": wall,
            "files": files,
            "skipped": skipped,
            "node": os.uname().nodename,
        }


def run_on_ray(
    runs: Sequence[RunSpec],
    address: str,
    timeout_s: float | None,
    on_done: Callable[[RunSpec, RunOutcome], None] | None = None,
) -> list[RunOutcome]:
    """Run every configuration as a Ray task; a failed task is reported and the others go on."""
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(
                address=None if address in ("", "local") else address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except Exception as exc:  # noqa: BLE001 - ConnectionError, ValueError ... from Ray
            raise PhantoraError(f"cannot connect to Ray at {address!r}: {exc}") from None
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(execute)
        cwd = os.getcwd()
        pending = {task.remote(r.args, str(r.out), cwd, timeout_s): r for r in runs}
        outcomes: dict[int, RunOutcome] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            run = pending.pop(ref)
            res = _collect(ray, ref, run, timeout_s)
            outcomes[run.index] = res
            if on_done:
                on_done(run, res)
        return [outcomes[r.index] for r in runs]
    finally:
        if started_here:
            ray.shutdown()


def _collect(ray: Any, ref: Any, run: RunSpec, timeout_s: float | None) -> RunOutcome:
    """Store a finished task's files and log in the run directory; turn it into a RunOutcome."""
    if run.out.exists():
        shutil.rmtree(run.out)
    run.out.mkdir(parents=True)
    try:
        data = ray.get(ref)
    except Exception as exc:  # noqa: BLE001 - the task itself died (node lost, worker crash)
        write_log(run, "", f"Ray task failed: {exc}")
        return RunOutcome(run.index, "failed", None, f"Ray task failed: {type(exc).__name__}", 0.0)
    for rel, blob in data["files"].items():
        dest = run.out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(blob)
    note = f"\n(ran on {data['node']}; not copied back: {', '.join(data['skipped']) or 'nothing'})\n"
    write_log(run, data["stdout"], data["stderr"] + note)
    rc = data["returncode"]
    if data["timed_out"]:
        error = f"timed out after {timeout_s:g} s"
    else:
        error = "" if rc == 0 else error_line(data["stderr"], data["stdout"]) or f"exit status {rc}"
    return RunOutcome(run.index, "ok" if rc == 0 else "failed", rc, error, data["wall_s"])
