"""Recorded jobs (a workload file or an execution graph) as flow DAGs on a shared fabric.

Each recorded job is planned alone on its own GPUs (`phantora.replay.plan_workload`,
`phantora.egraph.replay.plan_graph`): flow ids and ECMP keys count from 0 as if it ran alone, so its routes
are the same whether it runs alone or beside other jobs. `merge` gives the jobs' DAGs disjoint ids (keys
stay the job's own), moves each by its start time and sets its traffic class; the merged DAG runs on one
engine, in process (`phantora replay --jobs`) or beside live jobs inside the coordinator (`phantora run
--jobs`). `RecordedJob.results` turns the job's completions back into its step times and collectives.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phantora.collectives.dag import connection_id
from phantora.collectives.spec import AlgoOptions, NicCharging
from phantora.egraph.format import ExecGraph, load
from phantora.egraph.replay import GraphPlan, algo_from_meta, evaluate_graph, plan_graph
from phantora.errors import InputError
from phantora.jobs.results import step_summary
from phantora.jobs.spec import JobSpec
from phantora.netsim.base import Completion, Flow, NetworkSimulator
from phantora.replay import ReplayPlan, evaluate_workload, plan_workload, settle_groups
from phantora.replay_groups import grouped_ops
from phantora.resources import shipped_file, workloads_dir
from phantora.results import schema
from phantora.topology.model import Topology
from phantora.workload import Workload, as_job, load_workload, step_of


def load_graph(job: JobSpec, source: str | None = None) -> ExecGraph:
    """A graph job's execution graph; its rank count must match the job's if the spec gives one."""
    graph = load(job.source)
    if job.ranks is not None and job.ranks != graph.world:
        raise InputError(
            f"job '{job.name}': the graph has {graph.world} ranks, the job says {job.ranks}", file=source, field="ranks"
        )
    if job.steps is not None:
        raise InputError(
            f"job '{job.name}': a graph replays the steps it recorded; steps is for scripts and workloads",
            file=source,
            field="steps",
        )
    return graph


@dataclass
class RecordedJob:
    """One recorded job planned on its GPUs: its DAG (job-local ids) and how to read its results."""

    index: int  # the job's position in the spec
    spec: JobSpec
    flows: list[Flow]
    workload: Workload | None = None
    wplan: ReplayPlan | None = None
    gplan: GraphPlan | None = None
    plan_s: float = 0.0
    first_id: int = 0  # where merge put its ids

    def local(self, completions: Sequence[Completion]) -> list[Completion]:
        """This job's completions (from the merged run) with its own flow ids."""
        lo, hi = self.first_id, self.first_id + len(self.flows)
        off = self.first_id
        return [dataclasses.replace(c, flow_id=c.flow_id - off) for c in completions if lo <= c.flow_id < hi]

    def results(self, done: Sequence[Completion], stats: dict[str, Any]) -> dict[str, Any]:
        """The job's results.json (schema phantora.run/1, as a live run's): steps, step time, collectives."""
        start = self.spec.start_ns
        if self.wplan is not None:
            assert self.workload is not None
            res = evaluate_workload(self.workload, self.wplan, list(done), stats, 0.0)
            ends: dict[int, int] = {}
            for rec in res.ops:
                k = step_of(rec.name) if self.spec.steps is not None else 0
                ends[k] = max(ends.get(k, start), rec.end_ns)
            colls = [{"name": r.name, "kind": r.kind, "t_start": r.start_ns, "end_ns": r.end_ns} for r in res.ops]
            out = {"collectives": colls, "end_ns": res.makespan_ns}
            step_ends = [ends[k] for k in sorted(ends)]
        else:
            assert self.gplan is not None
            g = evaluate_graph(self.gplan, list(done), stats, self.plan_s, 0.0)
            step_ends = list(g.step_ends_ns) or [g.makespan_ns]  # absolute: the start is in the DAG
            end_of = {c.flow_id: c.end_ns for c in done}
            colls = []
            for i in self.gplan.instances:
                t0 = end_of[i.start]
                colls.append(
                    {
                        "name": i.label(),
                        "kind": i.kind,
                        "t_start": t0,
                        "end_ns": max((end_of[f] for f in i.flows), default=t0),
                    }
                )
            out = {"ranks": [{"comm": g.comm}], "collectives": colls, "end_ns": g.makespan_ns}
        return {"schema": schema.RUN, "start_ns": start, **step_summary(step_ends, start), **out}


