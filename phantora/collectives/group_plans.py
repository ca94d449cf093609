"""A group of collectives NCCL 2.22+ cuts into several plans: one kernel launch each, one after another.

`ncclLaunchPrepare` (enqueue.cc, v2.22.3-1 .. v2.30.7-1) fills a plan until its budget is spent and starts
another (`nccl.coll_group.plans`); the group's tuner choices were made before, in `ncclPrepareTasks`, so every
plan runs each aggregate's calls on that aggregate's algorithm, protocol and channels. Each plan is decomposed as
a group of its own calls (its latency from its own works, `Collective.plan_sizes`; its calls' channel bytes as
the plan deals them, `Collective.dealt_parts`), and its first flows wait for the previous plan's end on their
sender's rank (the kernels of one stream run in turn), then its latency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from phantora.collectives.dag import FlowDag
from phantora.collectives.nccl import TO_NCCL, call_sizes, channel_split, coll_group, platform_of
from phantora.collectives.nccl import settings as nccl_settings
from phantora.collectives.nccl.channels import plan_channels
from phantora.collectives.options import resolve
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.topology.model import Topology

NVLS_ALGORITHMS = ("nvls", "nvls_tree")  # NCCL's NVLS scheduling kind: dealt apart, from channel 0
DEALT_ALGORITHMS = ("ring", "tree", "chain", "nvls", "nvls_tree")  # legacy kernels whose tasks the plan deals
# a group of one kind is cut into plans on these: PAT's tasks are scheduled as the ring's and tree's (collBins'
# first kind, enqueue.cc v2.23.4-1 .. v2.30.7-1), their channels not restated to its decomposition
CUT_ALGORITHMS = (*DEALT_ALGORITHMS, "pat")

# one aggregate's calls of one root in one plan, on the aggregate's resolved options, and the aggregate's index (a
# plan's pieces of one aggregate are rated together by NCCL's tuner: channel_turns.py does not chain them)
Piece = tuple[Collective, AlgoOptions, int]


class OnePlanNotModelledError(InputError):
    """A group of several kinds, reductions or roots whose aggregates do not all run dealt legacy kernels (NCCL's
    symmetric kernels, copy engines, PAT): its one plan is not modelled (decompose runs its bins apart)."""


def group_plans(coll: Collective, topo: Topology, opts: AlgoOptions) -> list[list[Piece]] | None:
    """`coll`'s group of calls (`group_sizes` or `group_calls`) as the plans NCCL 2.22+ launches, each a list of
    its pieces in plan order (an aggregate's calls of one root in that plan); None where the group is one plan of
    one kind, reduction and root (or not NCCL's legacy kernels). A group whose calls differ in kind, reduction or
    root (`Collective.mixed`) is always cut here, one plan before 2.22 (its pieces then each dealt alone)."""
    mixed = coll.mixed()
    if coll.size < 2 or coll.dealt_parts or coll.kind not in coll_group.KINDS:
        return None
    if opts.model != "nccl":
        if mixed:
            raise InputError("a group of collectives of several kinds, reductions or roots needs model=nccl")
        return None
    sizes = call_sizes(coll)
    st = nccl_settings(opts)
    version = st.nccl_version
    if len(sizes) < 2 or (version < channel_split.SPLIT_FROM and not mixed):
        return None
    m = len(sizes)
    types = coll.group_dtypes or (coll.dtype,) * m
    kinds = coll.group_kinds or (coll.kind,) * m
    redops = coll.group_redops or (coll.redop,) * m
    roots = coll.group_roots or (coll.root,) * m
    calls = [(k, op, ty, s) for k, op, ty, s in zip(kinds, redops, types, sizes, strict=True)]
    aggs = coll_group.aggregates(version, calls)
    whole = dataclasses.replace(
        coll, nbytes=sum(sizes), group_calls=1, group_sizes=sizes, group_kinds=(), group_redops=(), group_roots=()
    )

    def piece(members: Sequence[int], plan_sizes: tuple[int, ...]) -> Collective:
        head = members[0]
        return _piece(whole, [sizes[i] for i in members], calls[head], roots[head], plan_sizes)

    resolved: list[AlgoOptions] = []
    for members in aggs:
        o, choice = resolve(piece(members, sizes if len(aggs) > 1 else ()), topo, opts)
        if choice is None or o.algorithm not in (DEALT_ALGORITHMS if mixed else CUT_ALGORITHMS):
            if mixed:
                raise OnePlanNotModelledError(
                    f"a group of collectives of several kinds, reductions or roots whose {calls[members[0]][0]} "
                    f"calls run {o.algorithm}: not modelled",
                    field="group_kinds",
                )
            return None  # NCCL's symmetric kernels, copy engines (refused apart) or PAT: one launch
        resolved.append(o)
    n = coll.size
    p = platform_of(topo, coll.ranks, st)
    order = sorted(range(len(aggs)), key=lambda a: resolved[a].algorithm in NVLS_ALGORITHMS)  # collBins' order
    tasks: list[coll_group.Task] = []
    owner: list[tuple[int, int]] = []  # (aggregate, call index) of each task
    most, most_nvls = 1, 1
    for a in order:
        o = resolved[a]
        nvls = o.algorithm in NVLS_ALGORITHMS
        comm = max(plan_channels(TO_NCCL[o.algorithm], p, st), o.channels)
        most_nvls, most = (max(most_nvls, comm), most) if nvls else (most_nvls, max(most, comm))
        kernel = (*calls[aggs[a][0]][:3], o.algorithm, o.protocol)
        for i in aggs[a]:
            count = channel_split.count_bytes(kinds[i], n, sizes[i])
            tasks.append((kinds[i], o.protocol, count, max(1, o.channels), kernel, nvls))
            owner.append((a, i))
    cut = coll_group.plans(version, n, tasks, most, most_nvls)
    if len(cut) < 2 and not mixed:
        return None
    dealt = version >= channel_split.SPLIT_FROM
    out: list[list[Piece]] = []
    for plan in cut:
        plan_sizes = tuple(sizes[owner[t][1]] for t, _, _ in plan)
        pieces: list[Piece] = []
        for a, root in dict.fromkeys((owner[t][0], roots[owner[t][1]]) for t, _, _ in plan):
            mine = [(t, lo, parts) for t, lo, parts in plan if owner[t][0] == a and roots[owner[t][1]] == root]
            part = piece([owner[t][1] for t, _, _ in mine], plan_sizes if len(plan_sizes) > 1 else ())
            o = resolved[a]
            if dealt and o.algorithm in DEALT_ALGORITHMS and o.algorithm not in NVLS_ALGORITHMS:
                per = coll_group.channel_bytes([(lo, parts) for _, lo, parts in mine])
                first = next((c for c, b in enumerate(per) if b > 0), 0)
                part = dataclasses.replace(
                    part, dealt_parts=tuple(b for b in per[first:] if b > 0) or (0,), dealt_from=first
                )
            fixed = dataclasses.replace(opts, algorithm=o.algorithm, protocol=o.protocol, channels=o.channels)
            pieces.append((part, fixed, a))
        out.append(pieces)
    return out


def _piece(
    whole: Collective,
    sizes: Sequence[int],
    call: tuple[str, str, str, int],
    root: int | None,
    plan_sizes: tuple[int, ...],
) -> Collective:
    """Calls of `sizes` bytes of one aggregate (`call`: its head's (kind, reduction, dtype, bytes)) from `root`
    as one collective of `whole`'s ranks, in a plan of `plan_sizes` (its works: numPipeOps; () for a plan of only
    these calls)."""
    one = len(sizes) == 1
    kind, redop, dtype, _ = call
    return dataclasses.replace(
        whole,
        kind=kind,
        redop=redop,
        root=root,
        nbytes=sum(sizes),
        dtype=dtype,
        group_calls=1,
        group_sizes=() if one else tuple(sizes),
        group_dtypes=(),
        plan_sizes=plan_sizes if len(plan_sizes) > 1 and tuple(sizes) != plan_sizes else (),
    )


def chain_plans(dags: Sequence[FlowDag], ranks: Sequence[int], node_of: Callable[[int], int], calls: int) -> FlowDag:
    """The plans' DAGs run one after another: a plan's first flows (those with no dependencies) wait for the
    previous plan's last flows on their sender's rank (its kernel ends), then their own delay (the plan's
    latency). The choice recorded is the first plan's, with the group's `calls` and the number of plans."""
    rank_of = {node_of(r): r for r in ranks}
    flows = list(dags[0].flows)
    last = {r: list(ids) for r, ids in dags[0].rank_last.items()}
    for dag in dags[1:]:
        for f in dag.flows:
            before = last.get(rank_of.get(f.src, -1), []) if not f.deps else []
            flows.append(f.with_deps(tuple(before)) if before else f)
        for r, ids in dag.rank_last.items():
            if ids:
                last[r] = list(ids)
    choice = dict(dags[0].choice or {})
    choice["group_calls"] = calls
    choice["plans"] = len(dags)
    return FlowDag(flows, last, dags[-1].next_id, choice)
