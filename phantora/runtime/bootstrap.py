"""Rank entry point: `python -m phantora.runtime.bootstrap SCRIPT [ARGS...]` (the launcher runs it).

It connects to the coordinator, creates the rank's session, makes `phantora` the default
torch.distributed backend, enters the charging dispatch mode, patches the time functions, seeds the
program's generators (runtime/program_seed.py) and runs the user's script as `__main__`. At the end it
synchronises and reports the rank's results. Configuration comes from the environment the launcher sets
(see `Options.from_env`).
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import phantora.runtime.simcuda.preload  # noqa: F401 - first: it must load before torch
from bridge.client import PEER_LOST_EXIT
from phantora.errors import PhantoraError
from phantora.perfmodel.gpus import get_gpu
from phantora.procmem import return_freed_memory
from phantora.rank_options import Options
from phantora.runtime import (
    backend,
    gloo_store,
    gpu_threads,
    hostmem,
    hostwork,
    library_env,
    phantom_mode,
    program_seed,
    rank_exit,
    stop_stacks,
    storage,
    timepatch,
    torch_backports,
    triton_kernels,
    unsupported,
)
from phantora.runtime import session as _session
from phantora.runtime.compute import build_model, set_model
from phantora.runtime.session import RankSession


def _client(opts: Options) -> Any:
    if opts.network == "none":
        from phantora.runtime.nonet import NoNetworkClient

        return NoNetworkClient(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    from bridge.client import RankClient

    return RankClient.from_env()


def _rank_scenario(opts: Options, rank: int) -> Any:
    """This rank's part of the run's scenario (slow GPUs, step reports), or None without one."""
    if not opts.scenario:
        return None
    from phantora.runtime.rank_scenario import RankScenario

    return RankScenario.from_file(opts.scenario, rank, opts.start_ns)


def start_session(opts: Options | None = None, client: Any = None) -> tuple[RankSession, Any]:
    """Create and install this process's session; return it and the entered dispatch mode."""
    from phantora.runtime.dispatch import ChargeMode

    opts = opts or Options.from_env()
    model = build_model(
        opts.compute_model,
        get_gpu(opts.gpu),
        opts.launch_ns,
        perf_tables=opts.perf_tables,
        curves=opts.curves,
        public=opts.public_fit,
    )
    set_model(model)
    client = client if client is not None else _client(opts)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    s = RankSession(
        rank,
        world,
        client,
        model,
        trace_level=opts.trace,
        trace_steps=opts.trace_steps,
        out_dir=opts.out_dir,
        network=opts.network,
        report_every_us=opts.report_us,
        phantom=opts.phantom,
        start_ns=opts.start_ns,
        max_steps=opts.max_steps,
        scenario=_rank_scenario(opts, rank),
    )
    if opts.phantom:
        phantom_mode.enable()
    else:  # every tensor's data is in host memory: hold no freed data, and say so before the OOM killer acts
        return_freed_memory()
        hostmem.watch(rank, world)
        gloo_store.connect_lazily()  # a group's creation waits for no member (gloo_store.py)
    if opts.sim_cuda:
        from phantora.runtime.simcuda import device as simcuda

        simcuda.install(get_gpu(opts.gpu), int(os.environ.get("LOCAL_WORLD_SIZE", "1")), opts.phantom)
        if hostwork.enabled():  # host ops and PCIe copies timed on the target host (PHANTORA_HOST_COMPUTE=on)
            s.host = hostwork.from_env(get_gpu(opts.gpu))
            hostwork.install(_session.current)
        from phantora.runtime import autostep

        autostep.install()
        triton_kernels.install()
    torch_backports.install()
    storage.install()  # checkpoint I/O charged by a storage model, when the run sets one
    _session.install(s)
    backend.use_as_default()
    if not opts.phantom:
        gloo_store.keep_default_store()
    mode = ChargeMode(s)
    mode.__enter__()
    if opts.sim_cuda:  # a thread the program starts runs GPU work on its own current stream
        gpu_threads.install(mode, s.now)
    if opts.time_patch:
        timepatch.install(s.now)
    global _active_mode, _fork_hook
    if not _fork_hook:  # once per process, however many sessions it starts
        os.register_at_fork(after_in_child=_leave_in_forked_child)
        _fork_hook = True
    _active_mode = mode
    return s, mode


_active_mode: Any = None  # the entered ChargeMode of this process's session, if any
_fork_hook = False


def _leave_in_forked_child() -> None:
    """A process the rank forks (a DataLoader worker) does host work: plain torch ops, real time.

    It must not charge ops either: its copy of the bridge connection is not usable after fork, and
    a simulated GPU does not run the data pipeline."""
    if _active_mode is not None:
        _active_mode.detach()
        timepatch.uninstall()
        _session.install(None)


def end_session(s: RankSession, mode: Any) -> dict[str, Any]:
    """Make a held step mark, leave the mode, restore time, synchronise and report the results."""
    global _active_mode
    if "phantora.runtime.autostep" in sys.modules:  # installed with the simulated GPU
        sys.modules["phantora.runtime.autostep"].finish()
    _active_mode = None
    timepatch.uninstall()
    mode.__exit__(None, None, None)
    try:
        out = s.finish()
        gloo_store.hold_until_all_end()  # rank 0 serves the store while other pairs may still connect
        return out
    finally:
        s.client.close()
        _session.install(None)


