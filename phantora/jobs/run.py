"""`phantora run --jobs jobs.toml`: several training jobs on one fabric, one coordinator, one network engine.

Live jobs (training scripts) run as rank processes, each job in its own world (its own RANK, WORLD_SIZE,
rendezvous and output directory); recorded jobs (workloads, execution graphs) run as flow DAGs inside the
coordinator (`phantora.jobs.recorded`), so a large recorded job can load the network under a live one. With
only recorded jobs the whole run is one in-process replay. With `alone`, each job then runs again by
itself, same GPUs, engine and traffic class, to measure its slowdown.

The run directory holds results.json (schema phantora.jobs/1: the jobs table and the fabric by job),
links_by_job.csv, flows.csv, the engine's traces (ns3), trace.json (every job's ranks and network lanes),
and for each job ``jobs/<name>/`` laid out as a single-job run (results.json, steps.jsonl, trace.json,
flows.csv, status.json), so `phantora compare` reads it; with `alone`, ``alone/<name>/`` holds each
job's run alone (its own ``jobs/<name>/`` inside).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.jobs import JobProcs
from phantora.collectives.nccl import nccl_env, summarize_choices
from phantora.collectives.nccl.settings import settings_of
from phantora.collectives.spec import AlgoOptions
from phantora.errors import InputError
from phantora.jobs.recorded import RecordedJob, load_graph, merge, plan_recorded
from phantora.jobs.results import (
    LINK_COLUMNS,
    JobFlow,
    JobTrace,
    channel_bytes,
    job_comm_args,
    job_time_ns,
    link_rows,
    pause_spans,
    pfc_by_job,
    read_pfc_rows,
    write_jobs_trace,
)
from phantora.jobs.scenario import add_job_phases, live_jobs_section, load_jobs_scenario, recorded_jobs_section
from phantora.jobs.spec import JobSpec, JobsSpec, place_jobs
from phantora.launcher import (
    PHANTOM_ABOVE,
    RANK_PRELOAD,
    RunConfig,
    _trace_notes,
    compute_model_options,
    config_options,
    engine_warnings,
    rank_options,
    resolve_topology,
    run_cc,
)
from phantora.netsim.base import Completion, Flow, NetworkSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.scenario import Scenario
from phantora.netsim.standalone import Alone, alone_of, flow_alone
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import check_trace_level, check_trace_steps, import_time_env
from phantora.resources import examples_dir, shipped_file
from phantora.results import provenance
from phantora.results import schema as S
from phantora.results.run_dir import CommKey, RunDir
from phantora.results.summary import summarize
from phantora.results.write import write_csv, write_fabric_traces, write_flows_csv
from phantora.topology.model import Topology

JOBS, LINKS_BY_JOB_CSV = S.JOBS, S.LINKS_BY_JOB_CSV


@dataclass
class JobsReport:
    """What a multi-job run produced."""

    summary: dict[str, Any]  # results.json
    jobs: dict[str, dict[str, Any]]  # job name -> its own results.json
    logs: dict[str, str]
    out_dir: Path | None


@dataclass
class _Plan:
    """A checked, placed multi-job run, ready to start."""

    spec: JobsSpec
    natural: Topology  # the topology as loaded (GPU i = its i-th endpoint)
    topo: Topology  # placed: the live jobs' ranks first, in job order
    gpus: list[list[int]]  # per job, natural ranks of its GPUs
    live: list[int]  # indices of the script jobs, in global rank order
    recorded: list[RecordedJob]
    offsets: dict[int, int]  # live job index -> its rank 0's global rank


@dataclass
class _Ctx:
    """One run: its plan, options and directories."""

    plan: _Plan
    base: RunConfig
    out: RunDir
    job_dirs: dict[str, RunDir]
    algo: AlgoOptions | None = None
    scenario: Scenario | None = None  # the engine's scenario, checked for several jobs (phantora.jobs.scenario)


def _check(spec: JobsSpec, base: RunConfig, topo: Topology, algo: AlgoOptions | None) -> _Plan:
    """Everything that can be wrong with the spec, before anything starts."""
    if base.dedup not in ("auto", "off", None, 0):
        raise InputError(
            "several jobs run every rank live: rank deduplication (--dedup) is not available", field="dedup"
        )
    for j in spec.jobs:
        if j.kind == "script":
            p = shipped_file(j.source, examples_dir(), (".py",))
            if not p.is_file():
                raise InputError(
                    f"job '{j.name}': training script not found: {j.source}", **spec.where(j), field="script"
                )
            j.source = str(p.resolve())
        elif j.kind == "graph" and j.ranks is None:
            j.ranks = load_graph(j, spec.source).world
    gpus = place_jobs(spec, topo)
    live = [i for i, j in enumerate(spec.jobs) if j.kind == "script"]
    for i in live:
        _check_nccl_env(spec, spec.jobs[i], base)
    offsets, n = {}, 0
    for i in live:
        offsets[i] = n
        n += len(gpus[i])
    placed = topo.with_rank_order([g for i in live for g in gpus[i]])
    recorded = [
        plan_recorded(j, i, topo, gpus[i], algo, spec.source, _alone_engines(base.engine), base.engine)
        for i, j in enumerate(spec.jobs)
        if j.kind != "script"
    ]
    return _Plan(spec, topo, placed, gpus, live, recorded, offsets)


def _nccl_env_of(base: RunConfig, job: JobSpec) -> tuple[tuple[str, str], ...]:
    """The NCCL_* a live job's ranks start with: the run's (os.environ, the run's env), overridden by the job's `env`
    table. Where they differ from the run's, its ranks send them with each collective (runtime/program_env.py)."""
    return nccl_env({**os.environ, **base.env, **job.env})


def _check_nccl_env(spec: JobsSpec, job: JobSpec, base: RunConfig) -> None:
    """A bad NCCL_* value in a job's `env` table: one line naming the job and the variable."""
    if not any(k in job.env for k, _ in _nccl_env_of(base, job)):
        return
    try:
        settings_of(_nccl_env_of(base, job))
    except InputError as exc:
        if exc.field not in job.env:
            raise  # the run's own environment: its error as a single run's
        raise InputError(f"job '{job.name}': {exc.message}", **spec.where(job), field=f"env.{exc.field}") from None


def _alone_engines(engine: EngineSpec) -> Callable[[Topology], NetworkSimulator]:
    """Engines as the run's, without its scenario (the job alone), for a workload job's runs that rate its NCCL groups
    (`plan_recorded`)."""
    from bridge.workers import spawn_workers
    from phantora.netsim.factory import make_engine

    alone = dataclasses.replace(engine, scenario=None)
    return lambda topo: make_engine(alone, topo, spawner=spawn_workers)


def _job_env(
    base: RunConfig, job: JobSpec, out: Path, model_opts: tuple[str, tuple[str, ...], str | None]
) -> dict[str, str]:
    """A live job's rank options (its own output directory, start, step count, tensor mode) and environment."""
    phantom = base.tensors == "phantom" or (base.tensors == "auto" and (job.ranks or 0) > PHANTOM_ABOVE)
    opts = rank_options(base, base.gpu or "h100", out, model_opts, phantom)
    opts.start_ns, opts.max_steps = job.start_ns, job.steps
    return {**opts.to_env(), **base.env, **job.env}


def launch_jobs(
    spec: JobsSpec,
    base: RunConfig,
    *,
    alone: bool = False,
    on_step: Callable[[str, dict[str, Any]], None] | None = None,
    algo: AlgoOptions | None = None,
    live_ok: bool = True,
) -> JobsReport:
    """Run every job of `spec` on one fabric with the run-level options of `base` (its script is unused).

    Raises BridgeError if the run fails as a whole (all_or_nothing, or the engine); a job that fails alone
    is reported in results.json (`JobsReport.summary["jobs"]`, its status and error). `algo`: the collective
    options of every job, live and recorded (None: the defaults; a graph's, those it was recorded with).
    `live_ok=False` refuses script jobs (`phantora replay --jobs`)."""
    check_trace_level(base.trace)
    check_trace_steps(base.trace_steps)
    topo = resolve_topology(base.topology, base.gpu, "phantora run")
    base = dataclasses.replace(base, gpu=topo.gpu_model or "h100")
    gpu = get_gpu(base.gpu or "h100")
    engine = base.engine
    packet = engine.packet_used
    if engine.ecmp_hash:
        topo.use_ecmp(engine.ecmp_hash)
    model_opts = compute_model_options(base)
    if not live_ok:
        live = next((j for j in spec.jobs if j.kind == "script"), None)
        if live is not None:
            raise InputError(
                f"job '{live.name}' is a training script: run it with phantora run --jobs",
                **spec.where(live),
                field="script",
            )
    scenario = load_jobs_scenario(engine.scenario, topo) if engine.scenario else None
    plan = _check(spec, base, topo, algo)
    keep = base.out_dir is not None
    if base.out_dir is not None:
        out = RunDir.claim(base.out_dir, overwrite=base.overwrite).root
    else:
        from bridge.transport import make_run_dir

        out = make_run_dir()
    rd = RunDir(out)
    ctx = _Ctx(plan, base, rd, {j.name: rd.job(j.name) for j in spec.jobs}, algo, scenario)
    try:
        rd.running(jobs=[j.name for j in spec.jobs])
        skip = ("command", "python", "on_step", "script", "args", "rerun_of")
        options = {
            "jobs_file": spec.source,
            "jobs": [dataclasses.asdict(j) for j in spec.jobs],
            "all_or_nothing": spec.all_or_nothing,
            "alone": alone,
            **config_options(base, skip),
        }
        files = {"--jobs": spec.source, **{f"job {j.name}": j.source for j in spec.jobs}}
        provenance.write_config(out, options=options, topo=topo, packet=packet, command=base.command,
                                inputs=files, rerun_of=base.rerun_of, env={**os.environ, **base.env})  # fmt: skip
        t0 = time.monotonic()
        try:
            report = _run(ctx, gpu, engine, model_opts, on_step)
            if alone:
                _alone(ctx, report, on_step)
            report.summary["run"]["wall_s"] = time.monotonic() - t0
            rd.write_json(S.RESULTS_JSON, report.summary, indent=1, sort_keys=False)
        except BaseException as exc:
            rd.failed(exc)
            for d in ctx.job_dirs.values():  # the jobs the failure cut short
                if (d.status() or {}).get("state") == "running":
                    d.failed(exc)
            raise
        failed = [n for n, j in report.jobs.items() if j["job"]["status"] != "complete"]
        rd.complete(jobs_failed=failed, wall_s=time.monotonic() - t0)
        report.out_dir = out if keep else None
        return report
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)


