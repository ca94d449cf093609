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

Piece = tuple[Collective, AlgoOptions]  # one aggregate's calls in one plan, on the aggregate's resolved options


def group_plans(coll: Collective, topo: Topology, opts: AlgoOptions) -> list[list[Piece]] | None:
    """`coll`'s group of calls (`group_sizes` or `group_calls`) as the plans NCCL 2.22+ launches, each a list of
    its aggregates' pieces in plan order; None where the group is one plan (or not NCCL's legacy kernels)."""
    if opts.model != "nccl" or coll.kind not in coll_group.KINDS or coll.size < 2 or coll.dealt_parts:
        return None
    sizes = call_sizes(coll)
    st = nccl_settings(opts)
    version = st.nccl_version
    if len(sizes) < 2 or version < channel_split.SPLIT_FROM:
        return None
    types = coll.group_dtypes or (coll.dtype,) * len(sizes)
    calls = [(coll.kind, coll.redop, ty, s) for ty, s in zip(types, sizes, strict=True)]
    aggs = coll_group.aggregates(version, calls)
    whole = dataclasses.replace(coll, nbytes=sum(sizes), group_calls=1, group_sizes=sizes)
    resolved: list[AlgoOptions] = []
    for members in aggs:
        part = _piece(whole, [sizes[i] for i in members], types[members[0]], sizes if len(aggs) > 1 else ())
        o, choice = resolve(part, topo, opts)
        if choice is not None and o.algorithm == "pat" and len(sizes) > coll_group.MAX_CALLS:
            raise InputError(
                f"{len(sizes)} {coll.kind} calls in one NCCL group on PAT: more than {coll_group.MAX_CALLS} are not "
                "modelled (its plans are cut only for the ring, tree and NVLS algorithms)",
                field="-m" if coll.group_calls > 1 else "group_sizes",
            )
        if choice is None or o.algorithm not in DEALT_ALGORITHMS:
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
        kernel = (types[aggs[a][0]], o.algorithm, o.protocol)
        for i in aggs[a]:
            count = channel_split.count_bytes(coll.kind, n, sizes[i])
            tasks.append((coll.kind, o.protocol, count, max(1, o.channels), kernel, nvls))
            owner.append((a, i))
    cut = coll_group.plans(version, n, tasks, most, most_nvls)
    if len(cut) < 2:
        return None
    out: list[list[Piece]] = []
    for plan in cut:
        plan_sizes = tuple(sizes[owner[t][1]] for t, _, _ in plan)
        pieces: list[Piece] = []
        for a in dict.fromkeys(owner[t][0] for t, _, _ in plan):
            mine = [(t, lo, parts) for t, lo, parts in plan if owner[t][0] == a]
            part = _piece(
                whole,
                [sizes[owner[t][1]] for t, _, _ in mine],
                types[aggs[a][0]],
                plan_sizes if len(plan_sizes) > 1 else (),
            )
            o = resolved[a]
            if o.algorithm not in NVLS_ALGORITHMS:
                per = coll_group.channel_bytes([(lo, parts) for _, lo, parts in mine])
                first = next((c for c, b in enumerate(per) if b > 0), 0)
                part = dataclasses.replace(
                    part, dealt_parts=tuple(b for b in per[first:] if b > 0) or (0,), dealt_from=first
                )
            fixed = dataclasses.replace(opts, algorithm=o.algorithm, protocol=o.protocol, channels=o.channels)
            pieces.append((part, fixed))
        out.append(pieces)
    return out


def _piece(whole: Collective, sizes: Sequence[int], dtype: str, plan_sizes: tuple[int, ...]) -> Collective:
    """Calls of `sizes` bytes of one aggregate of type `dtype` as one collective of `whole`'s kind and ranks, in a
    plan of `plan_sizes` (its works: numPipeOps; () for a plan of only these calls)."""
    one = len(sizes) == 1
    return dataclasses.replace(
        whole,
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
