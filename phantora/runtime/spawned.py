"""Programs that start their own ranks: `phantora run --spawn SCRIPT` (torch.multiprocessing.spawn / start_processes).

`python -m phantora.runtime.spawned SCRIPT [ARGS...]` (the launcher runs it) is the program's own process, the
launching process of a single host. It is no rank: its `torch.cuda` answers as that host (WORLD_SIZE = `--nproc`
simulated GPUs), and it runs the script as `__main__`. The processes it starts become the run's ranks
(phantora/runtime/spawned_rank.py):

- `torch.multiprocessing.spawn(fn, args, nprocs)` / `start_processes(...)`: process i is rank i before its
  program's main module is imported; `nprocs` must be the run's world: `--nproc`, else the count the program's
  source names (phantora/spawn_count.py), else one host's GPUs. If one fails, torch's join stops the others, and
  the launching process ends the run on one line naming the rank, the program's call and the rank's own error.
- Any other process of the spawn start method (`multiprocessing.get_context("spawn").Process`) becomes a rank at
  its `init_process_group(rank=R, world_size=W)`.

A spawn child's command line (`multiprocessing.spawn.get_command_line`) starts with phantora's set-up; torch starts
mp.spawn's processes one after the other, so the k-th command line built during the call is process k's.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import phantora.runtime.simcuda.preload  # noqa: F401 - first: it must load before torch
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import Options
from phantora.runtime import bootstrap, program_seed, spawned_rank
from phantora.runtime.spawned_rank import SpawnError, world
from phantora.runtime.unsupported import program_call

RANK_MODULE = "import phantora.runtime.spawned_rank as _rank;"  # first in a spawned child's `python -c` program
SEED = "_rank.program_seed.seed_process"  # a fresh interpreter's generators, before the main module (program_seed.py)
UNSUPPORTED_METHODS = ("forkserver",)  # its server imports the main module (and torch) before any preload


_spawned: list[int] = []  # the ranks started by mp.spawn / start_processes (once per run)
_started: list[int] = []  # every process started with the spawn method (each may become a rank)


_pending: list[tuple[int, int]] = []  # (index, nprocs) of the ranks whose processes start next, in order


def _preloading_command_line(orig: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """multiprocessing.spawn.get_command_line whose `-c` program first loads the simulated device's C++ part and, for
    a rank (the next of `_pending`: torch starts a spawn context's processes one after the other), makes the process
    that rank before the program's main module is imported (its `from torch.distributed import ...` then binds
    phantora's)."""

    @functools.wraps(orig)
    def get_command_line(**kwds: Any) -> list[str]:
        cmd = list(orig(**kwds))
        if "-c" in cmd:
            at = cmd.index("-c") + 1
            first = f"{RANK_MODULE} _rank.await_rank({os.getpid()}); {SEED}('process {len(_started)}'); "
            if _pending:
                index, nprocs = _pending.pop(0)
                first = f"{RANK_MODULE} _rank.become_rank({index}, {nprocs}); {SEED}('rank {index}'); "
            elif not _started:
                _watch_own_processes()
            _started.append(len(_started))
            cmd[at] = first + cmd[at]
        return cmd

    return get_command_line


def _check_start(call: str, nprocs: int, start_method: str) -> None:
    """One line if the program's start of its ranks cannot be the run's ranks."""
    if _spawned:
        raise SpawnError(f"{call} starts ranks a second time; a run's ranks are the processes the program starts once")
    if start_method in UNSUPPORTED_METHODS:
        raise SpawnError(
            f"{call} starts its ranks with start_method={start_method!r}, whose server imports the program before "
            "phantora's simulated GPU can load: use 'spawn' (torch.multiprocessing.spawn) or 'fork'"
        )
    if nprocs != world():
        raise SpawnError(
            f"{call} starts {nprocs} ranks on a host of {world()} GPUs (--nproc {world()}): run it with --nproc "
            f"{nprocs}, or let the program start one rank per GPU it sees (torch.cuda.device_count())"
        )


def _rank_failure(exc: BaseException, call: str) -> SpawnError:
    """torch's ProcessExitedException of a rank, as one line: the rank, how it ended, and its own last word."""
    index = int(getattr(exc, "error_index", -1))
    log = Path(os.environ.get("PHANTORA_LOG_DIR", ".")) / f"rank{index}.log"
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    verdict = next((ln for ln in reversed(lines) if ln.startswith("phantora: ")), lines[-1] if lines else "")
    said = f": {verdict.removeprefix('phantora: ')}" if verdict else ""
    return SpawnError(f"rank {index}, started by {call}, {_ended(exc)}; the other ranks were stopped{said}")


def _ended(exc: BaseException) -> str:
    """How a spawned process ended, from torch's exception ('exited with code 1', 'was killed by SIGKILL')."""
    code = getattr(exc, "exit_code", None)
    name = getattr(exc, "signal_name", None)
    if name:
        return f"was killed by {name}"
    return f"exited with code {code}" if code is not None else "failed"


def _start_processes(orig: Callable[..., Any]) -> Callable[..., Any]:
    """torch.multiprocessing.start_processes whose processes are the run's ranks."""
    from torch.multiprocessing.spawn import ProcessExitedException

    @functools.wraps(orig)
    def start_processes(
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> Any:
        call = program_call() or "torch.multiprocessing.spawn"
        _check_start(call, nprocs, start_method)
        _spawned.extend(range(nprocs))
        if start_method == "spawn":
            _pending[:] = [(i, nprocs) for i in range(nprocs)]
        rank_fn = functools.partial(spawned_rank.run_rank, fn, nprocs, os.getpid())
        try:
            context = orig(rank_fn, args, nprocs, join=False, daemon=daemon, start_method=start_method)
        finally:
            _pending.clear()
        _torch_ranks.update(p.pid for p in context.processes)
        if not join:
            return context
        try:
            while not context.join():
                pass
        except ProcessExitedException as exc:
            raise _rank_failure(exc, call) from None
        return None

    start_processes._phantora = True  # type: ignore[attr-defined]
    return start_processes


_torch_ranks: set[int] = set()  # the pids of mp.spawn's processes, which torch's join watches


def _watch_own_processes() -> None:
    """The processes the program starts itself (not mp.spawn's) may be ranks that nothing joins as torch's join does:
    one killed by a signal (the OOM killer's SIGKILL, say) ends the run at once, in one line, instead of leaving the
    others to the bridge's peer timeout. Exits are peeked at (WNOWAIT), never reaped: the program's own join reaps."""
    import multiprocessing.process
    import signal
    import threading
    import time

    def killed(p: Any) -> str | None:
        popen = getattr(p, "_popen", None)
        if popen is None or popen.returncode is not None or p.pid in _torch_ranks:
            return None
        try:
            info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if info is None or info.si_code not in (os.CLD_KILLED, os.CLD_DUMPED):
            return None
        return signal.Signals(info.si_status).name

    def watch() -> None:
        while True:
            for p in list(multiprocessing.process._children):  # type: ignore[attr-defined]
                name = killed(p)
                if name is not None:
                    print(
                        f"phantora: process {p.pid} ({p.name}) that the program started was killed by {name}; "
                        "the run was stopped",
                        file=sys.stderr,
                        flush=True,
                    )
                    spawned_rank._stop_the_run()
                    os._exit(1)
            time.sleep(0.2)

    threading.Thread(target=watch, name="phantora-process-watch", daemon=True).start()


def install_parent() -> None:
    """In the launching process: torch.cuda as its host, mp.spawn / start_processes starting ranks."""
    import importlib
    import multiprocessing.spawn

    import torch.multiprocessing

    tmp_spawn = importlib.import_module("torch.multiprocessing.spawn")  # the module (the package's `spawn` is mp.spawn)

    os.environ["PHANTORA_HOST_PORT"] = os.environ.get("MASTER_PORT", "")  # the run's; the program may set its own
    opts = Options.from_env()
    if opts.sim_cuda:
        from phantora.runtime.simcuda import device as simcuda

        simcuda.install(get_gpu(opts.gpu), world(), opts.phantom)
        cmdline = multiprocessing.spawn.get_command_line
        if not getattr(cmdline, "_phantora", False):
            patched = _preloading_command_line(cmdline)
            patched._phantora = True  # type: ignore[attr-defined]
            multiprocessing.spawn.get_command_line = patched  # type: ignore[assignment]
    if not getattr(tmp_spawn.start_processes, "_phantora", False):
        wrapped = _start_processes(tmp_spawn.start_processes)
        tmp_spawn.start_processes = wrapped  # type: ignore[attr-defined,unused-ignore]  # mp.spawn calls it so
        torch.multiprocessing.start_processes = wrapped  # type: ignore[attr-defined,unused-ignore]


NO_RANKS = (
    "the program started no ranks: with --spawn, phantora runs the script once and its ranks are the processes it "
    "starts (torch.multiprocessing.spawn or start_processes, or processes of the spawn method that call "
    "init_process_group); a script that reads RANK and WORLD_SIZE (torchrun style) runs without --spawn"
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m phantora.runtime.spawned SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    who = "the launching process"
    script = os.path.abspath(argv[0])
    try:
        install_parent()
        program_seed.seed_process("launching process")  # a fork-method rank inherits these, as under torch
    except BaseException as exc:  # noqa: BLE001
        bootstrap.fail(who, exc)
        return 1
    bootstrap.run_script(who, script, argv)
    if not _spawned and not _started:
        print(f"phantora: {NO_RANKS}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":  # run as the module itself, so its rank entry pickles by its importable name
    from phantora.runtime import spawned

    sys.exit(spawned.main())
