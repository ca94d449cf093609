"""Private run directories that a killed launcher left behind are removed by the next run; live ones never."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bridge.transport import OWNER_FILE, make_run_dir, remove_stale_run_dirs


def _dead_pid_and_start() -> tuple[int, str]:
    """A process that existed and has exited: its pid, and a start time it had."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    start = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    proc.kill()
    proc.wait()
    return proc.pid, start


def test_dead_owners_directories_go_and_live_ones_stay(tmp_path: Path) -> None:
    pid, start = _dead_pid_and_start()
    dead = tmp_path / "phantora-run-dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(f"{pid} {start}\n")
    (dead / "setup.msgpack").write_bytes(b"x")
    reused = tmp_path / "phantora-run-reused"  # the pid lives, but it is another process (another start time)
    reused.mkdir()
    (reused / OWNER_FILE).write_text(f"{os.getpid()} 1\n")
    unknown = tmp_path / "phantora-run-unknown"  # no owner recorded: may be live, kept
    unknown.mkdir()
    other = tmp_path / "not-phantora"
    other.mkdir()
    live = make_run_dir(tmp_path)  # removes the stale ones first
    assert not dead.exists() and not reused.exists()
    assert unknown.exists() and other.exists() and live.exists()
    assert (live / OWNER_FILE).read_text().split()[0] == str(os.getpid())
    assert remove_stale_run_dirs(tmp_path) == [] and live.exists()  # its owner (this process) is alive