# ----- the shared run ---------------------------------------------------------------------------------------
def _run(
    ctx: _Ctx,
    gpu: Any,
    engine: EngineSpec,
    model_opts: Any,
    on_step: Callable[[str, dict[str, Any]], None] | None,
) -> JobsReport:
    plan, base = ctx.plan, ctx.base
    spec, topo = plan.spec, plan.topo
    background = merge(plan.recorded)
    for d in ctx.job_dirs.values():
        d.root.mkdir(parents=True, exist_ok=True)
    if not plan.live:
        return _run_inprocess(ctx, background, engine)
    from bridge.run import CosimRun

    procs = []
    for i in plan.live:
        j = spec.jobs[i]
        cmd = [base.python, "-m", "phantora.runtime.bootstrap", j.source, *j.args]
        env = _job_env(base, j, ctx.job_dirs[j.name].root, model_opts)
        procs.append(JobProcs(j.name, j.ranks or 0, cmd, env, j.traffic_class))
        ctx.job_dirs[j.name].running(script=j.source, args=j.args, world_size=j.ranks)
    watchers = []
    if on_step is not None:
        for i in plan.live:
            name, n = spec.jobs[i].name, spec.jobs[i].ranks or 0
            watchers.append(ctx.job_dirs[name].step_watcher(n, _tell(on_step, name)))
    shared = _job_env(base, dataclasses.replace(spec.jobs[plan.live[0]], env={}), ctx.out.root, model_opts)
    try:
        cosim = CosimRun(
            topo,
            engine,
            jobs=procs,
            all_or_nothing=spec.all_or_nothing,
            background=background,
            algo=ctx.algo,
            env={**import_time_env(shared), **base.env},  # the fork server's too
            rank_env=shared,
            out_dir=ctx.out.root,
            timeout_s=base.timeout_s,
            keep_flows=True,
            rank_preload=RANK_PRELOAD if base.fork_server else (),
            on_progress=base.on_network,  # (the network's progress from inside long engine calls)
        ).run()
    finally:
        for w in watchers:
            w.stop()
    jobs: dict[str, dict[str, Any]] = {}
    flows: list[JobFlow] = []
    link_use: dict[str, dict[int, int]] = {}
    owner: dict[int, tuple[str, int, int]] = {}  # live flow id -> its job, ECMP key, class
    for rec in cosim.collectives:
        info = spec.jobs[plan.live[rec["job"]]]
        for k in range(rec["flows"]):
            owner[rec["first_flow"] + k] = (info.name, rec["key0"] + k, info.traffic_class or DEFAULT_CLASS)
    for n, i in enumerate(plan.live):
        j = spec.jobs[i]
        off, outcome = plan.offsets[i], cosim.jobs[n]
        ranks = {g - off: cosim.ranks[g] for g in range(off, off + (j.ranks or 0)) if cosim.ranks.get(g) is not None}
        doc = _live_job_results(j, ranks, gpu, ctx.job_dirs[j.name], outcome)
        own = [r for r in cosim.collectives if r["job"] == n]
        # as `phantora run`'s, with the NCCL_* the job's ranks started with (the run's and its `env` table's: the
        # model took them from its records' `nccl_env`), and those the job's program set itself
        doc["nccl"] = summarize_choices(own, _nccl_env_of(base, j))
        doc["collectives"] = [  # its group in the job's own ranks (compare leaves a group of one out of its means)
            {
                "name": r["name"],
                "kind": r["kind"],
                "group": [g - off for g in r["group"]],
                "t_start": r["t_start"],
                "end_ns": r["end_ns"],
            }
            for r in own
        ]
        jobs[j.name] = doc
        link_use[j.name] = dict(outcome.get("channel_bytes") or [])
    live_done = [c for c in cosim.completions if c.flow_id in owner]
    transport = cosim.transport or None  # the packet engine's per-flow counters (None: not measured)
    for c in live_done:
        name, key, prio = owner[c.flow_id]
        nic = alone_of(cosim.alone, c.flow_id).via_nic
        flows.append(JobFlow(name, c.src, c.dst, key, c.size, prio, c.start_ns, c.end_ns, nic))
    for i in plan.live:
        name = spec.jobs[i].name
        mine = [c for c in live_done if owner[c.flow_id][0] == name]
        mine_flows = _as_flows(mine, owner, cosim.alone)
        write_flows_csv(ctx.job_dirs[name].file(S.FLOWS_CSV), topo, mine, flows=mine_flows, transport=transport)
    _recorded_results(ctx, cosim.background, cosim.engine_stats, jobs, flows, link_use)
    keyed = _as_flows(live_done, owner, cosim.alone)
    everyone = [*live_done, *(c for c in cosim.background if c.size)]
    alone = flow_alone(background)  # the recorded jobs' flows (ids below the live ones')
    write_flows_csv(ctx.out.file(S.FLOWS_CSV), topo, everyone, flows=keyed, transport=transport, alone=alone)
    warned = engine_warnings(ctx.out.root, cosim.warnings)
    summary = _summary(ctx, jobs, cosim.makespan_ns, cosim.engine_stats, cosim.sim_wall_s, cosim.rounds, warned)
    if ctx.scenario is not None:
        section = live_jobs_section(ctx.scenario, topo, cosim.scenario, cosim.engine_stats, cosim.makespan_ns)
        summary["scenario"] = add_job_phases(section, jobs, cosim.makespan_ns)
    _fabric(ctx, summary, flows, link_use, cosim.makespan_ns)
    _idle(ctx, summary, everyone)
    live = {spec.jobs[i].name: job_comm_args(cosim.collectives, n, plan.offsets[i]) for n, i in enumerate(plan.live)}
    _traces(ctx, jobs, summary.get("scenario"), live)
    return JobsReport(summary, jobs, cosim.logs, ctx.out.root)


