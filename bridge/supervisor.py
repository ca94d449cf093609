"""Child processes of a run: start them so none can outlive the launcher, and stop them all.

Each child gets its own process group (so its own children die with it) and PR_SET_PDEATHSIG
SIGKILL (so it dies if the launcher is killed outright). `stop_all` sends SIGTERM to every group,
then SIGKILL after a grace period, and reaps every child.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge import oom

_PR_SET_PDEATHSIG = 1
try:  # loaded here, not in the forked child, which should only make the call
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _LIBC = None  # not Linux: the heartbeat timeouts still end the run


def die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL when the launcher dies (Linux); exit if it already has."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


@dataclass
class Child:
    """One process of the run."""

    role: str  # "coordinator", "server", "forkserver", "rank" or "spawner" (a program that starts its ranks); or
    # "coordinator forkserver", "server forkserver": what forked those two (bridge/warm_start.py)
    rank: int | None
    proc: subprocess.Popen[bytes]  # or a bridge.forkclient.ForkedProc (a rank forked by the fork server)
    log_path: Path
    reported: bool = False  # its exit was handled
    job: str | None = None  # a run of several jobs: the rank's job (rank is then the global rank)
    local: int | None = None  # ... and its rank in that job
    oom_kills: int | None = field(default_factory=oom.kills)  # the kernel's OOM kill count when it started

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def label(self) -> str:
        name = (
            (f"rank {self.rank}" if self.job is None else f"rank {self.local} of job {self.job}")
            if self.role == "rank"
            else {
                "server": "the network server",
                "forkserver": "the fork server",
                "coordinator forkserver": "the coordinator's fork server",
                "server forkserver": "the network server's fork server",
                "spawner": "the launching process",
            }.get(self.role, f"the {self.role}")
        )
        return f"{name} (pid {self.pid})"

    def exit_text(self) -> str:
        code = self.proc.returncode
        if code is None:
            return "is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                return f"was killed by signal {-code}"
            why = oom.explain(code, self.oom_kills, oom.kills())
            return f"was killed by {name}" + (f", {why}" if why else "")
        return f"exited with code {code}"

    def log_tail(self, lines: int = 15) -> str:
        """The last `lines` of the child's log, then phantora's one-line verdict on it if the tail missed it
        (a long framework traceback can push the rank's "phantora: rank N failed (at ...)" line up)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        all_lines = text.rstrip().splitlines()
        tail = all_lines[-lines:]
        verdict = next((ln for ln in reversed(all_lines) if ln.startswith("phantora: ")), None)
        if verdict is not None and verdict not in tail:
            tail += ["...", verdict]
        return "\n".join(tail)


def spawn(
    role: str,
    rank: int | None,
    cmd: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> Child:
    """Start a child in its own process group, output to `log_path`, dying with this process.

    `pass_fds`: file descriptors the child inherits (all others are closed)."""
    parent = os.getpid()
    with open(log_path, "wb") as log:  # a fresh log per run, even in a reused --out directory
        proc = subprocess.Popen(
            list(cmd),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            preexec_fn=lambda: die_with_parent(parent),  # noqa: PLW1509 - the launcher is single-threaded here
        )
    return Child(role, rank, proc, log_path)


def _signal_group(child: Child, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(children: Sequence[Child], grace_s: float = 1.0) -> None:
    """SIGTERM every child's group, SIGKILL what is left after `grace_s`, reap everything."""
    for c in children:
        _signal_group(c, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for c in children:
        try:
            c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for c in children:
        _signal_group(c, signal.SIGKILL)  # also any grandchild left in the group
        if c.proc.poll() is None:
            c.proc.kill()
        c.proc.wait()


def alive_pids(pids: Sequence[int]) -> list[int]:
    """Which of `pids` still exist as live (non-zombie) processes."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out
