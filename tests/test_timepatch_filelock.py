"""A lock file another process holds times out under the simulated clock (phantora/runtime/timepatch.py): filelock
measures its timeout with `time.perf_counter`, which the time patch makes the rank's simulated time, still while the
host sleeps. Two ranks of accelerate's by_feature examples waited forever on evaluate's metric cache file (each
rank's `add_batch` asks for the same file with a 1 s timeout, then takes another name)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from phantora.runtime import timepatch

filelock = pytest.importorskip("filelock")

HOLD = """
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_held_lock_times_out_on_a_frozen_simulated_clock(tmp_path: Path) -> None:
    path = str(tmp_path / "cache.arrow.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        timepatch.install(lambda: 0)  # a simulated clock that does not move while the host waits
        try:
            start = time.monotonic()
            with pytest.raises(filelock.Timeout):
                filelock.FileLock(path).acquire(timeout=0.5)
            waited = time.monotonic() - start
        finally:
            timepatch.uninstall()
        assert 0.5 <= waited < 10
    finally:
        holder.kill()
        holder.wait()