def _tell(on_step: Callable[[str, dict[str, Any]], None], name: str) -> Callable[[dict[str, Any]], None]:
    return lambda line: on_step(name, line)


DEFAULT_CLASS = 3  # the engines' traffic class of a flow that names none (Flow.priority)


def _live_job_results(
    j: JobSpec, ranks: dict[int, Any], gpu: Any, d: RunDir, outcome: dict[str, Any]
) -> dict[str, Any]:
    """A live job's results.json (as `phantora run` writes it) and status.json."""
    steps = d.merge_steps(range(j.ranks or 0))
    err = outcome.get("error")
    if err is None:
        doc = summarize(ranks, gpu)
        d.complete(steps_finished=len(steps))
    else:  # a failed job: the steps its ranks logged before it ended
        doc = {
            "schema": S.RUN,
            "world_size": j.ranks,
            "start_ns": j.start_ns,
            "steps": [{"index": s["step"], "end_ns": s["end_ns"], "time_ns": s["time_ns"]} for s in steps],
        }
        if steps:
            doc["end_ns"] = steps[-1]["end_ns"]
        d.failed(reason=err["text"].splitlines()[0], code=err["code"], steps_finished=len(steps))
    doc["job"] = {"status": "failed" if err else "complete", **({"error": err} if err else {})}
    return doc


