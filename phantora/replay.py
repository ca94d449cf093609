"""In-process replay of a workload on a network engine.

The whole workload becomes one static flow DAG, submitted at t = 0 and drained, so the engine
(flow-level or ns-3) resolves every dependency itself, with no Python call per flow. The issue
rule of `phantora.workload` is encoded with zero-byte *marker* flows (src == dst), which every
engine completes after their delay alone:

- ``at`` marker of op B: no deps, delay = B.at;
- ``issue`` marker of (B, r): deps = the flows that finish rank r's part of each A in B.after
  that r takes part in, delay = B.gap;
- ``start`` marker of B: deps = the at marker and every issue marker. B's own root flows depend
  on it, so B starts at max(at, max_r(done_r(A) + gap)), the latest issue time of its ranks.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from phantora.collectives import FlowDag, collective_metrics
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.dag_memo import DagMemo
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow, NetworkSimulator, RunsWholeDag, drain_observed
from phantora.netsim.decompose import FREEZE_MIN
from phantora.netsim.gc_pause import Freezer, gc_paused
from phantora.perfmodel.throttle import Throttles
from phantora.progress import Progress
from phantora.replay_groups import grouped_ops, planned, rated, ratings_of
from phantora.topology.model import Topology
from phantora.workload import Workload, WorkloadOp

MARKER = "marker"


@dataclass
class OpRecord:
    """What happened to one op of a replayed workload."""

    name: str
    kind: str
    nbytes: int
    nranks: int
    start_ns: int
    end_ns: int
    rank_done_ns: dict[int, int]
    flows: int
    metrics: dict[str, float] = field(default_factory=dict)
    nccl: dict[str, object] | None = None  # NCCL's algorithm, protocol and channels for it (collectives.nccl)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class ReplayPlan:
    """The flat DAG of a workload, and which flows belong to which op."""

    flows: list[Flow]
    op_flows: dict[str, range]  # op name -> ids of its own (non-marker) flows
    op_start_marker: dict[str, int]
    op_rank_last: dict[str, dict[int, list[int]]]
    op_choice: dict[str, dict[str, object]] = field(default_factory=dict)  # op name -> NCCL's choice


@dataclass
class ReplayResult:
    """Per-op records, every completion, and engine stats of a replay."""

    ops: list[OpRecord]
    completions: list[Completion]
    makespan_ns: int
    engine_stats: dict[str, object]
    wall_s: float
    flows: list[Flow] = field(default_factory=list)  # the planned DAG, markers included


MAX_FLOWS = 5_000_000


Split = tuple[list[list[int]], list[dict[str, object]]]  # `plan_split.split_jobs`: the groups and their jobs


class DagSource(Protocol):
    """Where `plan_workload` takes each op's DAG from: a `DagMemo`, or a `plan_split.Relocated` planned elsewhere."""

    def gated(self, coll: Collective, opts: AlgoOptions, first: int, tag: str, gate: tuple[int, ...]) -> FlowDag: ...


def plan_workload(
    wl: Workload,
    topo: Topology,
    base: AlgoOptions | None = None,
    max_flows: int = MAX_FLOWS,
    dags: DagSource | None = None,
) -> ReplayPlan:
    """Decompose every op and wire the ops together with marker flows (at most `max_flows` flows); `dags`: each op's
    DAG from there (`plan_split.Relocated`: planned elsewhere), not decomposed here."""
    base = base or AlgoOptions()
    flows: list[Flow] = []
    op_flows: dict[str, range] = {}
    start_marker: dict[str, int] = {}
    rank_last: dict[str, dict[int, list[int]]] = {}
    choices: dict[str, dict[str, object]] = {}
    ops_by_name: dict[str, WorkloadOp] = {}
    next_id = 0
    if dags is None:
        dags = DagMemo(topo)  # each op's flows (a repeat's copied), the message counters over the whole workload

    def marker(node: int, deps: tuple[int, ...], delay: int, tag: str) -> int:
        nonlocal next_id
        flows.append(Flow(next_id, node, node, 0, deps, delay, tag))
        next_id += 1
        return next_id - 1

    for op in wl.ops:
        ops_by_name[op.name] = op
        anchor = topo.node_of_rank(op.coll.ranks[0])
        gate = [marker(anchor, (), op.at_ns, f"{op.name}/{MARKER}/at")]
        for r in op.coll.ranks:
            deps = tuple(fid for a in op.after if r in ops_by_name[a].coll.ranks for fid in rank_last[a].get(r, []))
            if deps or op.gap_ns:
                gate.append(marker(topo.node_of_rank(r), deps, op.gap_ns, f"{op.name}/{MARKER}/issue{r}"))
        start = marker(anchor, tuple(gate), 0, f"{op.name}/{MARKER}/start")
        start_marker[op.name] = start
        try:
            opts = dataclasses.replace(base, **op.algo) if op.algo else base  # the op's fields over the run's
            dag: FlowDag = dags.gated(op.coll, opts, next_id, op.name, (start,))
        except InputError as exc:
            raise InputError(f"op '{op.name}': {exc.message}", file=wl.source, field=exc.field) from None
        first = next_id
        if dag.choice:
            choices[op.name] = dag.choice
        flows.extend(dag.flows)
        next_id = dag.next_id
        if next_id > max_flows:
            raise InputError(
                f"op '{op.name}' brings the plan to {next_id:,} flows, over the limit of {max_flows:,}; "
                "use the coarse granularity (or fewer channels / bigger chunks) for groups this large",
                file=wl.source,
                field="granularity",
            )
        op_flows[op.name] = range(first, next_id)
        # A rank with nothing to wait on is done when the op starts.
        rank_last[op.name] = {r: (dag.rank_last.get(r) or [start]) for r in op.coll.ranks}
    return ReplayPlan(flows, op_flows, start_marker, rank_last, choices)


