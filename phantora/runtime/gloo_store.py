"""Real mode's gloo groups connect lazily, and the rendezvous store they connect through outlives every rank's end.

The real data of a live run moves over gloo groups, one inside each process group (backend.py). gloo's default is
to connect all of a group's members when the group is created, so a rank creating a group waited there for members
still blocked in a simulated wait, which in turn waited on that rank's clock: the run hung (NCCL creates its
communicators lazily, so the program runs on a cluster). With TORCH_GLOO_LAZY_INIT a pair connects at its first
exchange instead, through the run's rendezvous store, which rank 0 serves (torch's env:// rendezvous). So rank 0
keeps a reference to that store (the program may destroy its groups) and, once it has finished, serves it until
every rank has ended: a pair of other ranks may exchange for the first time after rank 0's program is done.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import torch.distributed as dist

ENDED_KEY = "phantora/ranks-ended"
_kept: list[tuple[Any, int, int]] = []  # (store, rank, world) of the default group, as the program created it


def connect_lazily() -> None:
    """gloo connects a pair at its first exchange (unless the environment says otherwise)."""
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")


def keep_default_store() -> None:
    """Wrap init_process_group (torch's, or phantora's own wrapper of it) to keep the default group's store."""
    c10d = dist.distributed_c10d
    orig = c10d.init_process_group
    if getattr(orig, "_keeps_store", False):
        return

    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        _kept[:] = [(c10d._get_default_store(), dist.get_rank(), dist.get_world_size())]
        return out

    init_process_group._keeps_store = True  # type: ignore[attr-defined]
    for mod in (c10d, dist):
        setattr(mod, "init_process_group", init_process_group)  # noqa: B010 - a module attribute mypy cannot see


def hold_until_all_end(timeout_s: float = 600.0) -> None:
    """Count this rank as ended in the kept store; rank 0 (its server) then waits until all have (or `timeout_s`)."""
    if not _kept:
        return
    store, rank, world = _kept[0]
    try:
        n = store.add(ENDED_KEY, 1)
        deadline = time.monotonic() + timeout_s
        while rank == 0 and n < world and time.monotonic() < deadline:
            time.sleep(0.02)
            n = store.add(ENDED_KEY, 0)
    except Exception:  # noqa: BLE001 - the store's server is gone: nothing left to serve
        return