def _recorded_results(
    ctx: _Ctx,
    done: Sequence[Completion],
    stats: dict[str, Any],
    jobs: dict[str, Any],
    flows: list[JobFlow],
    link_use: dict[str, dict[int, int]],
) -> None:
    """Each recorded job's results from its flows' completions, and its flows for the fabric tables."""
    for rec in ctx.plan.recorded:
        name = rec.spec.name
        mine = rec.local(done)
        if len(mine) != len(rec.flows):
            raise InputError(f"job '{name}': {len(rec.flows) - len(mine)} of its flows never completed")
        doc = rec.results(mine, stats)
        doc["job"] = {"status": "complete"}
        jobs[name] = doc
        prio = rec.spec.traffic_class or DEFAULT_CLASS
        alone = flow_alone(rec.flows)  # its flows' own ECMP keys (an NCCL flow's: its connection's) and caps
        jf = [
            JobFlow(name, c.src, c.dst, a.key, c.size, prio, c.start_ns, c.end_ns, a.via_nic)
            for c in mine
            for a in (alone_of(alone, c.flow_id),)
        ]
        flows.extend(jf)
        link_use[name] = channel_bytes(ctx.plan.topo, jf)
        write_flows_csv(ctx.job_dirs[name].file(S.FLOWS_CSV), ctx.plan.topo, [c for c in mine if c.size], alone=alone)
        ctx.job_dirs[name].complete(steps_finished=len(doc.get("steps", [])))


