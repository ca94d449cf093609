"""The launcher's side of the fork server (`bridge/forkserver.py`): start it, ask it for ranks, follow them.

A forked rank is not the launcher's child, so it is followed through `ForkedProc`, which has the
part of `subprocess.Popen` that the supervisor uses (`pid`, `returncode`, `poll`, `wait`, `kill`); so is a fork
server forked by a zygote (`ZygoteForkProc`, bridge/zygote.py).
Exit codes come from the server; if the server itself is gone, its ranks died with it (SIGKILL on
parent death), and a rank is done once its pid has left /proc.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bridge import zygote
from bridge.errors import BridgeError
from bridge.forkserver import MAX_PACKET, START_TIMEOUT_S
from bridge.supervisor import Child, alive_pids, spawn


class _PidProc:
    """A process this launcher did not start, followed by pid as much like a `subprocess.Popen` as the supervisor
    needs (`pid`, `returncode`, `poll`, `wait`, `kill`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkedProc(_PidProc):
    """A rank forked by the fork server."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        super().__init__(pid)
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.pump()
        if self.returncode is None and self._server.gone() and not alive_pids([self.pid]):
            self.returncode = -signal.SIGKILL  # died with the server; its code was never reported
        return self.returncode


class ZygoteForkProc(_PidProc):
    """A run's fork server forked by a zygote (bridge/zygote.py). It leaves when the launcher closes its socket;
    gone before that, it was killed."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        super().__init__(pid)
        self._sock = sock

    def poll(self) -> int | None:
        if self.returncode is None and not alive_pids([self.pid]):
            self.returncode = 0 if self._sock.fileno() == -1 else -signal.SIGKILL
        return self.returncode


class ForkServer:
    """One fork server per run: `start`, then `fork` each rank; its `child` joins the run's children."""

    def __init__(self, child: Child, sock: socket.socket) -> None:
        self.child = child
        self._sock = sock
        self._procs: dict[int, ForkedProc] = {}
        self._codes: dict[int, int] = {}  # exits reported before the fork's own reply was read

    @classmethod
    def start(
        cls, python: str, preload: Sequence[str], env: dict[str, str], log_path: Path, cwd: str | None = None
    ) -> ForkServer:
        """Start `python -m bridge.forkserver`, which imports `preload` and then waits for requests; or, under a
        zygote home (`PHANTORA_ZYGOTE`, bridge/zygote.py), have the zygote of this start-up fork one."""
        home = zygote.usable_home(env)
        if home is not None:
            pid, sock = zygote.run_server(home, python, preload, env, cwd, log_path)
            return cls(Child("forkserver", None, ZygoteForkProc(pid, sock), log_path), sock)  # type: ignore[arg-type]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [python, "-m", "bridge.forkserver", "--fd", str(theirs.fileno()), "--preload", ",".join(preload)]
        try:
            child = spawn("forkserver", None, cmd, env, log_path, cwd, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        return cls(child, ours)

    def gone(self) -> bool:
        return self.child.proc.poll() is not None

    def fork(
        self,
        rank: int,
        module: str,
        argv: Sequence[str],
        env: dict[str, str],
        log_path: Path,
        cwd: str | None,
        tick: Callable[[], None] = lambda: None,
    ) -> Child:
        """Fork rank `rank` running `python -m module argv...`; return it as a run child. `tick` is called while
        waiting (the fork server may still be importing torch), so the caller can keep its peers informed."""
        job = {
            "rank": rank,
            "module": module,
            "argv": list(argv),
            "env": env,
            "cwd": cwd,
            "log": str(log_path),
            "launcher": os.getpid(),
        }
        try:
            self._sock.send(json.dumps(job).encode())
        except OSError:  # the server is gone: wait for its exit status, reported below
            self.child.proc.wait(timeout=5.0)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            tick()
            msg = self._recv(0.05)
            if msg is not None and "code" not in msg:
                proc = ForkedProc(self, int(msg["pid"]))
                self._procs[proc.pid] = proc
                proc.returncode = self._codes.pop(proc.pid, None)
                return Child("rank", rank, proc, log_path)  # type: ignore[arg-type]
            if self.gone():
                raise BridgeError(
                    f"{self.child.label} {self.child.exit_text()} during start-up:\n{self.child.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise BridgeError(f"{self.child.label} did not start rank {rank} within {START_TIMEOUT_S:.0f} s")

    def pump(self) -> None:
        """Read every exit the server has reported so far (never blocks)."""
        while self._recv(0.0) is not None:
            pass

    def _recv(self, timeout_s: float) -> dict[str, Any] | None:
        """One message, or None; exits are applied to their `ForkedProc` on the way."""
        self._sock.settimeout(timeout_s)
        try:
            data = self._sock.recv(MAX_PACKET)
        except (BlockingIOError, TimeoutError, InterruptedError):
            return None
        except OSError:
            return None  # the server is gone; `gone()` says so
        if not data:
            return None
        msg = json.loads(data)
        if "code" in msg:
            pid, code = int(msg["pid"]), int(msg["code"])
            proc = self._procs.get(pid)
            if proc is None:
                self._codes[pid] = code
            else:
                proc.returncode = code
        return msg

    def close(self) -> None:
        self._sock.close()