def plan_split_by(
    wl: Workload,
    topo: Topology,
    base: AlgoOptions | None,
    run: Callable[[list[dict[str, object]]], list[dict[str, object]]],
    split: Split | None = None,
) -> ReplayPlan | None:
    """`plan_workload`'s plan, each group of ops that shares no rank with the others planned by `run` (group jobs ->
    replies in order: `plan_split.plan_group` of each, on the decomposition's workers) and moved to the plan's ids
    here. None when the workload is one group, a collective cannot be sent, a group was refused or two groups
    touched one connection's counter (`plan_split`): the caller plans in one process. `split`: the workload's
    `plan_split.split_jobs`, if the caller has it."""
    from phantora.plan_split import Relocated, split_jobs, touched_apart

    split = split or split_jobs(wl, base or AlgoOptions())
    if split is None:
        return None
    replies = run(split[1])  # type: ignore[arg-type]
    if any("refused" in r for r in replies) or not touched_apart(replies):  # type: ignore[arg-type]
        return None
    with gc_paused():  # (the flows made are the plan's, kept: no cycles to collect)
        return plan_workload(wl, topo, base, dags=Relocated(replies))  # type: ignore[arg-type]


# A decomposition's workers plan the workload's independent groups of ops (`plan_for`): `settle_groups` gives them
# the groups as they start, before they load ns-3 (`plan_split.jobs_ahead`), so the plan does not wait for their
# start (docs/packet-model.md, "Planning per rail on the workers"); workers that were not, still starting, are not
# waited for: the driver plans. False: always in the driver
PLAN_ON_WORKERS = True


def plan_for(
    wl: Workload, topo: Topology, base: AlgoOptions | None, sim: NetworkSimulator, split: Split | None = None
) -> ReplayPlan:
    """`plan_workload`'s plan for a run on `sim`: with `PLAN_ON_WORKERS`, on a decomposition's workers where the
    workload splits into groups of ops that share no rank (`plan_split_by`, given `split` if the caller has it; `sim`
    or its packet side plans them: `plan_groups`, on its own topology, which must be `topo`), else in this process.
    The same plan either way."""
    planner = None
    for s in (sim, getattr(sim, "packet", None)) if PLAN_ON_WORKERS else ():
        theirs = getattr(s, "topology", None)
        if planner is None and (theirs is topo or (theirs is not None and theirs == topo)):
            planner = getattr(s, "plan_groups", None)
    if planner is not None:
        got = plan_split_by(wl, topo, base, lambda jobs: planner(jobs) or [{"refused": "no planner"}], split)
        if got is not None:
            return got
    return plan_here(wl, topo, base)


def plan_here(wl: Workload, topo: Topology, base: AlgoOptions | None) -> ReplayPlan:
    """`plan_workload` in this process, the cyclic GC paused (the plan's flows are kept: no cycles to collect)."""
    with gc_paused():
        return plan_workload(wl, topo, base)


def run_engine(
    sim: NetworkSimulator, flows: list[Flow], *, progress: str = "off", desc: str = "replay"
) -> list[Completion]:
    """Submit a DAG at the engine's current time and run it to the end. `progress` ("off", "bar", "lines";
    `phantora.progress`) shows flows done, the simulated time, events/s and an ETA; the engine runs the
    same events either way (`drain_observed`). An engine that runs the DAG whole (`RunsWholeDag`) reports
    nothing until it is done: the display says so, shows no ETA, and then every flow done."""
    with _kept_out_of_gc(len(flows) >= FREEZE_MIN, lambda: sim.submit(flows, at=sim.now())):
        return _drain(sim, flows, progress, desc)