def _run_inprocess(ctx: _Ctx, background: list[Any], engine: EngineSpec) -> JobsReport:
    """Only recorded jobs: one DAG on one engine in this process."""
    from bridge.workers import spawn_workers
    from phantora.netsim.factory import make_engine
    from phantora.replay import run_engine

    t0 = time.monotonic()
    sim = make_engine(engine, ctx.plan.topo, spawner=spawn_workers, scenario=ctx.scenario)
    section = None
    try:
        done = run_engine(sim, background)
        if ctx.scenario is not None:
            section = recorded_jobs_section(ctx.scenario, ctx.plan.topo, sim, done, flow_alone(background))
        stats = {str(k): v for k, v in dict(sim.stats()).items() if isinstance(v, (int, float, str, bool))}
        makespan = max((c.end_ns for c in done), default=0)
        fabric = sim.fabric()
        if fabric is not None:
            write_fabric_traces(ctx.out.root, fabric, ctx.plan.topo, makespan, engine)
    finally:
        sim.close()
    jobs: dict[str, dict[str, Any]] = {}
    flows: list[JobFlow] = []
    link_use: dict[str, dict[int, int]] = {}
    _recorded_results(ctx, done, stats, jobs, flows, link_use)
    write_flows_csv(ctx.out.file(S.FLOWS_CSV), ctx.plan.topo, [c for c in done if c.size], alone=flow_alone(background))
    summary = _summary(ctx, jobs, makespan, stats, time.monotonic() - t0, 0, engine_warnings(ctx.out.root, []))
    if section is not None:
        summary["scenario"] = add_job_phases(section, jobs, makespan)
    _fabric(ctx, summary, flows, link_use, makespan)
    _idle(ctx, summary, done)
    _traces(ctx, jobs, summary.get("scenario"))
    return JobsReport(summary, jobs, {}, ctx.out.root)


