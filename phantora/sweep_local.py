"""Running sweep points as local processes: one run's spec and outcome, its log, and the pool of local runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from phantora.errors import PhantoraError
from phantora.results import schema as S
from phantora.results.run_dir import RunDir

Scalar = str | int | float | bool


@dataclass
class RunSpec:
    """One run of a sweep."""

    index: int
    params: dict[str, Scalar]
    args: list[str]  # after `python -m phantora.cli`
    out: Path
    varying: dict[str, Scalar]

    @property
    def label(self) -> str:
        return self.out.name

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())


@dataclass
class RunOutcome:
    """What happened to one run."""

    index: int
    status: str  # ok | failed
    returncode: int | None
    error: str
    wall_s: float


def error_line(stderr: str, stdout: str = "") -> str:
    """The most telling line of a failed run: phantora's own error line, else the last line of output."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("phantora") and "error" in ln:
            return ln
    if lines:
        return lines[-1]
    out = [ln.strip() for ln in (stdout or "").splitlines() if ln.strip()]
    return out[-1] if out else ""


def run_local_one(run: RunSpec, timeout_s: float | None, python: str = sys.executable) -> RunOutcome:
    """Run one configuration as `python -m phantora.cli ...`; its output goes to <run dir>/run.log."""
    if run.out.exists():
        shutil.rmtree(run.out)
    run.out.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [python, "-m", "phantora.cli", *run.args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
        error = "" if rc == 0 else error_line(err, out) or f"exit status {rc}"
    except subprocess.TimeoutExpired as exc:
        rc = None
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        error = f"timed out after {timeout_s:g} s"
    wall = time.perf_counter() - t0
    write_log(run, out, err)
    return RunOutcome(run.index, "ok" if rc == 0 else "failed", rc, error, wall)


def write_log(run: RunSpec, stdout: str, stderr: str) -> None:
    """<run dir>/run.log: the command line, its stdout and its stderr."""
    cmd = " ".join(["python -m phantora.cli", *run.args])
    RunDir(run.out).write_text(S.RUN_LOG, f"$ {cmd}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")


def uses_ns3(args: Sequence[str]) -> bool:
    """Does this command line run the packet-level engine (`--network ns3`; every command defaults to flow)?"""
    return any(a == "ns3" and i and args[i - 1] == "--network" for i, a in enumerate(args))


def prebuild_ns3(runs: Sequence[RunSpec], say: Callable[[str], None]) -> None:
    """Bring the ns-3 fabric library up to date once, before parallel runs that would each rebuild it."""
    if not any(uses_ns3(r.args) for r in runs):
        return
    try:
        from phantora.netsim.packet import build, needs_build
    except ImportError:
        return
    if needs_build():
        say("building the ns-3 fabric library once before the runs")
        try:
            build()
        except PhantoraError as exc:
            say(f"warning: {exc}")


def run_local(
    runs: Sequence[RunSpec],
    jobs: int,
    timeout_s: float | None,
    on_done: Callable[[RunSpec, RunOutcome], None] | None = None,
) -> list[RunOutcome]:
    """Run every configuration on local cores, `jobs` at a time; a failure does not stop the others."""
    outcomes: dict[int, RunOutcome] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_local_one, r, timeout_s): r for r in runs}
        try:
            for fut in as_completed(futures):
                run = futures[fut]
                try:
                    res = fut.result()
                except Exception as exc:  # noqa: BLE001 - an OSError starting the process, a full disk ...
                    res = RunOutcome(run.index, "failed", None, f"{type(exc).__name__}: {exc}", 0.0)
                outcomes[run.index] = res
                if on_done:
                    on_done(run, res)
        except BaseException:  # ^C, SIGTERM (the CLI's Terminated): runs not started yet never start
            for fut in futures:
                fut.cancel()
            raise
    return [outcomes[r.index] for r in runs]
