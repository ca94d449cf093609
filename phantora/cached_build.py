"""Build one file (a compiled shared library) once into its cache path, under a file lock.

Concurrent first uses (many ranks, parallel runs) build it once: the first takes the lock and compiles into a
temporary name beside `out`, then renames it into place; the others wait on the lock and find it there. Used by
simcuda's native libraries (phantora.runtime.simcuda.native) and the user's congestion controls
(phantora.netsim.ns3_build).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

# The command that writes the library to the temporary path it is given.
Command = Callable[[Path], list[str]]
# The error to raise for a failed command (the command, the finished process).
Failure = Callable[[list[str], "subprocess.CompletedProcess[str]"], Exception]


def build_once(out: Path, lock_name: str, command: Command, failed: Failure) -> Path:
    """`out`, built now by `command(tmp)` if missing, holding `out.parent / lock_name`; `failed`'s error if the
    command exits non-zero (nothing is left at `out` then)."""
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        cmd = command(tmp)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise failed(cmd, proc)
        tmp.replace(out)
    return out


def output_tail(proc: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    """The last `lines` lines of a finished process's stdout and stderr (a compiler's errors are at the end)."""
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-lines:])
