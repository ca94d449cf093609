"""A group of symmetric calls NCCL 2.28+ cuts into several kernels: one launch each, one after another.

`ncclMakeSymmetricTaskList` (symmetric_sched.cc, v2.28.3-1 .. v2.30.7-1) ends a kernel where one more work would
overflow the kernel's 4 KiB arguments (`nccl.register.kernel_works`: 58 calls in 2.28.3, 56 in 2.28.7 - 2.29.3, 55
from 2.29.7, as its arguments' header grew) and
picks each kernel on its own calls (their cell-rounded counts summed, the largest's limits, no LL for several), and
`ncclLaunchPrepare` makes each kernel a plan of its own. Each kernel is decomposed as a group of its calls and its
first flows wait for the previous kernel's end on their sender's rank (`group_plans.chain_plans`).
"""

from __future__ import annotations

import dataclasses

from phantora.collectives.nccl import call_sizes, platform_of
from phantora.collectives.nccl import settings as nccl_settings
from phantora.collectives.nccl.register import SYM_KINDS, kernel_calls, kernel_works, release_of, sym_choice
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology.model import Topology


def sym_plans(coll: Collective, topo: Topology, opts: AlgoOptions) -> list[Collective] | None:
    """`coll`'s group of calls as the symmetric kernels NCCL 2.28+ launches one after another, each a group of its
    calls, in launch order; None where the group is one kernel, runs no symmetric kernel, or is before 2.28."""
    if opts.model != "nccl" or (opts.algorithm, opts.protocol) != ("auto", "auto"):
        return None
    if coll.kind not in SYM_KINDS or coll.size < 2 or coll.mixed():
        return None
    sizes = call_sizes(coll)
    st = nccl_settings(opts)
    per_kernel = kernel_works(release_of(st))
    if per_kernel is None or len(sizes) <= per_kernel:
        return None
    p = platform_of(topo, coll.ranks, st)
    if sym_choice(coll, p, st) is None:
        return None  # the legacy kernels (group_plans cuts their plans)
    out: list[Collective] = []
    for calls in kernel_calls(sizes, per_kernel):
        if coll.group_sizes:
            many = len(calls) > 1
            out.append(dataclasses.replace(coll, nbytes=sum(calls), group_sizes=calls if many else (), group_dtypes=()))
        else:
            out.append(dataclasses.replace(coll, group_calls=len(calls)))
    return out