# ----- results ------------------------------------------------------------------------------------------------
def _summary(
    ctx: _Ctx,
    jobs: dict[str, dict[str, Any]],
    makespan: int,
    stats: dict[str, Any],
    wall: float,
    rounds: int,
    warned: dict[str, Any],
) -> dict[str, Any]:
    """The top-level results.json; each job's results.json gets its run section and is written. `warned`: the
    engine's {"warnings": [...]} (`launcher.engine_warnings`), in both, as a single run's results.json has them."""
    plan, base = ctx.plan, ctx.base
    spec, topo = plan.spec, plan.topo
    rows = []
    for i, j in enumerate(spec.jobs):
        doc = jobs[j.name]
        names = [plan.natural.nodes[plan.natural.endpoints[g]].name for g in plan.gpus[i]]
        doc["run"] = {
            "job": j.name,
            "kind": j.kind,
            "source": j.source,
            "args": j.args,
            "ranks": j.ranks,
            "gpus": names,
            "start_ns": j.start_ns,
            "steps": j.steps,
            "traffic_class": j.traffic_class,
            "topology": topo.name,
            "network": base.engine.network,
            "cc": run_cc(base.engine),
            "gpu": base.gpu,
        }
        others = [x.name for x in spec.jobs if x.name != j.name]
        doc["network"] = {"makespan_ns": makespan, "engine_stats": stats, "shared_with": others, **warned}
        t, what = job_time_ns(doc)
        rows.append(
            {
                "name": j.name,
                "kind": j.kind,
                "status": doc["job"]["status"],
                "error": doc["job"].get("error"),
                "ranks": j.ranks,
                "gpus": names,
                "start_ns": j.start_ns,
                "traffic_class": j.traffic_class,
                "time_ns": t,
                "time_kind": what,
                "steps": len(doc.get("steps", [])),
                "end_ns": doc.get("end_ns"),
            }
        )
        ctx.job_dirs[j.name].write_json(S.RESULTS_JSON, doc, indent=1)
    run = {
        "jobs_file": spec.source,
        "topology": topo.name,
        "network": base.engine.network,
        "cc": run_cc(base.engine),
        "window_ns": base.engine.window_ns,
        "gpu": base.gpu,
        "all_or_nothing": spec.all_or_nothing,
        "rounds": rounds,
        "wall_s": wall,
    }
    return {"schema": JOBS, "run": run, "makespan_ns": makespan, "engine_stats": stats, "jobs": rows, **warned}


def _idle(ctx: _Ctx, summary: dict[str, Any], done: list[Completion]) -> None:
    """Packet mode: results.json's `idle_fabric` when the jobs' traffic left the switches (almost) idle."""
    from phantora.results.idle import given_settings, idle_fabric_on, traffic_of

    if ctx.base.engine.network != "ns3":
        return
    topo = ctx.plan.topo
    idle = idle_fabric_on(topo, traffic_of(topo, done), *given_settings(ctx.base.engine.packet))
    if idle:
        summary["idle_fabric"] = idle


