"""Running sweep points as local processes: one run's spec and outcome, its log, and the pool of local runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bridge.zygote import ZygoteHome
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


WARNING = "phantora: warning: "  # how a run's warnings start on its stderr (phantora.netsim.engine_warnings)
OnLine = Callable[[RunSpec, str], None]  # (the run, a line it printed: a warning, a progress line), as it prints it
PROGRESS = "[phantora] "  # how a run's own progress lines start, on either stream (phantora.progress, run's steps)


def run_local_one(
    run: RunSpec,
    timeout_s: float | None,
    python: str = sys.executable,
    on_warning: OnLine | None = None,
    on_progress: OnLine | None = None,
) -> RunOutcome:
    """Run one configuration as `python -m phantora.cli ...`; its output goes to <run dir>/run.log, each warning
    line of its stderr to `on_warning` as it comes (an engine's, when it is built), and each of its own progress
    lines (a live run's finished steps, the network's clock) to `on_progress`, without the prefix."""
    if run.out.exists():
        shutil.rmtree(run.out)
    run.out.mkdir(parents=True)
    t0 = time.perf_counter()

    def each_out(line: str) -> None:
        if on_progress is not None and line.startswith(PROGRESS):
            on_progress(run, line[len(PROGRESS) :].rstrip("\n"))

    def each(line: str) -> None:
        if on_warning is not None and line.startswith(WARNING):
            on_warning(run, line[len(WARNING) :].rstrip("\n"))
        each_out(line)

    rc, out, err = _run_reading([python, "-m", "phantora.cli", *run.args], timeout_s, each, each_out)
    if rc is None:
        error = f"timed out after {timeout_s:g} s"
    else:
        error = "" if rc == 0 else error_line(err, out) or f"exit status {rc}"
    wall = time.perf_counter() - t0
    write_log(run, out, err)
    return RunOutcome(run.index, "ok" if rc == 0 else "failed", rc, error, wall)


def _run_reading(
    cmd: list[str],
    timeout_s: float | None,
    each_err: Callable[[str], None],
    each_out: Callable[[str], None] | None = None,
) -> tuple[int | None, str, str]:
    """(exit code, None if killed at `timeout_s`; stdout; stderr) of `cmd`, each stderr line given to `each_err` and
    each stdout line to `each_out` as it comes (a thread a stream, so neither pipe fills). A callback that raises is
    called no more, its stream still read to the end (a pipe left full would hold the run up), and its error raised
    once the run ended."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, errors="replace"
    )
    got: dict[str, list[str]] = {"out": [], "err": []}
    broke: list[BaseException] = []  # a callback's error

    def pump(stream: IO[str], into: list[str], each: Callable[[str], None] | None) -> None:
        for line in stream:
            into.append(line)
            if each is not None:
                try:
                    each(line)
                except Exception as exc:  # noqa: BLE001 - raised in the caller's thread, after the run
                    broke.append(exc)
                    each = None

    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=pump, args=(proc.stdout, got["out"], each_out), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, got["err"], each_err), daemon=True),
    ]
    for t in pumps:
        t.start()
    try:
        rc: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    except BaseException:  # ^C, SIGTERM: the run ends with the sweep
        proc.kill()
        proc.wait()
        raise
    for t in pumps:
        t.join(timeout=10)
    if broke:
        raise broke[0]
    return rc, "".join(got["out"]), "".join(got["err"])


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
    on_warning: OnLine | None = None,
    on_progress: OnLine | None = None,
) -> list[RunOutcome]:
    """Run every configuration on local cores, `jobs` at a time; a failure does not stop the others. `on_warning`,
    `on_progress`: given each warning and progress line a run prints, as it prints it (`run_local_one`). The runs
    fork their fork servers from zygotes kept for the sweep (bridge/zygote.py): a live run's rank imports are paid
    once per start-up."""
    outcomes: dict[int, RunOutcome] = {}
    with ZygoteHome(), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {
            pool.submit(run_local_one, r, timeout_s, on_warning=on_warning, on_progress=on_progress): r for r in runs
        }
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
