"""The collectives of a `_coalescing_manager(group, device=...)` block, held until the block ends and sent as NCCL
runs them: one NCCL group, one launch at ncclGroupEnd.

Inside such a block ProcessGroupNCCL enqueues every collective between ncclGroupStart and ncclGroupEnd: those torch
fuses into a `*_coalesced` call at the block's end (all-reduces, all-gathers into a tensor, reduce-scatters of a
tensor) and those it issues one by one (broadcasts, reductions, list all-gathers and reduce-scatters). NCCL launches
nothing before ncclGroupEnd, then aggregates the group's calls per (function, reduction, type) (enqueue.cc,
nccl/coll_group.py). The backend holds the block's collectives (`HeldCall`) and, at `_end_coalescing`, sends each
`bins` entry as one coalesced call of the group's launch: its calls' bytes (`group_sizes`) and dtypes
(`group_dtypes`), so that NCCL's aggregation, tuner choice, latency and channels apply to them together.

Calls of different functions, reductions or roots are separate bins: separate coalesced calls of the one launch,
started together. The model can run them as NCCL's one plan (`Collective.group_kinds` / `group_redops` /
`group_roots`, collectives/group_plans.py), but the call, its recording (type 14) and Chakra do not carry them yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

GROUPED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")  # NCCL's collective tasks


@dataclass
class HeldCall:
    """One collective of the block, as the backend would have issued it (`PhantoraProcessGroup._coll`)."""

    kind: str
    name: str
    redop: str
    root: int | None  # group rank
    sizes: tuple[int, ...]  # its NCCL calls' bytes (one, or a coalesced call's)
    dtypes: tuple[str, ...]  # their dtypes
    dtype_of: torch.Tensor
    tensors: list[torch.Tensor]
    start: Callable[[], list[Any]]
    finalize: Callable[[], None] | None
    result: list[torch.Tensor]
    sync: bool
    cuda_stream: int
    work: Any  # the PhantoraWork returned for it, whose calls are filled in at the block's end


def bins(calls: Sequence[HeldCall]) -> list[list[HeldCall]]:
    """The held calls by (kind, reduction, root), in the order each first came; issue order within each."""
    out: dict[tuple[str, str, int | None], list[HeldCall]] = {}
    for c in calls:
        out.setdefault((c.kind, c.redop, c.root), []).append(c)
    return list(out.values())


def merged(calls: Sequence[HeldCall]) -> dict[str, Any]:
    """One bin's calls as one coalesced call: the keyword arguments `_coll` takes for it (a bin of one NCCL call:
    that call, with no group sizes)."""
    head = calls[0]
    sizes = tuple(s for c in calls for s in c.sizes)
    dtypes = tuple(t for c in calls for t in c.dtypes)
    starts = [c.start for c in calls]
    ends = [c.finalize for c in calls if c.finalize is not None]

    def start() -> list[Any]:
        return [w for s in starts for w in s()]

    def finalize() -> None:
        for f in ends:
            f()

    return dict(
        kind=head.kind,
        name=head.name,
        size=sum(sizes),
        dtype_of=head.dtype_of,
        tensors=[t for c in calls for t in c.tensors],
        start=start,
        finalize=finalize if ends else None,
        root=head.root,
        redop=head.redop,
        group_sizes=sizes if len(sizes) > 1 else (),
        group_dtypes=dtypes if len(sizes) > 1 and len(set(dtypes)) > 1 else (),
        sync=any(c.sync for c in calls),
        cuda_stream=calls[-1].cuda_stream,
    )