def _fabric(
    ctx: _Ctx, summary: dict[str, Any], flows: list[JobFlow], link_use: dict[str, dict[int, int]], makespan: int
) -> None:
    """links_by_job.csv (and each job's links.csv, utilisation over the job's own span), and PFC pauses per
    job (packet mode)."""
    topo = ctx.plan.topo
    rows = link_rows(topo, link_use, makespan)
    write_csv(ctx.out.file(LINKS_BY_JOB_CSV), LINK_COLUMNS, rows)
    for row in summary["jobs"]:
        span = (row.get("end_ns") or makespan) - row["start_ns"]
        mine = link_rows(topo, {row["name"]: link_use.get(row["name"], {})}, span)
        write_csv(
            ctx.job_dirs[row["name"]].file(S.LINKS_CSV),
            S.LINK_COLUMNS,
            [r[:7] + r[8:] + [""] * len(S.LINK_EXTRA_COLUMNS) for r in mine],
        )
    fabric: dict[str, Any] = {"links_by_job": LINKS_BY_JOB_CSV}
    per_job = {name: {"bytes": sum(ch.values()), "links": len(ch)} for name, ch in link_use.items()}
    pfc = ctx.out.file(S.PFC_CSV)
    if pfc.is_file():
        raw = read_pfc_rows(pfc)
        by_job = pfc_by_job(topo, flows, pause_spans(raw, makespan))
        for name in per_job:
            per_job[name].update(by_job.get(name, {"pauses_suffered": 0, "paused_ns_suffered": 0, "pauses_caused": 0}))
        fabric["pfc_pauses"] = sum(1 for r in raw if r[4])
    fabric["jobs"] = per_job
    summary["fabric"] = fabric


def _traces(
    ctx: _Ctx,
    jobs: dict[str, dict[str, Any]],
    scenario: dict[str, Any] | None,
    comm_args: dict[str, dict[CommKey, dict[str, Any]]] | None = None,
) -> None:
    """trace.json of each live job (its ranks, each collective with NCCL's choice: `comm_args` by job) and of the run
    (every job's ranks and network lanes, and the scenario's events as a single-job run draws them), streamed: each
    job's trace.json is copied into the run's an event at a time. A live job past `--trace-steps` says so in both;
    a failed job's trace is marked partial, with the steps each of its ranks finished, as a failed run's is."""
    from phantora.results.write import atomic_text

    plan, parts = ctx.plan, []
    most = 0  # the most steps of a live job: the run's note if past the cap
    for i, j in enumerate(plan.spec.jobs):
        steps = len(jobs[j.name].get("steps") or []) if j.kind == "script" else 0
        most = max(most, steps)
        failed = (jobs[j.name].get("job") or {}).get("status") == "failed"  # its trace says which steps it holds
        merged = ctx.job_dirs[j.name].merge_trace(  # -> jobs/<name>/trace.json
            partial=failed, comm_args=(comm_args or {}).get(j.name), notes=_trace_notes(ctx.base, steps)
        )
        parts.append(JobTrace(j.name, i, plan.offsets.get(i, 0), merged, jobs[j.name].get("collectives") or []))
    extra: list[dict[str, Any]] = []
    if scenario is not None:
        from phantora.results.scenario_live import trace_events

        extra = trace_events(scenario)
    with atomic_text(ctx.out.file(S.TRACE_JSON)) as f:
        write_jobs_trace(f, parts, extra, _trace_notes(ctx.base, most))


# ----- alone ------------------------------------------------------------------------------------------------
def _alone(ctx: _Ctx, report: JobsReport, on_step: Callable[[str, dict[str, Any]], None] | None) -> None:
    """Run each job by itself (same GPUs, engine, class, start) into alone/<name>/; slowdown = shared / alone."""
    plan, base = ctx.plan, ctx.base
    tell = None if on_step is None else (lambda job, line: on_step(f"{job} (alone)", line))
    for i, j in enumerate(plan.spec.jobs):
        one = dataclasses.replace(j, placement=list(plan.gpus[i]))
        sub = JobsSpec([one], all_or_nothing=True, source=plan.spec.source)
        where = ctx.out.alone(j.name)
        cfg = dataclasses.replace(base, out_dir=where.root, overwrite=True)
        try:
            got = launch_jobs(sub, cfg, alone=False, algo=ctx.algo, on_step=tell)
            t_alone = got.summary["jobs"][0]["time_ns"]
            err = None
        except Exception as exc:  # noqa: BLE001 - a failed baseline is reported, not fatal
            t_alone, err = None, str(exc).splitlines()[0]
        row = report.summary["jobs"][i]
        row["alone_time_ns"] = t_alone
        row["slowdown"] = row["time_ns"] / t_alone if t_alone and row.get("time_ns") is not None else None
        if err:
            row["alone_error"] = err
        report.jobs[j.name]["alone"] = {
            "dir": str(where.job(j.name).root),
            "time_ns": t_alone,
            "slowdown": row["slowdown"],
        }
        ctx.job_dirs[j.name].write_json(S.RESULTS_JSON, report.jobs[j.name], indent=1)


