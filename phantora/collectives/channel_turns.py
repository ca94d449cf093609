"""Aggregates of one NCCL plan that share a channel run their works on it in turn.

A plan's kernel runs one CTA a channel, and a CTA runs its channel's work batches one after another (enqueue.cc
`addWorkBatchToPlan`, device/common.h, v2.22.3-1 .. v2.30.7-1): where `scheduleCollTasksToPlan` deals two
aggregates onto one channel (the one between them, or all of them for an NVLS aggregate dealt from channel 0 after
the others), the later one's work there starts once the earlier one's has ended. Its kernel is launched already, so
it pays its own latency less the launch's base latency (`BASE_LAT`), as a pair's next p2p operation does
(`nccl/in_turn.py`). Works of one kernel are no exception: a CTA runs the works of a batch one after another, each
its whole algorithm (device/common.h `RunWorkBatch::run`, `for (w = 0; w < nWorks; w++) RunWorkColl().run(...)`,
v2.22.3-1 .. v2.30.7-1), so two aggregates of one kernel sharing a channel are chained as well. Calls of one
aggregate (a plan's pieces of it, of several roots, too) are rated together by NCCL's tuner (numPipeOps counts
their works a channel) and are not chained here.

Each aggregate's flows stay capped to spread its bytes over the group's summed bandwidth time (decompose's
`_aggregates_dag`); its first flows wait the extra delay `turn_delays` gives it, so a chain of aggregates sharing
channels ends at the sum of their latencies (the first's whole, the others' less the base) plus the bandwidth sum.
"""

from __future__ import annotations

from collections.abc import Sequence

from phantora.collectives.dag import FlowDag
from phantora.collectives.nccl import TO_NCCL
from phantora.collectives.nccl import tables as T
from phantora.collectives.spec import Collective

NVLS_ALGORITHMS = ("nvls", "nvls_tree")
ALGORITHM_OF = {name: algo for algo, name in T.NCCL_ALGO_NAMES.items()}  # a recorded choice's name -> NCCL's algo


def _algorithm(choice: dict[str, object]) -> str:
    """The NCCL algorithm of a recorded choice (its "algorithm" is NCCL's printed name: Ring, NVLS...)."""
    name = str(choice.get("algorithm"))
    return ALGORITHM_OF.get(name, TO_NCCL.get(name, name))


def channels_of(part: Collective, choice: dict[str, object] | None) -> range | None:
    """The NCCL channels aggregate `part` runs on: those its plan dealt it (`dealt_from`, `dealt_parts`), or an NVLS
    aggregate's channels from 0 (dealt apart, from channel 0); None where the plan's deal is not known (before 2.22,
    outside NCCL's model)."""
    if choice is None:
        return None
    if _algorithm(choice) in NVLS_ALGORITHMS:
        return range(int(str(choice.get("channels", 1))))
    if not part.dealt_parts:
        return None
    return range(part.dealt_from, part.dealt_from + len(part.dealt_parts))


def base_latency_us(choice: dict[str, object] | None) -> float:
    """The launch's base latency in `choice`'s latency (NCCL's baseLat of its algorithm and protocol)."""
    if choice is None:
        return 0.0
    algo = _algorithm(choice)
    proto = str(choice.get("protocol"))
    if algo not in T.BASE_LAT or proto not in T.PROTOCOLS:
        return 0.0
    return T.BASE_LAT[algo][T.PROTOCOLS.index(proto)]


def first_delay_ns(dag: FlowDag) -> int:
    """The delay of a DAG's first flows (those with no dependencies): its latency."""
    return max((f.delay_ns for f in dag.flows if not f.deps), default=0)


def turn_delays(aggregates: Sequence[tuple[Collective, FlowDag]], ids: Sequence[int] | None = None) -> list[int]:
    """The extra delay (ns) of each aggregate's first flows (`aggregates`: each one's collective and DAG, decomposed
    alone; `ids`: each one's aggregate where several are pieces of one, default each its own). In plan order (those
    not NVLS, then NVLS: collBins' order), an aggregate that shares a channel with an earlier one (of any kernel,
    not a piece of its own aggregate) starts its latency, less its base, where the latest of those ends its own (its
    extra delay plus its latency); 0 for the others and where a plan's deal is not known."""
    spans = [channels_of(part, dag.choice) for part, dag in aggregates]
    owners = list(ids) if ids is not None else list(range(len(aggregates)))
    delays = [first_delay_ns(dag) for _, dag in aggregates]
    nvls = [_algorithm(dag.choice or {}) in NVLS_ALGORITHMS for _, dag in aggregates]
    order = sorted(range(len(aggregates)), key=lambda k: nvls[k])
    extra = [0] * len(aggregates)
    for pos, i in enumerate(order):
        mine = spans[i]
        if mine is None:
            continue
        ready = 0
        for j in order[:pos]:
            theirs = spans[j]
            if theirs is None or owners[j] == owners[i] or not set(mine) & set(theirs):
                continue
            ready = max(ready, extra[j] + delays[j])
        if ready:
            extra[i] = max(0, ready - round(base_latency_us(aggregates[i][1].choice) * 1000.0))
    return extra
