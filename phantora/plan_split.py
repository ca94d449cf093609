"""A workload planned in independent groups of ops, each group anywhere, then put back in the one-process plan's ids.

Issue 38, item 2, docs/packet-model.md "What moves where" (a). `plan_workload` gives each op a contiguous id range
and threads one state through the ops: the message counters per network connection (`DagMemo.sent`). Ops that share
no rank, directly or through other ops (`op_groups`), wait on nothing of each other, and their decompositions touch
disjoint counters, so each group can be planned alone from id 0 (`plan_group`: what a worker runs, its flows sent
as columns by `bridge.plan_groups`) and its flows moved to the ids the one-process plan gives them (`Relocated`, a
`DagMemo` stand-in for `plan_workload`): the flows with no deps wait on `GATE` there, the op's start marker here.
The counters each group read or moved are reported, and a plan whose groups touched a common connection is refused
(`touched_apart`): the caller plans in one process then. Collectives and options cross as plain maps
(`coll_to_wire`, `opts_to_wire`); one that does not come back equal (a `LaunchGroup`) is not shipped.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import msgpack

from phantora.collectives.dag import FlowDag
from phantora.collectives.dag_memo import DagMemo, _Counters
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import Flow, _Slots
from phantora.topology.model import Topology
from phantora.workload import Workload

GATE = -1  # a group's stand-in for an op's start marker (the deps of its flows that have none)

# groups of ops the decomposition workers started inside `jobs_ahead` plan as they start (`bridge.workers`)
_AHEAD: ContextVar[list[dict[str, Any]] | None] = ContextVar("phantora_plan_ahead", default=None)

FLOW_COLUMNS = ("src", "dst", "size", "delay", "tag", "prio", "key", "budget", "rate", "conn", "queue", "nic")


def op_groups(wl: Workload) -> list[list[int]]:
    """The workload's ops (indices) in groups that share no rank, each in workload order, the groups by first op."""
    parent = list(range(len(wl.ops)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, op in enumerate(wl.ops):
        for r in op.coll.ranks:
            j = owner.setdefault(r, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(wl.ops)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def _plain(v: Any) -> Any:
    return [_plain(x) for x in v] if isinstance(v, (tuple, list)) else v


def _tupled(v: Any) -> Any:
    return tuple(_tupled(x) for x in v) if isinstance(v, list) else v


def _to_wire(obj: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _from_wire(cls: Any, d: dict[str, Any]) -> Any:
    fields = {f.name: "tuple" in str(f.type) for f in dataclasses.fields(cls)}
    return cls(**{k: _tupled(v) if fields.get(k) else v for k, v in d.items()})


def coll_to_wire(coll: Collective) -> dict[str, Any] | None:
    """`coll` as a plain map, or None when it would not come back equal (`coll_from_wire`): a `LaunchGroup`."""
    if coll.launch is not None:
        return None
    d = _to_wire(coll)
    return d if coll_from_wire(d) == coll else None


def coll_from_wire(d: dict[str, Any]) -> Collective:
    """The collective of `coll_to_wire`'s map."""
    return _from_wire(Collective, d)  # type: ignore[no-any-return]


def opts_to_wire(opts: AlgoOptions) -> dict[str, Any]:
    """`opts` as a plain map (`opts_from_wire`)."""
    return _to_wire(opts)


def opts_from_wire(d: dict[str, Any]) -> AlgoOptions:
    """The options of `opts_to_wire`'s map."""
    return _from_wire(AlgoOptions, d)  # type: ignore[no-any-return]


def group_job(wl: Workload, ops: Sequence[int], opts: Sequence[AlgoOptions]) -> dict[str, Any] | None:
    """What a planner of the group `ops` is sent: each op's name, collective and options (`opts[i]`: op i's, over the
    run's), and this process's NCCL_* variables; None when a collective cannot be sent (`coll_to_wire`)."""
    out = []
    for i in ops:
        op = wl.ops[i]
        coll = coll_to_wire(op.coll)
        if coll is None:
            return None
        out.append({"name": op.name, "coll": coll, "opts": opts_to_wire(opts[i])})
    return {"ops": out, "env": sorted([k, v] for k, v in os.environ.items() if k.startswith("NCCL_"))}


class _Touched(_Counters):
    """`DagMemo`'s counters that note every connection read or moved."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, int, int, int]] = set()

    def get(self, key: tuple[int, int, int, int], default: Any = None) -> Any:  # type: ignore[override]
        self.seen.add(key)
        return super().get(key, default)

    def __setitem__(self, key: tuple[int, int, int, int], value: int) -> None:
        self.seen.add(key)
        super().__setitem__(key, value)


@contextmanager
def _nccl_env(env: Sequence[Sequence[str]]) -> Iterator[None]:
    """This process's NCCL_* variables set to `env` (the planning side's) inside."""
    before = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    for k in before:
        del os.environ[k]
    os.environ.update({str(k): str(v) for k, v in env})
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("NCCL_")]:
            del os.environ[k]
        os.environ.update(before)


def plan_group(topo: Topology, job: dict[str, Any]) -> dict[str, Any]:
    """Plan `group_job`'s ops in order from id 0, as `plan_workload` would with nothing else planned: per op its first
    id, flow count, ranks' last flows, NCCL's choice and its DAG (``dag``; the deps of flows with none: `GATE`), and
    every connection the group's counters read or moved (``touched``). A choice that would not cross msgpack equal,
    or an op that fails, gives ``refused`` (the caller then plans in one process, where the error is named). A
    worker sends each DAG's flows as columns (`bridge.plan_groups`)."""
    memo = DagMemo(topo)
    touched = memo.sent = _Touched()
    out: list[dict[str, Any]] = []
    nxt = 0
    with _nccl_env(job["env"]):
        for op in job["ops"]:
            try:
                dag = memo.gated(coll_from_wire(op["coll"]), opts_from_wire(op["opts"]), nxt, op["name"], (GATE,))
            except Exception as exc:  # noqa: BLE001 - the one-process plan raises it again, named
                return {"refused": f"op '{op['name']}': {type(exc).__name__}: {exc}"}
            try:
                same = msgpack.unpackb(msgpack.packb(dag.choice)) == dag.choice
            except (TypeError, ValueError):  # (a value msgpack cannot carry)
                same = False
            if not same:
                return {"refused": f"op '{op['name']}': NCCL's choice does not cross msgpack unchanged"}
            last = [[r, ids] for r, ids in dag.rank_last.items()]
            out.append({"name": op["name"], "first": nxt, "n": dag.next_id - nxt, "last": last, "choice": dag.choice,
                        "dag": dag})  # fmt: skip
            nxt = dag.next_id
    return {"ops": out, "touched": sorted(_plain(k) for k in touched.seen)}


def touched_apart(replies: Sequence[dict[str, Any]]) -> bool:
    """Whether no two groups' planning read or moved one connection's counter (else their order mattered)."""
    seen: set[tuple[int, ...]] = set()
    for rep in replies:
        mine = {tuple(k) for k in rep["touched"]}
        if mine & seen:
            return False
        seen |= mine
    return True


@dataclass
class _Part:
    first: int
    n: int
    last: list[list[Any]]
    choice: dict[str, Any] | None
    flows: dict[str, Any]


class Relocated:
    """A `DagMemo` stand-in for `plan_workload`: each op's DAG from its group's reply, moved to the op's ids."""

    def __init__(self, replies: Sequence[dict[str, Any]]) -> None:
        self._parts = {op["name"]: _Part(op["first"], op["n"], op["last"], op["choice"], op["flows"])
                       for rep in replies for op in rep["ops"]}  # fmt: skip

    def gated(self, coll: Collective, opts: AlgoOptions, first: int, tag: str, gate: tuple[int, ...]) -> FlowDag:
        """The DAG of op `tag` with its ids from `first` and `gate` as the deps of the flows that have none."""
        part = self._parts.pop(tag)
        shift = first - part.first
        flows = moved_columns(part.flows, first, shift, gate)
        last = {int(r): [i + shift for i in ids] for r, ids in part.last}
        return FlowDag(flows, last, first + part.n, part.choice)


def moved_columns(cols: dict[str, Any], first: int, shift: int, gate: tuple[int, ...]) -> list[Flow]:
    """`bridge.columns.flows_to_columns`' flows (ids consecutive) with ids from `first`, deps moved by `shift`, `GATE`
    -> `gate`."""
    n = len(cols["src"])
    if cols["id"] != list(range(first - shift, first - shift + n)):
        raise ValueError(f"a planned group's op from id {first - shift}: its flows' ids are not consecutive")
    ndeps = cols["ndeps"]
    flat = [d + shift for d in cols["deps"]]
    gated = GATE + shift
    lists: list[tuple[int, ...]] = []
    put_list = lists.append
    ends = accumulate(ndeps if min(ndeps, default=0) >= 0 else [k if k > 0 else 0 for k in ndeps])
    for e, k in zip(ends, ndeps, strict=True):
        if k == 1:  # (most flows: a step after the one before)
            d = flat[e - 1]
            put_list(gate if d == gated else (d,))
        elif k > 1:
            put_list(tuple(flat[e - k : e]))
        else:  # (none, or a wide list an earlier row sent)
            put_list(lists[-1 - k] if k < 0 else ())
    nics = cols.get("nic") or [False] * n
    queues = cols.get("queue") or [0] * n
    out: list[Flow] = []
    put = out.append
    make: Callable[..., Any] = _Slots
    columns = zip(cols["src"], cols["dst"], cols["size"], lists, cols["delay"], cols["tag"], cols["prio"], cols["key"],
                  cols["budget"], cols["rate"], cols["conn"], queues, nics, strict=True)  # fmt: skip
    for i, (s, d, z, dl, de, t, pr, k, bu, r, cn, q, nic) in enumerate(columns, first):
        g = make(i, s, d, z, dl, de, t, pr, k, bu, r, cn, q, nic)
        g.__class__ = Flow
        put(g)
    return out


def split_jobs(wl: Workload, base: AlgoOptions) -> tuple[list[list[int]], list[dict[str, Any]]] | None:
    """The workload's independent groups (`op_groups`) and each one's `group_job`; None when it has one group, an
    op's options are refused (the one-process plan names the error) or a collective cannot be sent."""
    groups = op_groups(wl)
    if len(groups) < 2:
        return None
    try:
        opts = [dataclasses.replace(base, **op.algo) if op.algo else base for op in wl.ops]
    except Exception:  # noqa: BLE001 - `plan_workload` raises it again, naming the op and the file
        return None
    jobs = [group_job(wl, g, opts) for g in groups]
    if any(j is None for j in jobs):
        return None
    return groups, [j for j in jobs if j is not None]


@contextmanager
def jobs_ahead(jobs: list[dict[str, Any]] | None) -> Iterator[None]:
    """Inside: decomposition workers started here are given `jobs` (`split_jobs`') to plan as they start, before they
    load ns-3, so that the plan does not wait for their start (`bridge.workers`, `replay.settle_groups`)."""
    token = _AHEAD.set(jobs)
    try:
        yield
    finally:
        _AHEAD.reset(token)


def ahead() -> list[dict[str, Any]] | None:
    """The jobs of the `jobs_ahead` around this call, if any."""
    return _AHEAD.get()
