"""Fork server for rank processes: import the heavy modules once, then fork one process per rank.

A rank started as a fresh interpreter spends 1.5-3 CPU s importing torch (and torch._dynamo, which
DDP and FSDP2 load) before it runs a line of the user's script; with many ranks on few cores that is
most of a short run. The launcher starts this server once per run (`python -m bridge.forkserver`),
naming the modules to preload. The server imports them and forks every rank from the warm
interpreter, so the imports are paid once and their pages are shared copy-on-write.

Protocol: a SOCK_SEQPACKET unix socket pair made by the launcher, one end inherited (`--fd`): there
is no address, so nothing else can connect. One JSON object per packet.

- launcher -> server: `{"rank": r, "module": m, "argv": [...], "env": {...}, "cwd": c, "log": path, "launcher": pid}`
  (`launcher`: the launcher's pid, which the child takes as its own launcher's: bridge/launcher_pid.py)
- server -> launcher: `{"pid": p}` once forked; `{"pid": p, "code": c}` when it has exited (the code
  as `subprocess` reports it, negative for a signal).

The objects each preload makes are moved out of the cyclic collector's passes (`gc.freeze`) as long as triton is
not loaded, so a forked rank's collections, the last one at its exit included, never walk them: at exit that
collection tore torch's heap down object by object, each page touched copied, about 0.6 CPU s a rank. Triton's
objects, and those of every preload from the one that loads it (phantora's runtime and torch._dynamo do), stay
collectable: triton's bindings (nanobind) print every instance of theirs still alive at exit as a leak, and a frozen
object is never collected (`RANK_PRELOAD` in phantora/launcher.py imports torch's own modules first).

The server exits when the launcher closes its end. Each forked rank gets SIGKILL when the server
dies, and the server when the launcher dies (`supervisor.spawn`), so nothing outlives a run.

A forked rank becomes a session leader (its own process group, as `supervisor.spawn` gives),
takes the log as stdout and stderr, its environment and working directory, and runs its module as
`__main__`. What an interpreter reads only at start-up (PYTHON* variables, and libgomp's OMP_*
when torch loads it) comes from the server's environment: the launcher gives it the environment
the ranks share.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import runpy
import select
import socket
import sys
from typing import Any

from bridge import launcher_pid
from bridge.supervisor import die_with_parent

MAX_PACKET = 1 << 20  # a request carries one environment: a few kB
START_TIMEOUT_S = 120.0  # a run waits this long for its first rank (the preloads: torch a few s, minutes under load)
UNFROZEN_FROM = "triton"  # the preloads are frozen until this module is loaded (nanobind's leak report at exit)


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.send(json.dumps(msg).encode())


def _reap(sock: socket.socket, children: set[int]) -> None:
    """Report every child that has exited."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in children:
            children.discard(pid)
            send(sock, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(sock: socket.socket) -> dict[str, Any] | None:
    """Fork a child per request; return the request in the child, None in the server when the launcher leaves."""
    children: set[int] = set()
    while True:
        _reap(sock, children)
        ready, _, _ = select.select([sock], [], [], 0.05)
        if not ready:
            continue
        data = sock.recv(MAX_PACKET)
        if not data:  # the launcher closed its end: the run is over
            return None
        job = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            return job
        children.add(pid)
        send(sock, {"pid": pid})


def become(job: dict[str, Any], server: int) -> None:
    """In the forked child: take the rank's session, output, directory, environment and argv."""
    os.setsid()
    die_with_parent(server)
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    if job.get("cwd"):
        os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    if "launcher" in job:
        launcher_pid.adopt(int(job["launcher"]))
    sys.argv = [job["module"], *job["argv"]]
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    if "numpy.random" in sys.modules:  # a fresh interpreter seeds numpy's global generator itself
        sys.modules["numpy.random"].seed()
    sys.modules.pop(job["module"], None)  # preloaded: run it afresh as __main__


def preload(names: str) -> None:
    """Import the comma-separated modules `names`, freezing their objects until triton is loaded."""
    for name in filter(None, names.split(",")):
        importlib.import_module(name)
        if UNFROZEN_FROM not in sys.modules:
            gc.collect()
            gc.freeze()


def run_forks(sock: socket.socket) -> int:
    """Serve one run on `sock`: in the server, return once the launcher leaves; in each rank, run its module."""
    server = os.getpid()
    job = serve(sock)
    if job is None:
        return 0
    become(job, server)
    runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bridge.forkserver", description=__doc__.splitlines()[0])
    ap.add_argument("--fd", type=int, required=True, help="the inherited end of the launcher's socket pair")
    ap.add_argument("--preload", default="", help="comma-separated modules to import before forking")
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    preload(args.preload)
    return run_forks(sock)


if __name__ == "__main__":
    sys.exit(main())