def plan_recorded(
    job: JobSpec,
    index: int,
    topo: Topology,
    gpus: list[int],
    algo: AlgoOptions | None,
    source: str | None = None,
    make: Callable[[Topology], NetworkSimulator] | None = None,
    engine: NicCharging | None = None,
) -> RecordedJob:
    """Plan a workload or graph job on its GPUs (`gpus`: natural ranks of `topo`, rank r on gpus[r]). A workload's
    NCCL groups (all_to_all `splits`) are rated each pair from its own start, with the pairs known then, by runs of
    the job alone on its GPUs on engines from `make` (`replay.settle_groups`, as `phantora replay` rates them); without
    `make`, from one start, all known (the run says so). `engine`: the run's engine, whose NIC latency the plan nets
    out of NCCL's (`AlgoOptions.on_engine`, as `phantora replay` plans a lone workload or graph)."""

    def on_engine(opts: AlgoOptions) -> AlgoOptions:
        return opts if engine is None else opts.on_engine(engine)

    placed = topo.with_rank_order(gpus)
    t0 = time.perf_counter()
    try:
        if job.kind == "workload":
            path = shipped_file(job.source, workloads_dir(), (".toml", ".json"))
            wl = as_job(load_workload(path, world=len(gpus)), job.steps, job.start_ns)
            if wl.max_rank >= len(gpus):
                raise InputError(
                    f"job '{job.name}': the workload names rank {wl.max_rank}, the job has {len(gpus)}",
                    file=source,
                    field="ranks",
                )
            algo = on_engine(algo or AlgoOptions())
            if grouped_ops(wl) and make is not None:  # rated by runs of the job alone (its start included)
                _, sim, wl = settle_groups(wl, placed, lambda: make(placed), algo)
                sim.close()
            elif grouped_ops(wl):
                print(f"note: job '{job.name}': its NCCL groups (all_to_all splits) are rated from one start, every "
                      "pair known (docs/workload.md)", file=sys.stderr)  # fmt: skip
            wplan = plan_workload(wl, placed, algo)
            return RecordedJob(index, job, wplan.flows, wl, wplan, plan_s=time.perf_counter() - t0)
        graph = load_graph(job, source)
        gplan = plan_graph(graph, placed, on_engine(algo if algo is not None else algo_from_meta(graph)))
    except InputError as exc:
        if exc.file is not None:
            raise
        what = f"job '{job.name}' ({Path(job.source).name})"
        raise InputError(f"{what}: {exc.message}", file=source, field=exc.field) from None
    if job.start_ns:  # the whole graph starts later: every flow that waits on nothing waits start_ns first
        gplan.flows = [f if f.deps else dataclasses.replace(f, delay_ns=f.delay_ns + job.start_ns) for f in gplan.flows]
    return RecordedJob(index, job, gplan.flows, gplan=gplan, plan_s=time.perf_counter() - t0)


def merge(jobs: Sequence[RecordedJob], first_id: int = 0) -> list[Flow]:
    """The jobs' DAGs as one: disjoint ids from `first_id` in job order, each flow keeping its job-local id as
    its ECMP key, in its job's traffic class."""
    out: list[Flow] = []
    nxt = first_id
    for job in jobs:
        job.first_id = nxt
        prio = job.spec.traffic_class
        for f in job.flows:
            out.append(
                Flow(
                    f.id + nxt,
                    f.src,
                    f.dst,
                    f.size,
                    tuple(d + nxt for d in f.deps),
                    f.delay_ns,
                    f"{job.spec.name}/{f.tag}",
                    f.priority if prio is None else prio,
                    f.id if f.key is None else f.key,
                    f.loss_budget,
                    f.rate_bps,
                    connection_id(job.index, f.src, f.dst, f.conn) if f.conn else 0,  # jobs never share one
                    connection_id(job.index, 0, 0, f.queue) if f.queue else 0,  # a queue spans destinations
                    f.via_nic,
                )
            )
        nxt += len(job.flows)
    return out