def format_jobs(summary: dict[str, Any]) -> str:
    """The jobs table: status, time (step or span), alone and slowdown, traffic and PFC by job."""
    r = summary["run"]
    lines = [
        f"{len(summary['jobs'])} jobs on {r['topology']}, network {r['network']}"
        + (f" ({r['cc']})" if r.get("cc") else "")
        + f": makespan {summary['makespan_ns'] / 1e6:.3f} ms, wall {r.get('wall_s', 0.0):.1f} s",
    ]
    fab = (summary.get("fabric") or {}).get("jobs", {})
    head = f"  {'job':<12} {'kind':<8} {'ranks':>5} {'status':<8} {'time ms':>10} {'alone ms':>10} {'slowdown':>8}"
    head += f" {'GB sent':>8} {'pauses suffered/caused':>22}"
    lines += [head]
    for j in summary["jobs"]:
        t = j.get("time_ns")
        alone = j.get("alone_time_ns")
        slow = j.get("slowdown")
        f = fab.get(j["name"], {})
        pauses = f"{f['pauses_suffered']}/{f['pauses_caused']}" if "pauses_suffered" in f else "-"
        lines.append(
            f"  {j['name']:<12} {j['kind']:<8} {j['ranks'] or 0:>5} {j['status']:<8} "
            + (f"{t / 1e6:>10.3f}" if t is not None else f"{'-':>10}")
            + (f" {alone / 1e6:>10.3f}" if alone is not None else f" {'-':>10}")
            + (f" {slow:>7.3f}x" if slow is not None else f" {'-':>8}")
            + f" {f.get('bytes', 0) / 1e9:>8.3f} {pauses:>22}"
        )
        if j.get("error"):
            lines += _failure_lines(j["name"], j["error"])
    note = "the steady step time (mean over the steps after the first)"
    one = [j["name"] for j in summary["jobs"] if j.get("steps") == 1]
    if one:
        note += f"; {', '.join(one)}: one step, timed from the job's start"
    if any(j.get("time_kind") == "span" for j in summary["jobs"]):
        note += "; a job without steps: its span (end - start)"
    lines.append(f"  time: {note}")
    if summary.get("idle_fabric"):
        lines.append(f"note: {summary['idle_fabric']['text']}")
    lines += [f"warning: {w}" for w in summary.get("warnings", [])]  # the engine's (as a single run's summary)
    if summary.get("scenario"):
        from phantora.results.scenario import format_scenario

        lines.append(format_scenario(summary["scenario"]))
    return "\n".join(lines)


def _failure_lines(name: str, error: dict[str, str]) -> list[str]:
    """A failed job's lines in the table: the failure, then its rank's own verdict on the cause (the exception and
    where the script raised it, from the rank's log), when the rank wrote one."""
    text = error["text"].splitlines()
    lines = [f"    failed ({error['code']}): {text[0]}"]
    verdict = next((ln for ln in reversed(text[1:]) if re.match(r"phantora: rank \d+ failed", ln)), None)
    if verdict is not None:  # "phantora: rank 0 failed (at train.py:12 in <module>): RuntimeError: ..."
        rank, _, rest = verdict.removeprefix("phantora: ").partition(" failed")
        lines.append(f"    {rank} of job {name} failed{rest}")
    return lines


def _as_flows(
    done: list[Completion], owner: dict[int, tuple[str, int, int]], alone: dict[int, Alone]
) -> dict[int, Flow]:
    """Each live flow with the ECMP key and traffic class its job gave it and its rate cap, for flows.csv."""
    return {
        c.flow_id: Flow(
            c.flow_id,
            c.src,
            c.dst,
            c.size,
            key=owner[c.flow_id][1],
            priority=owner[c.flow_id][2],
            rate_bps=alone_of(alone, c.flow_id).rate_bps,
            via_nic=alone_of(alone, c.flow_id).via_nic,
        )
        for c in done
    }
