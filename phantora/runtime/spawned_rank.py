"""A process the program's launching process starts (phantora/runtime/spawned.py) becoming a rank of the run.

Its `python -c` command line imports this module first, before the program's main module (and torch): the simulated
CUDA device's C++ part loads, then

- `become_rank(i, n)` for process i of `torch.multiprocessing.spawn` / `start_processes`: RANK and LOCAL_RANK = i,
  its log, its session (clock, bridge connection, simulated cuda:i, the phantora backend), so the main module's
  `from torch.distributed import init_process_group` binds phantora's; `run_rank` then runs `fn(i, *args)` (a fork
  start method's process becomes the rank there);
- `await_rank(parent)` for any other process started with the spawn method (`multiprocessing.get_context("spawn")
  .Process(target=...)`): its torch.cuda answers as the host; it becomes a rank when it calls
  `init_process_group(rank=R, world_size=W)` (or RANK / WORLD_SIZE), and its session ends as its target returns.

The rendezvous the program names on its own host (`MASTER_ADDR=localhost`, a fixed `MASTER_PORT`) is served on the
run's private port, so two runs on one machine never meet (`_private_loopback`). A rank that fails says so in one
line; a rank of `await_rank` then stops its process group (the launching process and every rank), as nothing
joins it the way torch's `mp.spawn` does, and the launcher names the rank from its log.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import phantora.runtime.simcuda.preload  # noqa: F401 - first: it must load before torch
from phantora.errors import PhantoraError
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import Options
from phantora.runtime import bootstrap, death_signal, program_seed

LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0")  # the rendezvous addresses of the program's own host


class SpawnError(PhantoraError):
    """The program starts its ranks in a way this run cannot follow; the message says what to do."""


def world() -> int:
    """The run's world size: the GPUs of the launching process's host (`--nproc`)."""
    return int(os.environ["WORLD_SIZE"])


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
_owner: list[int] = []  # the pid that became the rank (a process it forks, a DataLoader worker, is none)


def _is_rank() -> bool:
    return bool(_session) and _owner == [os.getpid()]


def become_rank(index: int, nprocs: int) -> None:
    """Make this process rank `index` of `nprocs`: its environment, its log, its session (clock, bridge, simulated
    cuda devices, the phantora backend). A spawned process does it first thing; a forked one as it starts `fn`."""
    rank = str(index)
    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs))
    _own_log(index)
    try:
        _session[:] = bootstrap.start_session()
        _owner[:] = [os.getpid()]
        _private_loopback()
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure and exit
        bootstrap.fail(f"rank {rank}", exc)


def _die_with_parent(parent: int) -> None:
    """SIGKILL this rank when its launching process `parent` (a pid) dies, or now if it already has (death_signal):
    torch's own death signal for mp.spawn's processes is SIGINT, which a process started with SIGINT ignored (a
    background job's) never sees."""
    death_signal.die_with_parent(parent, signal.SIGKILL)


def run_rank(fn: Callable[..., Any], nprocs: int, parent: int, index: int, *args: Any) -> None:
    """In a process the launching process `parent` (its pid) started: as rank `index` of `nprocs`, run
    `fn(index, *args)`, then report."""
    rank = str(index)
    _die_with_parent(parent)  # after torch's _wrap set its own
    if not _is_rank():  # forked (a spawned process became the rank as it started)
        become_rank(index, nprocs)
        program_seed.seed_forked(f"rank {index}")
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


def _rank_and_world(orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    """The rank and world size an init_process_group call names (its arguments, else RANK / WORLD_SIZE)."""
    bound = inspect.signature(orig).bind_partial(*args, **kwargs).arguments
    rank, size = int(bound.get("rank", -1)), int(bound.get("world_size", -1))
    rank = int(os.environ.get("RANK", -1)) if rank < 0 else rank
    size = world() if size < 0 else size
    if size != world():
        raise SpawnError(
            f"init_process_group(world_size={size}) on a host of {world()} GPUs (--nproc {world()}): run it with "
            f"--nproc {size}"
        )
    if not 0 <= rank < size:
        raise SpawnError(f"init_process_group in a process the program started names no rank (rank={rank}): pass rank=")
    return rank, size


def await_rank(parent: int) -> None:
    """In a process started with the spawn method outside mp.spawn by the process `parent` (its pid): the host's
    torch.cuda now, a rank at its init_process_group, its session ended (or its failure said, and the run stopped) as
    its target ends."""
    import multiprocessing.process

    import torch
    import torch.distributed as dist

    _die_with_parent(parent)
    opts = Options.from_env()
    if opts.sim_cuda:
        from phantora.runtime.simcuda import device as simcuda

        simcuda.install(get_gpu(opts.gpu), world(), opts.phantom)
    c10d = dist.distributed_c10d
    orig = c10d.init_process_group

    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if _is_rank():  # phantora's own init_process_group, which wraps this one, calling through
            return orig(*args, **kwargs)
        try:
            rank, size = _rank_and_world(orig, args, kwargs)
        except SpawnError as exc:
            bootstrap.fail(f"process {os.getpid()}, started by the program,", exc, None, _stop_the_run)
        device = torch.cuda.current_device()  # set by the program before it joined (torch.cuda.set_device(rank))
        become_rank(rank, size)
        torch.cuda.set_device(device)
        return c10d.init_process_group(*args, **kwargs)

    for mod in (c10d, dist):
        mod.init_process_group = init_process_group  # type: ignore[attr-defined,unused-ignore]
    process = multiprocessing.process.BaseProcess
    process.run = _run_as_rank(process.run)  # type: ignore[method-assign,assignment]


def _stop_the_run() -> None:
    """Stop every process of the launching process's group (it and its ranks), this one last."""
    if threading.current_thread() is threading.main_thread():  # a watching thread's process dies with the rest
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except OSError:
        pass


def _run_as_rank(run: Callable[[Any], None]) -> Callable[[Any], None]:
    """multiprocessing's Process.run: the target; then, in a process that became a rank, its report or failure."""

    @functools.wraps(run)
    def run_target(self: Any) -> None:
        try:
            run(self)
        except SystemExit as exc:
            if _is_rank() and exc.code not in (None, 0):
                bootstrap.exit_with(f"rank {os.environ['RANK']}", exc, _stop_the_run)
            raise
        except BaseException as exc:
            if not _is_rank():
                raise
            script = getattr(sys.modules.get("__mp_main__"), "__file__", None)
            bootstrap.fail(f"rank {os.environ['RANK']}", exc, script, _stop_the_run)
        if _is_rank():
            try:
                bootstrap.end_session(*_session)
            except BaseException as exc:  # noqa: BLE001
                bootstrap.fail(f"rank {os.environ['RANK']}", exc, None, _stop_the_run)

    return run_target
