"""NCCL_* variables a program sets in its own environment, as NCCL reads them when a communicator is created.

NCCL reads NCCL_ALGO and NCCL_PROTO when it tunes a new communicator (tuning.cc `ncclTopoTuneModel`, `ncclGetEnv`)
and its integer parameters (NCCL_MAX_NCHANNELS, ...) at their first use (param.cc `ncclLoadParam`), so a script that
sets `os.environ["NCCL_PROTO"]` before `init_process_group` runs its collectives under it. A run fixes the variables
of its own environment when it starts (`collectives.nccl.with_nccl_env`); a process group created after the program
changed them carries its own, and its collectives take those instead.
"""

from __future__ import annotations

import os

from phantora.collectives.nccl.settings import nccl_env

NcclEnv = tuple[tuple[str, str], ...]


def at_start() -> NcclEnv:
    """The NCCL_* variables of this process's environment now (a rank calls it before the program runs)."""
    return nccl_env(os.environ)


def program_nccl_env(start: NcclEnv) -> NcclEnv | None:
    """The NCCL_* variables now, if the program changed them since `start`; else None (the run's hold)."""
    now = nccl_env(os.environ)
    return now if now != start else None
