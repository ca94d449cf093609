"""The replay workload format: a list of collectives and transfers with issue times and rank sets.

A workload is a TOML (or JSON) file::

    name = "ddp-buckets"
    [defaults]            # optional; any op field
    ranks = "all"         # "all", "0-7", "0-7,16-23", or a list of ints
    dtype = "bf16"

    [[op]]
    name = "bucket0"      # optional; default "op<i>"
    kind = "all_reduce"   # see phantora.collectives.spec.KINDS
    bytes = "25MiB"       # an int (bytes) or a string with a unit
    at = "0us"            # earliest issue time (default 0)
    after = ["fwd"]       # ops that must be done on a rank before it issues this one
    gap = "200us"         # compute time on each rank between its last `after` and the issue
    root = 0              # broadcast/reduce: group-local root index
    splits = [[0, 4], [8, 0]]  # all_to_all: row i, the bytes group rank i sends each (one NCCL group of transfers)
    src = 0               # send_recv: the two ranks (instead of `ranks`)
    dst = 8
    repeat = 4            # optional: expand into name.0 .. name.3, each after the previous
    every = "2ms"         # with repeat: instance i has at = at + i*every (a compute cadence)
    algorithm = "ring"    # optional per-op AlgoOptions fields: algorithm, granularity,
    granularity = "chunked"  # channels, chunk_bytes

A rank r issues op B at max(B.at, max over A in B.after with r in A of done_r(A) + B.gap);
the collective starts at the latest issue time of its ranks (as a real NCCL call would).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phantora.collectives.launch_group import LaunchGroup
from phantora.collectives.spec import REDUCING, AlgoOptions, Collective
from phantora.errors import InputError
from phantora.units import parse_size_bytes, parse_time_ns

_OP_KEYS = {
    "name",
    "kind",
    "bytes",
    "dtype",
    "redop",
    "ranks",
    "at",
    "after",
    "gap",
    "root",
    "src",
    "dst",
    "repeat",
    "every",
    "algorithm",
    "granularity",
    "channels",
    "chunk_bytes",
    "protocol",
    "model",
    "splits",
}
_ALGO_KEYS = ("algorithm", "granularity", "channels", "chunk_bytes", "protocol", "model")


@dataclass(frozen=True)
class WorkloadOp:
    """One collective or transfer of a workload."""

    name: str
    coll: Collective
    at_ns: int = 0
    after: tuple[str, ...] = ()
    gap_ns: int = 0
    algo: dict[str, Any] = field(default_factory=dict)  # the op's own collective options, over the run's
    group: str = ""  # one transfer of this all_to_all op with `splits`: one NCCL group (nccl/p2p_group.py)


@dataclass
class Workload:
    """A named, ordered list of ops; `source` is the file it came from."""

    name: str
    ops: list[WorkloadOp] = field(default_factory=list)
    source: str = "<memory>"
    description: str = ""

    @property
    def max_rank(self) -> int:
        return max((max(op.coll.ranks) for op in self.ops), default=-1)


def parse_ranks(spec: Any, world: int | None, where: str) -> tuple[int, ...]:
    """'all' | '0-7,16-23' | [0, 1, 2] -> a tuple of ranks."""
    if isinstance(spec, list):
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in spec):
            raise InputError(f"{where}: ranks must be integers, got {spec!r}", field="ranks")
        return tuple(spec)
    if not isinstance(spec, str):
        raise InputError(f"{where}: ranks must be 'all', a range string or a list, got {spec!r}", field="ranks")
    if spec.strip() == "all":
        if world is None:
            raise InputError(f"{where}: ranks = 'all' needs a topology (or give explicit ranks)", field="ranks")
        return tuple(range(world))
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise InputError(f"{where}: bad rank range {part!r} in {spec!r}", field="ranks") from None
    return tuple(out)


def _op_from_dict(raw: dict[str, Any], index: int, world: int | None, source: str) -> list[WorkloadOp]:
    name = str(raw.get("name", f"op{index}"))
    where = f"op '{name}' (#{index})"
    unknown = sorted(set(raw) - _OP_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(unknown)}", file=source, field=unknown[0])
    if "kind" not in raw:
        raise InputError(f"{where}: missing 'kind'", file=source, field="kind")
    kind = str(raw["kind"])
    try:
        if kind == "send_recv":
            if "src" not in raw or "dst" not in raw:
                raise InputError(f"{where}: send_recv needs 'src' and 'dst'", field="src")
            ranks: tuple[int, ...] = (int(raw["src"]), int(raw["dst"]))
        else:
            ranks = parse_ranks(raw.get("ranks", "all"), world, where)
        nbytes = parse_size_bytes(raw.get("bytes", 0))
        if nbytes < 0:
            raise InputError(f"{where}: bytes must be >= 0, got {raw.get('bytes')!r}", field="bytes")
        if world is not None:
            bad = [r for r in ranks if not 0 <= r < world]
            if bad:
                raise InputError(f"{where}: rank {bad[0]} is outside the topology ({world} ranks)", field="ranks")
        redop = str(raw.get("redop", "sum"))
        if redop != "sum" and kind not in REDUCING:
            raise InputError(f"{where}: a {kind} takes no reduction (redop = {redop!r})", field="redop")
        coll = Collective(kind, ranks, nbytes, str(raw.get("dtype", "bf16")), raw.get("root"), redop=redop)
        at = parse_time_ns(raw.get("at", 0))
        gap = parse_time_ns(raw.get("gap", 0))
        if at < 0 or gap < 0:
            raise InputError(f"{where}: 'at' and 'gap' must be >= 0", field="at" if at < 0 else "gap")
        after = raw.get("after", [])
        if isinstance(after, str):
            after = [after]
        algo_kw = {k: raw[k] for k in _ALGO_KEYS if k in raw}
        if "chunk_bytes" in algo_kw:
            algo_kw["chunk_bytes"] = parse_size_bytes(algo_kw["chunk_bytes"])
        AlgoOptions(**algo_kw)  # checked here; applied over the run's options where the op runs
        algo = algo_kw
        every = parse_time_ns(raw.get("every", 0))
        repeat = int(raw.get("repeat", 1))
        if repeat < 1:
            raise InputError(f"{where}: repeat must be >= 1", field="repeat")
    except InputError as exc:
        if exc.file is None:
            raise InputError(str(exc), file=source, field=exc.field) from None
        raise
    pairs = _split_pairs(raw, coll, where, source) if "splits" in raw else None
    ops = []
    for i in range(repeat):
        deps = tuple(str(a) for a in after) if i == 0 else (f"{name}.{i - 1}",)
        one = name if repeat == 1 else f"{name}.{i}"
        if pairs is None:
            ops.append(WorkloadOp(one, coll, at + i * every, deps, gap, algo))
        else:  # the group's transfers, each an op; `after` naming the group names them all (workload_from_dict)
            ops.extend(
                WorkloadOp(f"{one}/{c.ranks[0]}>{c.ranks[1]}", c, at + i * every, deps, gap, algo, one) for c in pairs
            )
    return ops


def _split_pairs(raw: dict[str, Any], coll: Collective, where: str, source: str) -> list[Collective]:
    """An all_to_all's `splits` (row i: the bytes group rank i sends each group rank) as its transfers: send/recvs on
    the group's communicator, as ProcessGroupNCCL runs an uneven all_to_all_single: one NCCL group of an ncclSend and an
    ncclRecv per peer, each knowing the others in flight, all from one start (one `LaunchGroup`, `Collective.launch`;
    `phantora.replay` rates each from its own start)."""
    n = len(coll.ranks)
    rows = raw["splits"]
    try:
        if coll.kind != "all_to_all":
            raise InputError(f"{where}: splits are an all_to_all's, not a {coll.kind}'s", field="splits")
        if not isinstance(rows, list) or len(rows) != n or any(not isinstance(r, list) or len(r) != n for r in rows):
            raise InputError(
                f"{where}: splits must be {n} rows of {n} sizes (one per rank of the group)", field="splits"
            )
        sizes = {}
        for i, row in enumerate(rows):
            for j, v in enumerate(row):
                b = parse_size_bytes(v)
                if b < 0:
                    raise InputError(f"{where}: splits[{i}][{j}] must be >= 0, got {v!r}", field="splits")
                if b and i != j:
                    sizes[(coll.ranks[i], coll.ranks[j])] = b
        if not sizes:
            raise InputError(f"{where}: splits move no bytes between ranks", field="splits")
    except InputError as exc:
        raise InputError(str(exc), file=source, field=exc.field) from None
    order = tuple(sorted(sizes))
    group = LaunchGroup(order, (0,) * len(order), tuple(sizes[p] for p in order)) if len(order) > 1 else None
    return [Collective("send_recv", pair, b, coll.dtype, comm=coll.ranks, launch=group) for pair, b in sizes.items()]


def workload_from_dict(data: dict[str, Any], world: int | None = None, source: str = "<memory>") -> Workload:
    """Build and check a Workload from parsed TOML/JSON data."""
    top_unknown = sorted(set(data) - {"name", "description", "defaults", "op"})
    if top_unknown:
        raise InputError(f"unknown top-level field(s) {', '.join(top_unknown)}", file=source, field=top_unknown[0])
    defaults = data.get("defaults", {})
    raw_ops = data.get("op", [])
    if not isinstance(raw_ops, list) or not raw_ops:
        raise InputError("a workload needs at least one [[op]]", file=source, field="op")
    ops: list[WorkloadOp] = []
    for i, raw in enumerate(raw_ops):
        if not isinstance(raw, dict):
            raise InputError(f"op #{i} must be a table", file=source, field="op")
        merged = {**defaults, **raw}
        if "redop" not in raw and merged.get("kind") not in REDUCING:  # a default reduction: for the reducing ops
            merged.pop("redop", None)
        ops.extend(_op_from_dict(merged, i, world, source))
    groups: dict[str, list[str]] = {}  # an all_to_all with splits -> its transfers' ops
    for op in ops:
        if op.group:
            groups.setdefault(op.group, []).append(op.name)
    if groups:
        ops = [replace(op, after=tuple(x for a in op.after for x in groups.get(a, [a]))) for op in ops]
    seen: set[str] = set()
    for op in ops:
        if op.name in seen:
            raise InputError(f"duplicate op name '{op.name}'", file=source, field="name")
        missing = [a for a in op.after if a not in seen]
        if missing:
            raise InputError(
                f"op '{op.name}': 'after' names '{missing[0]}', which is not an earlier op", file=source, field="after"
            )
        seen.add(op.name)
    return Workload(str(data.get("name", Path(source).stem)), ops, source, str(data.get("description", "")))


def load_workload(path: str | Path, world: int | None = None) -> Workload:
    """Read a workload file (.toml or .json). `world` (the topology's rank count) resolves 'all'."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such workload file", file=str(p))
    text = p.read_text()
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot parse: {exc}", file=str(p)) from None
    return workload_from_dict(data, world, str(p))


def workload_to_dict(wl: Workload) -> dict[str, Any]:
    """The inverse of workload_from_dict (explicit ranks, sizes in bytes, times in ns)."""
    ops: list[dict[str, Any]] = []
    group_of = {op.name: op.group for op in wl.ops if op.group}
    done: dict[str, dict[str, Any]] = {}
    for op in wl.ops:
        if op.group:  # an all_to_all with splits, once, from its transfers
            _add_split(op, done, ops, group_of)
            continue
        d: dict[str, Any] = {"name": op.name, "kind": op.coll.kind, "bytes": op.coll.nbytes, "dtype": op.coll.dtype}
        if op.coll.kind == "send_recv":
            d["src"], d["dst"] = op.coll.ranks
        else:
            d["ranks"] = list(op.coll.ranks)
        if op.coll.root is not None:
            d["root"] = op.coll.root
        _add_timing(op, d, group_of)
        ops.append(d)
    return {"name": wl.name, "description": wl.description, "op": ops}


def _add_timing(op: WorkloadOp, d: dict[str, Any], group_of: dict[str, str]) -> None:
    """An op's start, dependencies (a split transfer's by its group's name), gap and algorithm fields into `d`."""
    if op.at_ns:
        d["at"] = op.at_ns
    if op.after:
        d["after"] = list(dict.fromkeys(group_of.get(a, a) for a in op.after))
    if op.gap_ns:
        d["gap"] = op.gap_ns
    d.update(op.algo)


def _add_split(
    op: WorkloadOp, done: dict[str, dict[str, Any]], ops: list[dict[str, Any]], group_of: dict[str, str]
) -> None:
    """`workload_to_dict` of one transfer of an all_to_all with splits: its bytes into the group's op."""
    comm = op.coll.comm
    d = done.get(op.group)
    if d is None:
        d = done[op.group] = {"name": op.group, "kind": "all_to_all", "dtype": op.coll.dtype, "ranks": list(comm)}
        d["splits"] = [[0] * len(comm) for _ in comm]
        _add_timing(op, d, group_of)
        ops.append(d)
    d["splits"][comm.index(op.coll.ranks[0])][comm.index(op.coll.ranks[1])] = op.coll.nbytes


STEP_SEP = "@"  # op "bucket" of repetition k of a repeated workload is "bucket@k"


def as_job(wl: Workload, steps: int | None = None, start_ns: int = 0) -> Workload:
    """A workload as a job of a multi-job run: every time moved by `start_ns`, and with `steps`, the whole
    list repeated `steps` times as training steps: op A of step k is ``A@k``, and an op of step k that waits
    on nothing waits, rank by rank, for every op of step k-1 (its `at` only holds back step 0). A transfer of an
    all_to_all with `splits` keeps its NCCL group (step k's: ``G@k``), as the bridge's replay ranks launch it."""
    if steps is None and not start_ns:
        return wl
    reps = 1 if steps is None else steps
    ops: list[WorkloadOp] = []
    for k in range(reps):

        def name(n: str, k: int = k) -> str:
            return n if steps is None else f"{n}{STEP_SEP}{k}"

        prev = tuple(name(op.name, k - 1) for op in wl.ops) if k else ()
        for op in wl.ops:
            after = tuple(name(a) for a in op.after) or prev
            # an op waiting on nothing issues at max(at, gap): from the job's start, that is start + max(at, gap)
            at = start_ns + (max(op.at_ns, op.gap_ns) if not op.after else op.at_ns) if k == 0 else start_ns
            group = name(op.group) if op.group else ""  # a step's `splits` transfers: one NCCL group, the step's
            ops.append(WorkloadOp(name(op.name), op.coll, at, after, op.gap_ns, op.algo, group))
    return Workload(wl.name, ops, wl.source, wl.description)


def step_of(op_name: str) -> int:
    """The step (repetition) an op of `as_job(..., steps=...)` belongs to (0 if not repeated)."""
    head, sep, tail = op_name.rpartition(STEP_SEP)
    return int(tail) if sep and tail.isdigit() else 0
