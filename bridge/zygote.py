"""Fork servers kept across runs (zygotes): the ranks' imports paid once for many runs.

Each run forks its ranks from a fork server (bridge/forkserver.py) that first imports torch and the rest of the
rank preloads: 5-6 CPU s a run, most of a short run's cost, paid again by every point of a sweep and every live run
of the test suite. A zygote imports them once and listens on a unix socket; each run that connects gets a fork of
it that is exactly that run's fork server (the same protocol on the connection, the same ranks), so a run cannot
tell the two apart, but for the time it saves.

The run's coordinator and network server are forked the same way, from zygotes whose preload is their module
(bridge/warm_start.py): a zygote serves one start-up, whatever it preloads.

- **Home.** Zygotes live in a private directory (mode 0700) named by `PHANTORA_ZYGOTE`, made by their owner
  (`ZygoteHome`: the test session, `phantora sweep`). Without it every run starts its own fork server, as before.
- **Key.** A run connects only to a zygote started with its fork server's own python, preloads and start-up
  environment (what an interpreter and the preloads read at import), hashed into the socket's name. A run that
  differs in any of them starts (or finds) another zygote. `KEY_IGNORES` are left out: pytest's per-test
  `PYTEST_CURRENT_TEST` and a recorded run's own `PHANTORA_RECORD_DIR`, which nothing reads at import. The working
  directory is part of the key only where it could matter (`run_server`, `shadows`).
- **Trust.** The socket is in the owner's private directory, and a zygote serves only its own user's peers
  (SO_PEERCRED).
- **Lifetime.** A zygote exits when its owner's process does (a pidfd, at once), when the home's `close` stops it,
  or after its home's idle time without a run (`IDLE_S`; it first unlinks its socket, so a run that comes later
  starts another; the test session's home: never). A run's fork server dies with its zygote and leaves with its
  launcher; its ranks die with it, as without a zygote. Waiting, a zygote sleeps in `select` on its socket and
  pidfds (no polling).

Protocol on a connection: launcher -> `{"log": path, "cwd": dir}` (the run's fork server log and directory); zygote's
fork -> `{"server": pid, "modules": [...]}` (the top-level modules imported); then bridge/forkserver.py's requests
and replies.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.errors import BridgeError
from bridge.forkserver import MAX_PACKET, START_TIMEOUT_S, preload, run_forks, send
from bridge.supervisor import die_with_parent

HOME_ENV = "PHANTORA_ZYGOTE"  # the directory of the zygotes a run may use
OWNER_FILE = "owner"  # the pid of the home's owner: its zygotes exit with it
IDLE_FILE = "idle_s"  # how long the home's zygotes stay unused before they exit (`inf`: until the owner does)
# Read by nothing at import: pytest's per-test name, and a recorded run's directory (phantora/egraph/live.py: each
# recorded run names its own, read by its ranks' wrapper from their own environment, record_script.py's main)
KEY_IGNORES = frozenset({"PYTEST_CURRENT_TEST", "PHANTORA_RECORD_DIR"})
IDLE_S = 30.0  # a zygote no run has used for this long exits
HELLO_TIMEOUT_S = 10.0  # a fork waits this long for its launcher's first message
CLOSE_WAIT_S = 5.0  # a home's close gives its zygotes this long to exit on SIGTERM, then SIGKILLs them
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def key(python: str, preloads: Sequence[str], env: Mapping[str, str], cwd: str) -> str:
    """The name of the zygote that can serve a fork server of these: the same start-up, hashed."""
    startup = sorted((k, v) for k, v in env.items() if k not in KEY_IGNORES)
    text = json.dumps([python, list(preloads), cwd, startup])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class ZygoteHome:
    """A private directory of zygotes owned by this process, named in `PHANTORA_ZYGOTE` while it is open.

    `with ZygoteHome():` around runs (in this process or its children) lets them share zygotes; leaving it stops
    them and removes the directory. Its zygotes exit after `idle_s` without a run (`math.inf`: only with the owner
    or at `close`)."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        if not idle_s > 0:
            raise ValueError(f"ZygoteHome: idle_s must be positive, not {idle_s}")
        self.path = Path(tempfile.mkdtemp(prefix="phantora-zygote-"))  # mode 0700
        (self.path / OWNER_FILE).write_text(str(os.getpid()))
        (self.path / IDLE_FILE).write_text(repr(float(idle_s)))
        self._before = os.environ.get(HOME_ENV)
        os.environ[HOME_ENV] = str(self.path)

    def __enter__(self) -> ZygoteHome:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pids(self) -> list[int]:
        """The zygotes started in this home that still have their pid file."""
        out = []
        for f in self.path.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                out.append(int(f.read_text()))
        return out

    def close(self) -> None:
        """Stop the home's zygotes (their runs' fork servers and ranks die with them) and remove it."""
        if self._before is None:
            os.environ.pop(HOME_ENV, None)
        else:
            os.environ[HOME_ENV] = self._before
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for pid in pids:  # reaped here if this process started it (its CPU then counts as this process's children's)
            _reap_within(pid, deadline)
        shutil.rmtree(self.path, ignore_errors=True)


