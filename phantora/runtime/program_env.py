"""NCCL_* variables a program sets in its own environment, as NCCL reads them when a communicator is created.

NCCL reads NCCL_ALGO and NCCL_PROTO when it tunes a new communicator (tuning.cc `ncclTopoTuneModel`, `ncclGetEnv`)
and its integer parameters (NCCL_MAX_NCHANNELS, ...) at their first use (param.cc `ncclLoadParam`), so a script that
sets `os.environ["NCCL_PROTO"]` before `init_process_group` runs its collectives under it. A run fixes the variables
of its own environment when it starts (`collectives.nccl.with_nccl_env`) and tells its ranks which (`RUN_ENV`); a
process group created in an environment that differs from them (the program changed them, or, in a `--jobs` run, the
job's own `env` table set some) carries its own, and its collectives take those instead.
"""

from __future__ import annotations

import json
import os

from phantora.collectives.nccl.settings import RUN_ENV, nccl_env, run_env_value

NcclEnv = tuple[tuple[str, str], ...]
__all__ = ["RUN_ENV", "at_start", "program_nccl_env", "run_env_value"]


def at_start() -> NcclEnv:
    """The NCCL_* variables the coordinator's model holds for this rank's collectives unless told otherwise: the run's
    (`RUN_ENV`, set by the launcher), else this process's environment now (a rank calls it before the program runs)."""
    raw = os.environ.get(RUN_ENV)
    if raw is None:
        return nccl_env(os.environ)
    try:
        return tuple((str(k), str(v)) for k, v in json.loads(raw))
    except (ValueError, TypeError):
        raise ValueError(f"{RUN_ENV}={raw!r} is not a JSON list of [name, value] pairs") from None


def program_nccl_env(start: NcclEnv) -> NcclEnv | None:
    """The NCCL_* variables now, if they differ from `start`; else None (the run's hold)."""
    now = nccl_env(os.environ)
    return now if now != start else None