@contextmanager
def _kept_out_of_gc(large: bool, submit: Callable[[], None]) -> Iterator[None]:
    """`submit()`, then the body. A large DAG (`FREEZE_MIN` flows or more, kept for the run) is submitted with the
    cyclic garbage collector paused and its objects, and the engine's books on them, are then kept out of the
    collector's full passes (`gc.freeze`) until the body ends: otherwise each full pass walks them all, and
    passes come each time a quarter more objects survive (about 15 CPU s of the 1024-GPU step's fluid NVLink
    side, `bench/bench_fluid_side.py`, none of it collected). What was frozen before stays frozen (`Freezer`)."""
    if not large:
        submit()
        yield
        return
    freezer = Freezer()
    was = gc.isenabled()
    gc.disable()
    try:
        submit()
        freezer.freeze()  # (not when the submit failed: the freeze is process-wide)
    finally:
        if was:
            gc.enable()
    try:
        yield
    finally:
        freezer.thaw()


def _drain(sim: NetworkSimulator, flows: list[Flow], progress: str, desc: str) -> list[Completion]:
    """`run_engine`'s run of the DAG submitted, with its progress display."""
    if progress == "off":
        return sim.drain()
    with Progress(progress, desc, len(flows), "flow") as bar:
        if isinstance(sim, RunsWholeDag):
            bar.write(f"[phantora] {desc}: {len(flows)} flows run whole by {sim.run_by()}: no ETA until they report")
            with beating(sim, bar):  # (their clock, events and CPU from inside the run, if they can tell)
                got = sim.drain()
            bar.update(done=len(got), sim_ns=sim.now(), events=engine_events(sim))
            return got

        def tick(got: list[Completion]) -> None:
            bar.update(add=len(got), sim_ns=sim.now(), events=engine_events(sim) if bar.shows_extras() else None)

        with beating(sim, bar):
            return drain_observed(sim, [f.id for f in flows], tick)


@contextmanager
def beating(sim: NetworkSimulator, bar: Progress) -> Iterator[None]:
    """The display moves inside a long ns-3 call too: each in-process ns-3 engine under `sim` runs its calls in
    chunks of about half a CPU second and reports its clock between two (`phantora.netsim.heartbeat`), and
    decomposition workers report theirs from inside each round (the slowest one's clock, their events and CPU)."""
    from phantora.netsim.heartbeat import attach, attach_beats, detach, detach_beats

    found = attach(sim, lambda ns: bar.beat(ns, lambda: engine_events(sim)))
    pools = attach_beats(sim, lambda b: bar.beat(b.sim_ns, lambda: b.events, workers=b))  # (the workers' events)
    try:
        yield
    finally:
        detach(found)
        detach_beats(pools)


def engine_events(sim: NetworkSimulator) -> int | None:
    """The engine's event counter, for events/s (None if it keeps none)."""
    n = sim.stats().get("events")
    return int(n) if isinstance(n, (int, float)) else None


def replay_inprocess(
    wl: Workload,
    topo: Topology,
    sim: NetworkSimulator,
    base: AlgoOptions | None = None,
    *,
    progress: str = "off",
    fresh: Callable[[], NetworkSimulator] | None = None,
    window_ns: int = 0,
) -> ReplayResult:
    """Replay a workload on an engine in this process and return per-op records. `sim` runs the plan; where the
    run shows a group transfer (`splits`) rated otherwise than the bridge rates it, `sim` is closed and engines from
    `fresh` (default: flow engines set up as `sim`) run the plan again until they agree (`replay_settled`; `window_ns`:
    as the bridge in window mode rates them)."""
    engines = [sim]
    res, last = replay_settled(wl, topo, lambda: engines.pop() if engines else (fresh or fresh_like(sim))(), base,
                               progress=progress, window_ns=window_ns)  # fmt: skip
    if last is not sim:
        last.close()
    return res


def replay_settled(
    wl: Workload,
    topo: Topology,
    make: Callable[[], NetworkSimulator],
    base: AlgoOptions | None = None,
    *,
    progress: str = "off",
    window_ns: int = 0,
) -> tuple[ReplayResult, NetworkSimulator]:
    """Replay a workload on engines from `make` and return its records and the engine of the last run (open).

    Each transfer of an NCCL group (an all_to_all's `splits`) is rated from its own start with the pairs the bridge's
    coordinator knows then (`phantora.replay_groups`), which a run's times give: while a run shows ratings other than
    those planned, the engine is closed and the workload planned again with them and run on a new one. A group's
    issues depend only on earlier ops, so each run settles the next group at least: at most one run a group more
    than the first, and one run for a workload whose groups' ranks issue together. With `window_ns`, the pairs known
    are those the bridge's coordinator knows in window mode of that window: its rounds' (`replay_groups.ratings_of`)."""
    res, sim, _ = settle_groups(wl, topo, make, base, progress=progress, window_ns=window_ns)
    return res, sim