def _reap_within(pid: int, deadline: float) -> None:
    """Reap the child `pid`, told to exit, by `deadline`; then SIGKILL it (a stopped zygote holds a SIGTERM until it
    is resumed: a close that waited for it hung) and reap it. Nothing if it is not this process's child."""
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.01)
    except ChildProcessError:
        pass


def usable_home(env: Mapping[str, str]) -> Path | None:
    """The zygote home named in `env`, if it is a directory only its owner (this user) can enter."""
    name = env.get(HOME_ENV)
    if not name:
        return None
    path = Path(name)
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def _bind(path: Path) -> socket.socket | None:
    """A listening socket at `path`, or None if a live zygote already listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(str(path))
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:  # a dead zygote's socket: take its place
            path.unlink(missing_ok=True)
            sock.bind(str(path))
        else:
            sock.close()
            return None
        finally:
            probe.close()
    sock.listen(64)
    return sock


def _same_user(conn: socket.socket) -> bool:
    _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid == os.getuid()


def _fork_for(conn: socket.socket, children: dict[int, int]) -> bool:
    """Fork a run's fork server for `conn`; True in that fork (which closes the zygote's pidfds of the others)."""
    if not _same_user(conn):
        conn.close()
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd in children:
            os.close(fd)
        children.clear()
        return True
    children[os.pidfd_open(pid)] = pid
    conn.close()
    return False


def serve_runs(sock: socket.socket, path: Path, owner: int, idle_s: float = IDLE_S) -> socket.socket | None:
    """Accept runs until the owner is gone or `idle_s` pass with no run (`math.inf`: never); return a run's
    connection in its fork. It sleeps until a run connects, the owner or a run's fork server exits, or the idle
    limit (every one a pidfd or the socket in one `select`): an idle zygote takes no CPU."""
    children: dict[int, int] = {}  # a pidfd of each live fork server: its pid
    owner_fd = os.pidfd_open(owner)
    last = time.monotonic()
    while True:
        timeout = None if children or math.isinf(idle_s) else max(0.0, last + idle_s - time.monotonic())
        ready, _, _ = select.select([sock.fileno(), owner_fd, *children], [], [], timeout)
        if owner_fd in ready:
            return None
        for fd in [fd for fd in ready if fd in children]:  # a run's fork server left: reap it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(children.pop(fd), 0)
            os.close(fd)
            last = time.monotonic()
        if sock.fileno() in ready:
            conn, _ = sock.accept()
            last = time.monotonic()
            if _fork_for(conn, children):
                break
        elif not children and time.monotonic() - last >= idle_s:
            path.unlink(missing_ok=True)  # later runs start another zygote; serve those already queued
            sock.setblocking(False)
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                return None
            conn.setblocking(True)
            if _fork_for(conn, children):
                break
    sock.close()
    os.close(owner_fd)
    return conn


def become_run_server(conn: socket.socket, zygote: int) -> None:
    """In a zygote's fork: a session of its own, dying with the zygote, output to the run's fork server log, in the
    run's working directory; it tells the launcher its pid and the top-level modules the preloads imported."""
    os.setsid()
    die_with_parent(zygote)
    conn.settimeout(HELLO_TIMEOUT_S)
    hello: dict[str, Any] = json.loads(conn.recv(MAX_PACKET) or b"{}")
    conn.settimeout(None)
    if "log" not in hello:
        os._exit(2)
    log = os.open(hello["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(hello.get("cwd") or ".")
    send(conn, {"server": os.getpid(), "modules": sorted({name.partition(".")[0] for name in sys.modules})})


def shadows(where: str, modules: Collection[str]) -> bool:
    """Whether `where` holds a file or directory named as one of `modules`: a fork server started there has it
    first on its path (`python -m`), so that module could have come from there instead."""
    try:
        names = os.listdir(where)
    except OSError:
        return True
    return any(n.partition(".")[0] in modules for n in names)


def _start(
    path: Path, home: Path, python: str, preloads: Sequence[str], env: Mapping[str, str], cwd: str
) -> subprocess.Popen[bytes]:
    """Start the zygote of `path` in its own session: it outlives this launcher, not the home's owner."""
    owner = (home / OWNER_FILE).read_text().strip()
    cmd = [python, "-m", "bridge.zygote", "--listen", str(path), "--owner", owner, "--preload", ",".join(preloads)]
    with contextlib.suppress(FileNotFoundError):  # a home made before IDLE_FILE: the default
        cmd += ["--idle-s", (home / IDLE_FILE).read_text().strip()]
    with open(path.with_suffix(".log"), "ab") as log:
        return subprocess.Popen(
            cmd, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _failed(path: Path, started: subprocess.Popen[bytes]) -> BridgeError:
    tail = path.with_suffix(".log").read_text(errors="replace")[-3000:]
    return BridgeError(
        f"the fork server (zygote {path.stem}, pid {started.pid}) exited with code {started.returncode} "
        f"during start-up:\n{tail}"
    )


def _connect(
    path: Path, start: Callable[[], subprocess.Popen[bytes]], deadline: float
) -> tuple[socket.socket, subprocess.Popen[bytes] | None]:
    """A connection to the zygote at `path`, and the zygote if `start()` had to start it (none listened)."""
    started: subprocess.Popen[bytes] | None = None
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(str(path))
            return sock, started
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
        if started is None:
            started = start()
        elif started.poll() not in (None, 0):  # 0: another zygote of this key took the socket
            raise _failed(path, started)
        if time.monotonic() > deadline:
            raise BridgeError(f"no zygote listened at {path} within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.02)


def _served(
    home: Path, name: str, start: Callable[[], subprocess.Popen[bytes]], run_cwd: str, log_path: Path, quiet: bool
) -> tuple[int, socket.socket, list[str]] | None:
    """A fork server forked by the zygote `name` (started by `start` if none listens): its pid, socket and the
    modules the zygote imported. A zygote this run started that died first is named (its log says why), or with
    `quiet` gives None."""
    path = home / f"{name}.sock"
    deadline = time.monotonic() + START_TIMEOUT_S
    for _ in range(2):  # a zygote that stops idle may drop a connection it never accepted: then start another
        sock, started = _connect(path, start, deadline)
        sock.settimeout(max(0.1, deadline - time.monotonic()))  # the zygote may still be importing
        try:
            # the log's path as the launcher means it: the zygote's fork opens it before it enters the run's directory
            sock.send(json.dumps({"log": os.path.abspath(log_path), "cwd": run_cwd}).encode())
            data = sock.recv(MAX_PACKET)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        except TimeoutError:
            sock.close()
            raise BridgeError(f"the zygote at {path} forked no fork server within {START_TIMEOUT_S:.0f} s") from None
        if data:
            sock.settimeout(None)
            reply = json.loads(data)
            return int(reply["server"]), sock, list(reply["modules"])
        sock.close()
        if started is not None:  # the zygote this run started closed it: it died (its imports failed)
            with contextlib.suppress(subprocess.TimeoutExpired):
                started.wait(timeout=5.0)
            if started.returncode not in (None, 0):
                if quiet:
                    return None
                raise _failed(path, started)
    raise BridgeError(f"the zygote at {path} closed every connection before serving it")


def run_server(
    home: Path, python: str, preloads: Sequence[str], env: Mapping[str, str], cwd: str | None, log_path: Path
) -> tuple[int, socket.socket]:
    """A fork server for one run, forked by the zygote of its start-up (started if there is none): its pid, socket.

    The zygote of no directory (started in the home, which holds no module) serves the runs whose directory holds
    nothing named as a module it imported (`shadows`) and whose PYTHONPATH names no relative directory: a fork
    server started in their directory would have imported the same files. Any other run gets the zygote of its
    directory, started there."""
    where = cwd or os.getcwd()
    paths = env.get("PYTHONPATH", "")
    relative = bool(paths) and not all(os.path.isabs(p) for p in paths.split(os.pathsep))  # "": the directory
    if not relative and not shadows(where, {name.partition(".")[0] for name in preloads}):
        name = key(python, preloads, env, "")
        start = lambda: _start(home / f"{name}.sock", home, python, preloads, env, str(home))  # noqa: E731
        got = _served(home, name, start, where, log_path, quiet=True)
        if got is not None and not shadows(where, got[2]):
            return got[0], got[1]
        if got is not None:
            got[1].close()  # its fork server leaves with the connection
    name = key(python, preloads, env, where)
    path = home / f"{name}.sock"
    got = _served(home, name, lambda: _start(path, home, python, preloads, env, where), where, log_path, quiet=False)
    assert got is not None
    return got[0], got[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bridge.zygote", description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=Path, required=True, help="the socket to listen on, in a zygote home")
    ap.add_argument("--owner", type=int, required=True, help="the home owner's pid: the zygote exits with it")
    ap.add_argument("--preload", default="", help="comma-separated modules to import before forking")
    ap.add_argument("--idle-s", type=float, default=IDLE_S, help="exit after this long without a run (inf: never)")
    args = ap.parse_args(argv)
    sock = _bind(args.listen)
    if sock is None:
        return 0  # another zygote of this key was started at the same time
    zygote, pid_file = os.getpid(), args.listen.with_suffix(".pid")
    pid_file.write_text(str(zygote))
    preload(args.preload)
    conn = serve_runs(sock, args.listen, args.owner, args.idle_s)
    if conn is None:
        pid_file.unlink(missing_ok=True)
        return 0
    become_run_server(conn, zygote)
    return run_forks(conn)


if __name__ == "__main__":
    sys.exit(main())
