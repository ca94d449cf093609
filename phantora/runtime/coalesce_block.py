"""The collectives of a `_coalescing_manager(group, device=...)` block, held until the block ends and sent as NCCL
runs them: one NCCL group, one launch at ncclGroupEnd.

Inside such a block ProcessGroupNCCL enqueues every collective between ncclGroupStart and ncclGroupEnd: those torch
fuses into a `*_coalesced` call at the block's end (all-reduces, all-gathers into a tensor, reduce-scatters of a
tensor) and those it issues one by one (broadcasts, reductions, list all-gathers and reduce-scatters). NCCL launches
nothing before ncclGroupEnd, then aggregates the group's calls per (function, reduction, type) (enqueue.cc,
nccl/coll_group.py). The backend holds the block's collectives (`HeldCall`) and, at `_end_coalescing`, sends them
all as one coalesced call of the group's launch (`merged`): its calls' bytes (`group_sizes`), dtypes
(`group_dtypes`) and, where they differ, kinds, reductions and roots (`group_kinds`, `group_redops`,
`group_roots`), so that NCCL's aggregation, tuner choice, latency, channels and plan apply to them together
(collectives/group_plans.py).
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


def merged(calls: Sequence[HeldCall]) -> dict[str, Any]:
    """The block's calls (in issue order) as one coalesced call: the keyword arguments `_coll` takes for it, the
    first call's kind, name, reduction and root its own (a block of one NCCL call: that call, with no group
    sizes). Each NCCL call's kind, reduction and root (group rank) are given where they differ."""
    head = calls[0]
    sizes = tuple(s for c in calls for s in c.sizes)
    dtypes = tuple(t for c in calls for t in c.dtypes)
    each = [(c.kind, c.redop, c.root) for c in calls for _ in c.sizes]
    starts = [c.start for c in calls]
    ends = [c.finalize for c in calls if c.finalize is not None]

    def start() -> list[Any]:
        return [w for s in starts for w in s()]

    def finalize() -> None:
        for f in ends:
            f()

    def differing(i: int) -> tuple[Any, ...]:
        got = tuple(e[i] for e in each)
        return got if len(sizes) > 1 and len(set(got)) > 1 else ()

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
        group_kinds=differing(0),
        group_redops=differing(1),
        group_roots=differing(2),
        sync=any(c.sync for c in calls),
        cuda_stream=calls[-1].cuda_stream,
    )
