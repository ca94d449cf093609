"""torch.distributed's NCCL names, as a CUDA build of torch has them, on the simulated GPU.

This CPU build of torch has no `ProcessGroupNCCL`, so `dist.is_nccl_available()` answers False and
`dist.ProcessGroupNCCL` is missing. Programs written for NCCL use both: DDP refuses `bf16_compress_hook` unless NCCL
is available (torch/nn/parallel/distributed.py), and a program tunes its groups with
`init_process_group("nccl", pg_options=dist.ProcessGroupNCCL.Options(...))` or `new_group(..., pg_options=...)`.
`install()` makes `is_nccl_available()` True and puts a `ProcessGroupNCCL` where a CUDA build has it
(torch.distributed, distributed_c10d, torch._C._distributed_c10d), with torch's `Options` and `NCCLConfig` fields.

The class names the type only: the groups are phantora's, which are not instances of it, so torch's
`isinstance(backend, ProcessGroupNCCL)` branches (the communicator's uid, NCCL's own comm split) are not taken.
What the options ask for is not simulated: a high-priority stream changes nothing on the simulated GPU's one compute
lane, and the per-communicator CTA limits of `NCCLConfig` are not modelled (NCCL_MIN_CTAS / NCCL_MAX_CTAS in the
environment are, for the whole run); `note_options` says so once, naming the fields set.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

UNDEF = -(2**31)  # NCCL_CONFIG_UNDEF_INT: a config field left to NCCL's default (its environment, then its own)
_CTA_FIELDS = ("cga_cluster_size", "min_ctas", "max_ctas", "split_share")
_told: list[str] = []


class NCCLConfig:
    """`ncclConfig_t` as torch exposes it (`ProcessGroupNCCL.NCCLConfig`): every field undefined by default."""

    def __init__(self) -> None:
        self.blocking = 1
        self.cga_cluster_size = UNDEF
        self.min_ctas = UNDEF
        self.max_ctas = UNDEF
        self.split_share = UNDEF
        self.net_name: str | None = None


class Options:
    """`ProcessGroupNCCL.Options` (torch's fields; `_timeout` as torch sets it for an NCCL group)."""

    backend = "nccl"

    def __init__(self, is_high_priority_stream: bool = False) -> None:
        self.is_high_priority_stream = is_high_priority_stream
        self.config = NCCLConfig()
        self._timeout = timedelta(minutes=10)
        self.split_from: Any = None
        self.split_color = 0
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""


class ProcessGroupNCCL:
    """Stands for NCCL's process group type, for the names programs reach through it (`Options`, `NCCLConfig`);
    it cannot be made: a program's NCCL groups come from `init_process_group` / `new_group`."""

    Options = Options
    NCCLConfig = NCCLConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "ProcessGroupNCCL(...) made directly is not simulated: create NCCL groups with "
            "torch.distributed.init_process_group('nccl') or new_group(...), which give phantora's groups"
        )


def install() -> None:
    """Make torch.distributed answer as a CUDA build with NCCL does (idempotent)."""
    c10d = dist.distributed_c10d
    c10d._NCCL_AVAILABLE = True
    for mod in (dist, c10d, torch._C._distributed_c10d):
        if not hasattr(mod, "ProcessGroupNCCL"):
            mod.ProcessGroupNCCL = ProcessGroupNCCL  # type: ignore[attr-defined]  # absent from this build


def note_options(options: Any) -> None:
    """Say once, on the rank's stderr, which NCCL options of a group are not simulated (`options`: what the
    program passed as `pg_options`, or None)."""
    config = getattr(options, "config", None)
    asked = [f"{name}={getattr(config, name)}" for name in _CTA_FIELDS if getattr(config, name, UNDEF) != UNDEF]
    if getattr(config, "blocking", 1) == 0:
        asked.append("blocking=0")
    new = [a for a in asked if a not in _told]
    if not new:
        return
    _told.extend(new)
    print(
        f"phantora: ProcessGroupNCCL.Options.config ({', '.join(new)}) is not modelled per communicator; "
        "NCCL_MIN_CTAS / NCCL_MAX_CTAS in the environment are, for the whole run",
        file=sys.stderr,
        flush=True,
    )