def settle_groups(
    wl: Workload,
    topo: Topology,
    make: Callable[[], NetworkSimulator],
    base: AlgoOptions | None = None,
    *,
    progress: str = "off",
    window_ns: int = 0,
) -> tuple[ReplayResult, NetworkSimulator, Workload]:
    """`replay_settled`, and the workload with its NCCL groups rated as its last run gives (the one to plan for a run
    elsewhere: `phantora netsim --flows`)."""
    from phantora.plan_split import jobs_ahead, split_jobs

    t0 = time.perf_counter()
    for _ in range(len({op.group for op in wl.ops if op.group}) + 1):
        split = split_jobs(wl, base or AlgoOptions()) if PLAN_ON_WORKERS else None
        plan = None if split is not None else plan_here(wl, topo, base)  # (unless workers may plan: before the engine)
        with jobs_ahead(split[1] if split is not None else None):
            sim = make()  # (its decomposition's local workers, if any, plan the groups as they start)
        try:
            plan = plan or plan_for(wl, topo, base, sim, split)
            completions = run_engine(sim, plan.flows, progress=progress)
            res = evaluate_workload(wl, plan, completions, dict(sim.stats()), time.perf_counter() - t0)
        except BaseException:
            sim.close()
            raise
        if not grouped_ops(wl):
            return res, sim, wl
        starts, done = {r.name: r.start_ns for r in res.ops}, {r.name: r.rank_done_ns for r in res.ops}
        ratings = ratings_of(wl, starts, done, window_ns)
        if ratings == planned(wl):
            return res, sim, wl
        sim.close()
        wl = rated(wl, ratings)
    raise RuntimeError(f"{wl.source}: the ratings of the workload's NCCL groups did not settle")


def fresh_like(sim: NetworkSimulator) -> Callable[[], NetworkSimulator]:
    """Flow engines set up as `sim`, for a replay's further runs (`replay_inprocess`, `egraph.replay_graph`); another
    engine needs the caller's."""
    from phantora.netsim.factory import flow_engine_like
    from phantora.netsim.flow import FlowSimulator

    if type(sim) is not FlowSimulator:
        raise InputError(
            f"the replay's NCCL groups of transfers need another run, and it got no `fresh` engines like its "
            f"{type(sim).__name__} (or use replay_settled / replay_graph_settled)",
            field="fresh",
        )
    return lambda: flow_engine_like(sim)


def evaluate_workload(
    wl: Workload, plan: ReplayPlan, completions: list[Completion], stats: dict[str, object], wall: float
) -> ReplayResult:
    """Per-op records of a planned workload from the completions of its flows (ids as planned)."""
    end_of = {c.flow_id: c.end_ns for c in completions}
    missing = len(plan.flows) - len(end_of)
    if missing:
        raise RuntimeError(f"the engine finished with {missing} flows never completed")
    records = []
    for op in wl.ops:
        start = end_of[plan.op_start_marker[op.name]]
        ids = plan.op_flows[op.name]
        end = max((end_of[i] for i in ids), default=start)
        done = {r: max(end_of[i] for i in fids) for r, fids in plan.op_rank_last[op.name].items()}
        rec = OpRecord(op.name, op.coll.kind, op.coll.nbytes, op.coll.size, start, end, done, len(ids))
        rec.metrics = collective_metrics(op.coll, rec.duration_ns)
        rec.nccl = plan.op_choice.get(op.name)
        records.append(rec)
    real_ids = {i for ids in plan.op_flows.values() for i in ids}
    real = [c for c in completions if c.flow_id in real_ids]
    makespan = max((c.end_ns for c in completions), default=0)
    return ReplayResult(records, real, makespan, stats, wall, plan.flows)


def compute_stretch(throttles: Throttles, topo: Topology) -> Callable[[Flow, int], int]:
    """The flow engine's `stretch` for slow GPUs (scenario gpu_slow): a marker flow's delay on a rank's node
    is that rank's compute (a workload's gaps, a graph's kernels), stretched from its release by the rank's
    throttle; a workload's `at` markers hold absolute times and stay as they are."""
    rank_of = {node: r for r, node in enumerate(topo.endpoints)}
    at_suffix = f"/{MARKER}/at"

    def stretch(f: Flow, release_ns: int) -> int:
        if f.size or f.src != f.dst or not f.delay_ns or f.tag.endswith(at_suffix) or is_credit(f):
            return f.delay_ns  # not compute: an absolute time, or a slot's credit on its way back
        r = rank_of.get(f.src)
        return f.delay_ns if r is None else throttles.stretch(r, release_ns, f.delay_ns)

    return stretch
