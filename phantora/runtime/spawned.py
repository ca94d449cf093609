"""Programs that start their own ranks: `phantora run --spawn SCRIPT` (torch.multiprocessing.spawn / start_processes).

`python -m phantora.runtime.spawned SCRIPT [ARGS...]` (the launcher runs it) is the program's own process, the
launching process of a single host. It is no rank: its `torch.cuda` answers as that host (LOCAL_WORLD_SIZE
simulated GPUs), and it runs the script as `__main__`. When the script calls `torch.multiprocessing.spawn(fn,
args, nprocs)` or `start_processes(...)`, torch starts the processes as it does on a GPU host, and each one, process
index i, becomes rank i of the run before `fn(i, *args)` runs: RANK, LOCAL_RANK = i, its own session (clock, bridge
connection, simulated cuda:i), its output in logs/rank<i>.log, its steps and trace in the run directory.

- A child of the spawn start method is a fresh interpreter: its command line imports the simulated CUDA device's
  C++ part before the program's main module imports torch (`_preloading_command_line`).
- The rendezvous the program names on its own host (`MASTER_ADDR=localhost`, a fixed `MASTER_PORT`) is served on
  the run's private port, so two runs on one machine never meet (`_private_loopback`).
- A rank that fails ends its own process with phantora's one line in its log; torch's join in the launching
  process stops the others, and the launching process ends the run with that line, naming the rank.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import phantora.runtime.simcuda.preload  # noqa: F401 - first: it must load before torch
from phantora.errors import PhantoraError
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import Options
from phantora.runtime import bootstrap
from phantora.runtime.unsupported import program_call

PRELOAD = "import phantora.runtime.simcuda.preload; "  # prefixed to a spawned child's `python -c` program
LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0")  # the rendezvous addresses of the program's own host
UNSUPPORTED_METHODS = ("forkserver",)  # its server imports the main module (and torch) before any preload


class SpawnError(PhantoraError):
    """The program starts its ranks in a way this run cannot follow; the message says what to do."""


_spawned: list[int] = []  # the ranks started (once per run)


def world() -> int:
    """The run's world size: the GPUs of the launching process's host (`--nproc`)."""
    return int(os.environ["WORLD_SIZE"])


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
            first = PRELOAD
            if _pending:
                index, nprocs = _pending.pop(0)
                first = f"import phantora.runtime.spawned as _rank; _rank.become_rank({index}, {nprocs}); "
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
        rank_fn = functools.partial(run_rank, fn, nprocs)
        try:
            context = orig(rank_fn, args, nprocs, join=False, daemon=daemon, start_method=start_method)
        finally:
            _pending.clear()
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


def _private_loopback() -> None:
    """init_process_group's env:// rendezvous on the program's own host (MASTER_ADDR localhost, the program's fixed
    MASTER_PORT) meets on the run's private port (PHANTORA_HOST_PORT), as each simulated host has its own ports."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    orig = c10d.init_process_group

    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        port = os.environ.get("PHANTORA_HOST_PORT")
        if port and os.environ.get("MASTER_ADDR", "localhost") in LOOPBACK:
            os.environ["MASTER_PORT"] = port
        return orig(*args, **kwargs)

    for mod in (c10d, dist):
        mod.init_process_group = init_process_group  # type: ignore[attr-defined,unused-ignore]


def _own_log(rank: int) -> None:
    """This rank's output (fds 1 and 2) to logs/rank<rank>.log, fresh, as the launcher gives its own ranks."""
    log_dir = os.environ.get("PHANTORA_LOG_DIR")
    if not log_dir:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(Path(log_dir) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


_session: list[Any] = []  # this process's rank session and dispatch mode, once it became a rank


def become_rank(index: int, nprocs: int) -> None:
    """Make this process rank `index` of `nprocs`: its environment, its log, its session (clock, bridge, simulated
    cuda devices, the phantora backend). A spawned process does it first thing; a forked one as it starts `fn`."""
    rank = str(index)
    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs))
    _own_log(index)
    try:
        _session[:] = bootstrap.start_session()
        _private_loopback()
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure and exit
        bootstrap.fail(f"rank {rank}", exc)


def run_rank(fn: Callable[..., Any], nprocs: int, index: int, *args: Any) -> None:
    """In a process the program started: as rank `index` of `nprocs`, run `fn(index, *args)`, then report."""
    rank = str(index)
    if not _session:
        become_rank(index, nprocs)
    s, mode = _session
    script = getattr(sys.modules.get("__mp_main__"), "__file__", None)
    try:
        fn(index, *args)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            bootstrap.exit_with(f"rank {rank}", exc)
    except BaseException as exc:  # noqa: BLE001
        bootstrap.fail(f"rank {rank}", exc, script)
    try:
        bootstrap.end_session(s, mode)
    except BaseException as exc:  # noqa: BLE001
        bootstrap.fail(f"rank {rank}", exc)


NO_RANKS = (
    "the program started no ranks: with --spawn, phantora runs the script once and its ranks are the processes it "
    "starts with torch.multiprocessing.spawn or start_processes; a script that reads RANK and WORLD_SIZE (torchrun "
    "style) runs without --spawn"
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
    except BaseException as exc:  # noqa: BLE001
        bootstrap.fail(who, exc)
        return 1
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            bootstrap.exit_with(who, exc)
    except BaseException as exc:  # noqa: BLE001
        bootstrap.fail(who, exc, script)
    if not _spawned:
        print(f"phantora: {NO_RANKS}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":  # run as the module itself, so its rank entry pickles by its importable name
    from phantora.runtime import spawned

    sys.exit(spawned.main())