def _user_frame(exc: BaseException) -> str:
    """The innermost traceback frame of the user's code, as 'file:line in func': outside installed packages
    if there is one, else in an installed framework (torchtitan, ...), never in torch or phantora."""
    ours = ("/phantora/", "/bridge/", "/site-packages/torch/")
    where = framework = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = frame.filename
        installed = "/site-packages/" in path
        if path.startswith("<") or any(part in path for part in ours) or ("/lib/python3" in path and not installed):
            continue
        if installed:
            framework = f"{path}:{frame.lineno} in {frame.name}"
        else:
            where = f"{path}:{frame.lineno} in {frame.name}"
    return where or framework


def _nothing() -> None:
    pass


_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def _peer_lost(exc: BaseException) -> bool:
    """Did gloo fail because the other end of a connection went away (a peer died first)?"""
    text = str(exc)
    return isinstance(exc, RuntimeError) and "gloo" in text and any(s in text for s in _PEER_LOST)


def fail(who: str, exc: BaseException, script: str | None = None, before_exit: Callable[[], None] = _nothing) -> None:
    """Print the failure of `who` ("rank 3", "the launching process") in one line, after the traceback of the user's
    code (none for phantora's own errors), call `before_exit`, and end the process."""
    explained = unsupported.explain(exc)  # torch's missing-kernel error, said in one line
    if not isinstance(exc, PhantoraError) or os.environ.get("PHANTORA_TRACEBACK") == "1":
        tb = exc.__traceback__
        if script is not None:  # start the traceback at the user's script, not in runpy and the bootstrap
            first = tb
            while first is not None and first.tb_frame.f_code.co_filename != script:
                first = first.tb_next
            tb = first or tb
        if explained is None:
            traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        else:  # the frames only: the dispatcher's message lists every backend of torch
            print("Traceback (most recent call last):", file=sys.stderr)
            traceback.print_tb(tb, file=sys.stderr)
    where = _user_frame(exc)
    at = f" (at {where})" if where else ""
    print(f"phantora: {who} failed{at}: {explained or f'{type(exc).__name__}: {exc}'}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    before_exit()
    os._exit(PEER_LOST_EXIT if _peer_lost(exc) else 1)  # others may be blocked in gloo; the supervisor stops them


def _handling(exc: SystemExit) -> str:
    """The error a `sys.exit` was called while handling, if any: a framework that catches the program's error, prints
    it and exits (hydra's `run_and_report`, many a `main`'s `except Exception: ...; sys.exit(1)`) is named by the exit's
    own line, the cause by this one: ", while handling RuntimeError: ... (at FILE:LINE in FUNC)"."""
    cause = exc.__context__
    if cause is None or exc.__suppress_context__ or isinstance(cause, SystemExit):
        return ""
    where = _user_frame(cause)
    text = unsupported.explain(cause) or f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
    return f", while handling {text}" + (f" (at {where})" if where else "")


def exit_with(who: str, exc: SystemExit, before_exit: Callable[[], None] = _nothing) -> None:
    """The script exited on purpose (sys.exit, argparse's error): no traceback, its own message (argparse has
    printed it; `sys.exit("text")` is printed here as Python would) and its own exit code."""
    code = exc.code if isinstance(exc.code, int) else 1
    if not isinstance(exc.code, int):
        print(exc.code, file=sys.stderr)
    where = _user_frame(exc)
    at = f" (at {where})" if where else ""
    print(f"phantora: {who} exited with code {code}{at}{_handling(exc)}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    before_exit()
    os._exit(code)


def _stop_on_thread_gpu_work(who: str) -> None:
    """A thread the program starts (`threading.Thread`) whose GPU work phantora cannot run (torch's missing-kernel
    error, `unsupported.explain`, or phantora's own error: a phantom value asked for) ends the rank on `fail`'s one
    line. Python's own hook would print the error and let the program go on without that work, its figures silently
    short of it; other errors in a thread keep Python's hook."""
    previous = threading.excepthook

    def hook(args: Any) -> None:
        exc = args.exc_value
        if isinstance(exc, PhantoraError) or (
            isinstance(exc, NotImplementedError) and unsupported.explain(exc) is not None
        ):
            fail(who, exc)
        previous(args)

    threading.excepthook = hook


def run_script(who: str, script: str, argv: list[str]) -> None:
    """Run `script` as `__main__`, with `argv` as its sys.argv and its folder first on sys.path; if it fails or exits
    non-zero, end the process with `who`'s one line (`fail`, `exit_with`)."""
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(script))
    library_env.set_defaults()  # libraries' switches that keep their GPU work on the program's thread
    _stop_on_thread_gpu_work(who)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            exit_with(who, exc)
    except BaseException as exc:  # noqa: BLE001
        fail(who, exc, script)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m phantora.runtime.bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = os.path.abspath(argv[0])
    rank = f"rank {os.environ.get('RANK', '?')}"
    stop_stacks.dump_stacks_when_stopped()  # stopped by the supervisor: where each thread stood, in the rank's log
    try:
        s, mode = start_session()
        program_seed.seed_process(rank)  # the program's own seeding, if any, comes later and wins
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure and exit
        fail(rank, exc)
        return 1
    run_script(rank, script, argv)
    try:
        end_session(s, mode)
    except BaseException as exc:  # noqa: BLE001
        fail(rank, exc)
    stop_stacks.quiet_when_stopped()  # its results are in: a stop while it tears down is no culprit
    return 0


if __name__ == "__main__":
    rank_exit.leave(main())  # not sys.exit: the interpreter's teardown of a forked rank costs 0.5 CPU s (rank_exit)
