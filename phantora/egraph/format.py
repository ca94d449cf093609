"""The on-disk execution-graph format (version 1): a JSON index plus one msgpack file per distinct program.

A graph directory holds
- ``graph.json``: format name and version, world size, the table of communication groups, the list
  of program files (with their SHA-256), and for every rank the program it runs and the groups its
  program's *slots* stand for; plus free-form ``meta`` and the ``recorded`` step times;
- ``programs/p<k>.msgpack``: one program, the sequence of nodes one rank executed.

A program never names a global rank: a collective refers to a slot (0, 1, ...) that each rank binds
to a concrete group. Ranks whose programs are equal up to that binding (SPMD data parallelism,
every TP rank of a layer) share one program file: that is the deduplication.

Node semantics (all times integer ns; see docs/egraph.md):
- every node runs on a *stream* and becomes ready when the previous node of its stream has ended
  and every node in its explicit ``deps`` (indices of earlier nodes) has ended;
- ``Compute`` ends ``dur_ns`` after it is ready;
- ``Coll`` / ``P2P`` is *issued* when ready and ends (for stream order) at once; the collective
  itself starts when every member has issued it and, on each member, that member's parts of the nodes in its
  ``after`` (earlier Coll/P2P nodes: the calls before it on its NCCL stream, and those its CUDA stream waited
  for, as a live run orders them) have completed; each rank's part completes when its last flows arrive;
- ``Wait`` ends when it is ready and every referenced collective has completed for this rank; a hand-off wait
  (``handoff``) names lone sends within their connection's buffer and ends at their hand-off instead
  (`phantora.collectives.handoff`: the send's issue plus NCCL's time for the lone transfer), not their flows' end;
  such sends to one peer share their connection's slots only on one communicator, which a ``P2P``'s ``conn``
  numbers (0: the rank's first; type 8 on disk), and whose ranks its ``comm`` binds, when not the pair's own
  (eager init: the group's; type 9 on disk), since they decide whether NCCL uses PXN, which rules out a
  registered zero-copy send; a ``Coll``'s ``redop`` (type 10 on disk when not sum) is part of NCCL's choice;
- a ``Coll`` or ``P2P`` names which process group it ran on (``pg``): 0 for the rank's first group over its
  ranks (a ``P2P``: holding both ends), 1 for the next, ... (each its own NCCL communicator with its own order, whose
  calls are matched apart: ``seq`` counts per group); type 12 (a ``Coll``) or 13 (a ``P2P``) on disk when not 0, so
  a recording of one group per rank set is written as before;
- a ``Coll``'s ``group_sizes`` (type 14 on disk) are the bytes of each call of a coalesced call (one NCCL group of
  calls, which NCCL schedules as one launch: part of its choice); where the calls' dtypes differ
  (``group_dtypes``) each size is written as ``[bytes, dtype code]``, and where their kinds, reductions or roots
  differ (``group_kinds``, ``group_redops``, ``group_roots``: a device block's calls, one NCCL plan) as
  ``[bytes, dtype code, kind code, reduction code, root]`` (root group-local, -1 for none);
- ``Step`` marks the end of a training step on its stream (it takes no time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from phantora.collectives.spec import GROUPED_KINDS, REDUCING
from phantora.errors import InputError

FORMAT = "phantora-egraph"
VERSION = 1
INDEX = "graph.json"
PROGRAM_DIR = "programs"

# Stable on-disk codes: append only, never reorder (the format version guards a change).
T_COMPUTE, T_COLL, T_P2P, T_WAIT, T_STEP = 0, 1, 2, 3, 4
T_COLL_AFTER, T_P2P_AFTER = 5, 6  # a Coll / P2P with a non-empty `after`: its fields, then the list
T_WAIT_HANDOFF = 7  # a Wait on lone sends that ends at their hand-off (Wait.handoff)
T_P2P_CONN = 8  # a P2P on a communicator other than the rank's first (P2P.conn): its fields, `after` (maybe empty)
T_P2P_COMM = 9  # a P2P whose communicator is not its pair's own (P2P.comm): type 8's fields, conn, comm, `after`
T_COLL_OP = 10  # a Coll whose reduction is not sum (Coll.redop): type 5's fields, `after` (maybe empty), the op code
T_P2P_GROUP = 11  # a P2P of an NCCL group launch (P2P.launch): type 9's fields, conn, comm, launch, `after`
T_COLL_PG = 12  # a Coll on a process group after its rank's first over its ranks (Coll.pg): type 10's fields, then pg
T_P2P_PG = 13  # a P2P on such a process group (P2P.pg): type 11's fields (launch -1: none), then pg
T_COLL_GROUP = 14  # a coalesced Coll (Coll.group_sizes): type 12's fields (its pg maybe 0), then the calls' sizes
# recorded: per rank, [issue ns, ns its rank last joined a completion before it] of each P2P node of a group launch
LAUNCH_ISSUE = "launch_issue_ns"
# recorded, a window-mode run's only (optional): per rank, the network's ns its rank was last released at (the
# coordinator's round it ran on in) before each P2P node of a group launch, in launch_issue_ns's order
LAUNCH_RELEASE = "launch_release_ns"
NcclEnv = tuple[tuple[str, str], ...]  # NCCL_* variables and their values (collectives.nccl.settings.nccl_env)
EAGER_STREAM = 1  # a hand-off wait on this stream only marks its sends as lone sends within their buffer (no time)
KIND_CODES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier")
DTYPE_CODES = ("bf16", "fp16", "fp32", "fp64", "fp8", "int8", "uint8", "bool", "int16", "int32", "int64")
REDOP_CODES = ("sum", "prod", "max", "min", "avg", "mulsum", "band", "bor", "bxor")  # collectives.spec.REDOPS
# Fixed fields after the type code; an optional last element is the list of explicit deps.
_ARITY = {
    T_COMPUTE: 3,
    T_COLL: 7,
    T_P2P: 6,
    T_WAIT: 2,
    T_STEP: 2,
    T_COLL_AFTER: 8,
    T_P2P_AFTER: 7,
    T_WAIT_HANDOFF: 2,
    T_P2P_CONN: 8,
    T_P2P_COMM: 9,
    T_COLL_OP: 9,
    T_P2P_GROUP: 10,
    T_COLL_PG: 10,
    T_P2P_PG: 11,
    T_COLL_GROUP: 11,
}
_TYPE_NAMES = {
    T_COMPUTE: "compute",
    T_COLL: "collective",
    T_P2P: "p2p",
    T_WAIT: "wait",
    T_STEP: "step",
    T_COLL_AFTER: "collective",
    T_P2P_AFTER: "p2p",
    T_WAIT_HANDOFF: "wait",
    T_P2P_CONN: "p2p",
    T_P2P_COMM: "p2p",
    T_COLL_OP: "collective",
    T_P2P_GROUP: "p2p",
    T_COLL_PG: "collective",
    T_P2P_PG: "p2p",
    T_COLL_GROUP: "collective",
}


@dataclass(frozen=True, slots=True)
class Compute:
    """A kernel (or a merged run of ops) that occupies its stream for dur_ns."""

    stream: int
    name: str
    dur_ns: int
    deps: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Coll:
    """Issue of a collective on the group bound to `slot`; matched across ranks by (group, seq, pg)."""

    stream: int
    slot: int
    kind: str
    nbytes: int  # nccl-tests convention (see phantora.collectives.spec.Collective)
    dtype: str
    root: int | None  # group-local index (broadcast, reduce)
    seq: int
    deps: tuple[int, ...] = ()
    after: tuple[int, ...] = ()  # earlier Coll/P2P nodes whose part on this rank must end before it starts
    redop: str = "sum"  # the reduction of an all-reduce, reduce-scatter or reduce (type 10 on disk when not sum)
    nccl_env: NcclEnv | None = None  # the NCCL_* its communicator was created with, where the program set its own
    pg: int = 0  # which of the rank's process groups over the group's ranks it ran on (0: the first; type 12)
    # a coalesced call's calls' bytes, summing to nbytes (Collective.group_sizes; type 14 on disk); () for one call
    group_sizes: tuple[int, ...] = ()
    # their dtypes where they differ, the first `dtype` (Collective.group_dtypes; type 14's [bytes, dtype] pairs)
    group_dtypes: tuple[str, ...] = ()
    # their kinds, reductions and roots (group-local) where they differ, the first the Coll's own
    # (Collective.group_kinds, group_redops, group_roots; type 14's [bytes, dtype, kind, redop, root] entries)
    group_kinds: tuple[str, ...] = ()
    group_redops: tuple[str, ...] = ()
    group_roots: tuple[int | None, ...] = ()
    # a plain gloo group's call (runtime backend.py `gloo_sync`), as P2P.host: planned outside the NCCL model
    host: bool = False

    def mixed(self) -> bool:
        """Whether its calls differ in kind, reduction or root (type 14's five-field entries)."""
        return bool(self.group_kinds or self.group_redops or self.group_roots)


@dataclass(frozen=True, slots=True)
class P2P:
    """Issue of one side of a transfer; `slot` binds to the pair (src, dst); matched by (src, dst, tag, seq, pg)."""

    stream: int
    slot: int
    is_send: bool
    tag: int
    nbytes: int
    seq: int
    deps: tuple[int, ...] = ()
    after: tuple[int, ...] = ()  # as Coll's
    conn: int = 0  # the communicator it runs on, numbered in the rank's order of first use: its connection's slots
    comm: int = -1  # the slot of that communicator's ranks when it is not the pair's own (eager init); -1: the pair's
    nccl_env: NcclEnv | None = None  # as Coll's
    # the rank's NCCL group launch it is part of (a batch_isend_irecv, a coalescing block, a pairwise collective's
    # transfers), numbered in the rank's order of first use, on the communicator `comm`; -1: none (type 11 on disk)
    launch: int = -1
    pg: int = 0  # which of the rank's process groups holding both ends it ran on (0: the first; type 13 on disk)
    # a plain gloo group's send or recv (runtime backend.py `gloo_sync`): not an NCCL call, planned outside the NCCL
    # model, so its zero bytes cost nothing (the program's optional `host_of` list on disk, with Coll.host's)
    host: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """The stream waits until this rank's part of every referenced Coll/P2P node has completed; with `handoff`,
    until each referenced send (lone, within its connection's buffer) is handed off to its connection."""

    stream: int
    refs: tuple[int, ...]
    deps: tuple[int, ...] = ()
    handoff: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """End of training step `index` on this stream."""

    stream: int
    index: int
    deps: tuple[int, ...] = ()


Node = Compute | Coll | P2P | Wait | Step


@dataclass
class Program:
    """The nodes one rank executes, in issue order (every reference points backwards)."""

    nodes: list[Node] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        slots = (
            max(n.slot, n.comm) if isinstance(n, P2P) else n.slot for n in self.nodes if isinstance(n, (Coll, P2P))
        )
        return 1 + max(slots, default=-1)

    def encode(self) -> bytes:
        """Canonical msgpack bytes: equal programs give equal bytes (the dedup key)."""
        names: dict[str, int] = {}
        rows: list[list[Any]] = []
        envs: dict[NcclEnv, int] = {}
        env_of: list[list[int]] = []  # [node, env index] of the calls with their own NCCL_* (Coll/P2P.nccl_env)
        host_of: list[int] = []  # the gloo groups' calls (Coll/P2P.host)
        for i, n in enumerate(self.nodes):
            if isinstance(n, (Coll, P2P)) and n.host:
                host_of.append(i)
            if isinstance(n, (Coll, P2P)) and n.nccl_env is not None:
                env_of.append([i, envs.setdefault(n.nccl_env, len(envs))])
            if isinstance(n, Compute):
                row: list[Any] = [T_COMPUTE, n.stream, names.setdefault(n.name, len(names)), n.dur_ns]
            elif isinstance(n, Coll):
                root = -1 if n.root is None else n.root
                kind, dtype = KIND_CODES.index(n.kind), DTYPE_CODES.index(n.dtype)
                row = [T_COLL, n.stream, n.slot, kind, n.nbytes, dtype, root, n.seq]
                if n.group_sizes:
                    row[0] = T_COLL_GROUP
                    sizes: list[Any] = list(n.group_sizes)
                    if n.mixed():
                        sizes = _mixed_entries(n)
                    elif n.group_dtypes:
                        sizes = [[b, DTYPE_CODES.index(t)] for b, t in zip(n.group_sizes, n.group_dtypes, strict=True)]
                    row += [list(n.after), REDOP_CODES.index(n.redop), n.pg, sizes]
                elif n.pg:
                    row[0] = T_COLL_PG
                    row += [list(n.after), REDOP_CODES.index(n.redop), n.pg]
                elif n.redop != "sum":
                    row[0] = T_COLL_OP
                    row += [list(n.after), REDOP_CODES.index(n.redop)]
                elif n.after:
                    row[0] = T_COLL_AFTER
                    row.append(list(n.after))
            elif isinstance(n, P2P):
                row = [T_P2P, n.stream, n.slot, int(n.is_send), n.tag, n.nbytes, n.seq]
                if n.pg:
                    row[0] = T_P2P_PG
                    row += [n.conn, n.comm, n.launch, list(n.after), n.pg]
                elif n.launch >= 0:
                    row[0] = T_P2P_GROUP
                    row += [n.conn, n.comm, n.launch, list(n.after)]
                elif n.comm >= 0:
                    row[0] = T_P2P_COMM
                    row += [n.conn, n.comm, list(n.after)]
                elif n.conn:
                    row[0] = T_P2P_CONN
                    row += [n.conn, list(n.after)]
                elif n.after:
                    row[0] = T_P2P_AFTER
                    row.append(list(n.after))
            elif isinstance(n, Wait):
                row = [T_WAIT_HANDOFF if n.handoff else T_WAIT, n.stream, list(n.refs)]
            else:
                row = [T_STEP, n.stream, n.index]
            if n.deps:
                row.append(list(n.deps))
            rows.append(row)
        doc: dict[str, Any] = {"v": VERSION, "names": list(names), "nodes": rows}
        if envs:  # optional keys: a program without them (recorded before them) reads as the run's settings
            doc["envs"] = [[list(kv) for kv in env] for env in envs]
            doc["env_of"] = env_of
        if host_of:  # optional too: a program without it has no gloo calls
            doc["host_of"] = host_of
        return msgpack.packb(doc, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes, source: str = "<program>") -> Program:
        """Parse and check program bytes; errors name `source` and the bad node."""
        try:
            obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            raise InputError(f"not a valid program file (msgpack: {exc})", file=source) from None
        if not (isinstance(obj, dict) and isinstance(obj.get("nodes"), list) and isinstance(obj.get("names"), list)):
            raise InputError("not a program file: expected a map with 'names' and 'nodes'", file=source)
        if obj.get("v") != VERSION:
            raise InputError(f"program format version {obj.get('v')!r}, this phantora reads {VERSION}", file=source)
        names = obj["names"]
        nodes: list[Node] = []
        for i, row in enumerate(obj["nodes"]):
            nodes.append(_decode_row(i, row, names, source))
        _decode_envs(obj, nodes, source)
        _decode_hosts(obj, nodes, source)
        prog = cls(nodes)
        prog.check(source)
        return prog

    def check(self, source: str = "<program>") -> None:
        """Every reference points to an earlier node, waits name collectives, sizes are sane."""
        for i, n in enumerate(self.nodes):
            where = f"nodes[{i}]"
            for d in n.deps:
                if not 0 <= d < i:
                    raise InputError(f"dependency {d} does not name an earlier node", file=source, field=where)
            if isinstance(n, Wait):
                if not n.refs:
                    raise InputError("a wait names no collective", file=source, field=where)
                for r in n.refs:
                    if not (0 <= r < i and isinstance(self.nodes[r], (Coll, P2P))):
                        raise InputError(f"wait reference {r} is not an earlier collective", file=source, field=where)
                    ref = self.nodes[r]
                    if n.handoff and not (isinstance(ref, P2P) and ref.is_send):
                        raise InputError(f"hand-off wait reference {r} is not a send", file=source, field=where)
            if isinstance(n, Compute) and n.dur_ns < 0:
                raise InputError(f"negative duration {n.dur_ns}", file=source, field=where)
            if isinstance(n, Coll) and n.redop != "sum" and n.kind not in REDUCING:
                raise InputError(f"a {n.kind} takes no reduction ({n.redop})", file=source, field=where)
            if isinstance(n, Coll) and n.mixed():
                check_group_calls(n, source, where)
            if (
                isinstance(n, Coll)
                and n.group_sizes
                and (
                    len(n.group_sizes) < 2
                    or sum(n.group_sizes) != n.nbytes
                    or n.kind in ("all_to_all", "barrier")
                    or (n.group_dtypes and (len(n.group_dtypes) != len(n.group_sizes) or n.group_dtypes[0] != n.dtype))
                )
            ):
                raise InputError(
                    f"group sizes {list(n.group_sizes)}: two or more calls' bytes summing to the {n.kind}'s {n.nbytes}"
                    f" (with dtypes {list(n.group_dtypes)}: one a call, the first {n.dtype})",
                    file=source,
                    field=where,
                )
            if isinstance(n, (Coll, P2P)):
                if n.nbytes < 0 or n.seq < 0 or n.slot < 0 or n.pg < 0 or (isinstance(n, P2P) and n.conn < 0):
                    raise InputError("negative size, seq, slot, process group or communicator", file=source,
                                     field=where)  # fmt: skip
                if isinstance(n, P2P) and n.launch >= 0 and n.comm < 0:
                    raise InputError("a group launch's transfer names no communicator", file=source, field=where)
                for r in n.after:
                    if not (0 <= r < i and isinstance(self.nodes[r], (Coll, P2P))):
                        raise InputError(f"after {r} is not an earlier collective", file=source, field=where)

    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    def launch_nodes(self) -> list[int]:
        """The P2P nodes of NCCL group launches (`P2P.launch`), in node order: `recorded.launch_issue_ns` times them."""
        return [i for i, n in enumerate(self.nodes) if isinstance(n, P2P) and n.launch >= 0]


def check_group_calls(n: Coll, source: str, where: str) -> None:
    """A Coll's calls of several kinds, reductions or roots: one of each a call, the first the Coll's own; kinds NCCL
    groups; a reduction only on a reducing kind; roots that are none or group-local indices (checked on binding)."""
    m = len(n.group_sizes)
    for name, got, own in (
        ("kinds", n.group_kinds, n.kind),
        ("reductions", n.group_redops, n.redop),
        ("roots", n.group_roots, n.root),
    ):
        if got and (len(got) != m or got[0] != own):
            raise InputError(
                f"group {name} {list(got)}: one for each of the {m} calls, the first the call's own ({own})",
                file=source,
                field=where,
            )
    kinds = n.group_kinds or (n.kind,) * m
    redops = n.group_redops or (n.redop,) * m
    roots = n.group_roots or (n.root,) * m
    for k, op, r in zip(kinds, redops, roots, strict=True):
        if k not in GROUPED_KINDS or (op != "sum" and k not in REDUCING) or (r is not None and r < 0):
            raise InputError(
                f"group call {k} ({op}, root {r}): calls of {', '.join(GROUPED_KINDS)}, a reduction only on a "
                f"reducing one",
                file=source,
                field=where,
            )


def _decode_envs(obj: dict[str, Any], nodes: list[Node], source: str) -> None:
    """Give the calls `env_of` names their NCCL_* variables from the `envs` table (in place)."""
    envs, env_of = obj.get("envs", []), obj.get("env_of", [])

    def pairs(e: Any) -> bool:
        return isinstance(e, list) and all(isinstance(kv, list) and len(kv) == 2 for kv in e)

    ok = isinstance(envs, list) and all(pairs(e) and all(isinstance(x, str) for kv in e for x in kv) for e in envs)
    if not ok:
        raise InputError("envs must be lists of [variable, value] pairs", file=source, field="envs")
    table = [tuple((k, v) for k, v in e) for e in envs]
    if not isinstance(env_of, list):
        raise InputError("env_of must be a list of [node, env] pairs", file=source, field="env_of")
    for pair in env_of:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) for x in pair)):
            raise InputError(f"env_of entry {pair!r:.40} is not [node, env]", file=source, field="env_of")
        i, e = pair
        call = nodes[i] if 0 <= i < len(nodes) else None
        if not (isinstance(call, (Coll, P2P)) and 0 <= e < len(table)):
            raise InputError(f"env_of entry {pair}: no such call or env", file=source, field="env_of")
        nodes[i] = dataclasses.replace(call, nccl_env=table[e])


def _decode_hosts(obj: dict[str, Any], nodes: list[Node], source: str) -> None:
    """Mark the calls `host_of` names as a plain gloo group's (Coll/P2P.host; in place)."""
    host_of = obj.get("host_of", [])
    if not isinstance(host_of, list):
        raise InputError("host_of must be a list of node indices", file=source, field="host_of")
    for i in host_of:
        call = nodes[i] if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(nodes) else None
        if not isinstance(call, (Coll, P2P)):
            raise InputError(f"host_of entry {i!r:.40}: no such call", file=source, field="host_of")
        nodes[i] = dataclasses.replace(call, host=True)


def _mixed_entries(n: Coll) -> list[list[int]]:
    """Type 14's [bytes, dtype, kind, redop, root] entries of a Coll whose calls differ in kind, reduction or root."""
    m = len(n.group_sizes)
    types = n.group_dtypes or (n.dtype,) * m
    kinds, redops = n.group_kinds or (n.kind,) * m, n.group_redops or (n.redop,) * m
    roots = n.group_roots or (n.root,) * m
    return [
        [b, DTYPE_CODES.index(t), KIND_CODES.index(k), REDOP_CODES.index(op), -1 if r is None else r]
        for b, t, k, op, r in zip(n.group_sizes, types, kinds, redops, roots, strict=True)
    ]


GroupCalls = tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[int | None, ...]]


def _differing(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """`values`, or () where they are all one (Coll's convention for its group fields)."""
    return values if len(set(values)) > 1 else ()


def _group_sizes(raw: Any, source: str, where: str) -> GroupCalls:
    """Type 14's calls: byte counts; [bytes, dtype code] pairs where the calls' dtypes differ; [bytes, dtype, kind,
    reduction, root] where their kinds, reductions or roots do (the older two forms stay readable). Returns their
    bytes, dtypes, kinds, reductions and roots, each () where the calls do not differ in it (bytes: always)."""
    ok = isinstance(raw, list) and raw
    if ok and all(isinstance(x, list) for x in raw):
        width = len(raw[0])
        rows = [x for x in raw if len(x) == width and all(isinstance(v, int) and not isinstance(v, bool) for v in x)]
        codes = (DTYPE_CODES, KIND_CODES, REDOP_CODES)
        if (
            width in (2, 5)
            and len(rows) == len(raw)
            and all(x[0] >= 0 and all(0 <= v < len(c) for v, c in zip(x[1:4], codes, strict=False)) for x in rows)
            and all(x[4] >= -1 for x in rows if width == 5)
        ):
            sizes, types = tuple(x[0] for x in rows), tuple(DTYPE_CODES[x[1]] for x in rows)
            if width == 2:
                return sizes, types, (), (), ()
            kinds = tuple(KIND_CODES[x[2]] for x in rows)
            redops = tuple(REDOP_CODES[x[3]] for x in rows)
            roots = tuple(None if x[4] < 0 else x[4] for x in rows)
            return sizes, _differing(types), _differing(kinds), _differing(redops), _differing(roots)
        raise InputError(
            "group sizes must be [bytes, dtype code] or [bytes, dtype, kind, reduction, root] entries",
            file=source,
            field=where,
        )
    if not ok or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in raw):
        raise InputError("group sizes must be a list of byte counts", file=source, field=where)
    return tuple(raw), (), (), (), ()


def _decode_row(i: int, row: Any, names: list[str], source: str) -> Node:
    where = f"nodes[{i}]"
    if not isinstance(row, list) or not row or row[0] not in _ARITY:
        raise InputError(f"bad node {row!r:.60}: unknown type code", file=source, field=where)
    code, arity = row[0], _ARITY[row[0]]
    if len(row) not in (arity + 1, arity + 2):
        raise InputError(f"a {_TYPE_NAMES[code]} node has {arity} fields, got {len(row) - 1}", file=source, field=where)
    deps: tuple[int, ...] = ()
    if len(row) == arity + 2:
        if not isinstance(row[-1], list) or not all(isinstance(d, int) for d in row[-1]):
            raise InputError("deps must be a list of node indices", file=source, field=where)
        deps = tuple(row[-1])
    f = row[1 : arity + 1]
    after: tuple[int, ...] = ()
    redop = "sum"
    pg = 0
    calls: GroupCalls = ((), (), (), (), ())
    if code == T_COLL_GROUP:
        calls = _group_sizes(f[-1], source, where)
        if not isinstance(f[-2], int) or isinstance(f[-2], bool) or f[-2] < 0:
            raise InputError(f"process group {f[-2]!r} must be >= 0", file=source, field=where)
        f, pg = f[:-2], f[-2]
    if code in (T_COLL_PG, T_P2P_PG):
        if not isinstance(f[-1], int) or isinstance(f[-1], bool) or f[-1] <= 0:
            raise InputError(
                f"process group {f[-1]!r}: type {code} names one after the first", file=source, field=where
            )
        f, pg = f[:-1], f[-1]
    if code in (T_COLL_OP, T_COLL_PG, T_COLL_GROUP):
        if not isinstance(f[-1], int) or not 0 <= f[-1] < len(REDOP_CODES):
            raise InputError(f"reduction code {f[-1]!r} is out of range", file=source, field=where)
        f, redop = f[:-1], REDOP_CODES[f[-1]]
    if code in (T_COLL_AFTER, T_P2P_AFTER):
        if not isinstance(f[-1], list) or not f[-1] or not all(isinstance(r, int) for r in f[-1]):
            raise InputError("after must be a non-empty list of node indices", file=source, field=where)
        f, after = f[:-1], tuple(f[-1])
    if code in (T_P2P_CONN, T_P2P_COMM, T_COLL_OP, T_P2P_GROUP, T_COLL_PG, T_P2P_PG, T_COLL_GROUP):
        if not isinstance(f[-1], list) or not all(isinstance(r, int) for r in f[-1]):
            raise InputError("after must be a list of node indices", file=source, field=where)
        f, after = f[:-1], tuple(f[-1])
    if code not in (T_WAIT, T_WAIT_HANDOFF) and not all(isinstance(x, int) for x in f):
        raise InputError(f"a {_TYPE_NAMES[code]} node has non-integer fields", file=source, field=where)
    try:
        if code == T_COMPUTE:
            return Compute(f[0], names[f[1]], f[2], deps)
        if code in (T_COLL, T_COLL_AFTER, T_COLL_OP, T_COLL_PG, T_COLL_GROUP):
            root = None if f[5] < 0 else f[5]
            sizes, types, kinds, redops, roots = calls
            return Coll(
                f[0], f[1], KIND_CODES[f[2]], f[3], DTYPE_CODES[f[4]], root, f[6], deps, after, redop, pg=pg,
                group_sizes=sizes, group_dtypes=types, group_kinds=kinds, group_redops=redops, group_roots=roots,
            )  # fmt: skip
        if code in (T_P2P, T_P2P_AFTER):
            return P2P(f[0], f[1], bool(f[2]), f[3], f[4], f[5], deps, after)
        if code == T_P2P_CONN:
            if f[6] <= 0:
                raise InputError(f"communicator {f[6]}: type 8 names one after the first", file=source, field=where)
            return P2P(f[0], f[1], bool(f[2]), f[3], f[4], f[5], deps, after, f[6])
        if code == T_P2P_COMM:
            if f[6] < 0 or f[7] < 0:
                raise InputError(f"communicator {f[6]} or its slot {f[7]} is negative", file=source, field=where)
            return P2P(f[0], f[1], bool(f[2]), f[3], f[4], f[5], deps, after, f[6], f[7])
        if code == T_P2P_PG:
            if f[6] < 0 or f[8] < -1 or (f[8] >= 0 and f[7] < 0):
                raise InputError(f"communicator {f[6]}, its slot {f[7]} or launch {f[8]} is out of range", file=source,
                                 field=where)  # fmt: skip
            return P2P(f[0], f[1], bool(f[2]), f[3], f[4], f[5], deps, after, f[6], max(f[7], -1), launch=f[8], pg=pg)
        if code == T_P2P_GROUP:
            if f[6] < 0 or f[7] < 0 or f[8] < 0:
                raise InputError(f"communicator {f[6]}, its slot {f[7]} or launch {f[8]} is negative", file=source,
                                 field=where)  # fmt: skip
            return P2P(f[0], f[1], bool(f[2]), f[3], f[4], f[5], deps, after, f[6], f[7], launch=f[8])
        if code in (T_WAIT, T_WAIT_HANDOFF):
            if not isinstance(f[1], list) or not all(isinstance(r, int) for r in f[1]):
                raise InputError("wait refs must be a list of node indices", file=source, field=where)
            return Wait(f[0], tuple(f[1]), deps, code == T_WAIT_HANDOFF)
        return Step(f[0], f[1], deps)
    except IndexError:
        raise InputError("a name, kind or dtype code is out of range", file=source, field=where) from None


@dataclass(frozen=True)
class RankEntry:
    """Which program a rank runs, and the group index each of its slots stands for."""

    program: int
    groups: tuple[int, ...]


@dataclass
class ExecGraph:
    """A whole recorded job: programs shared between ranks, and per-rank bindings."""

    world: int
    groups: list[tuple[int, ...]]
    programs: list[Program]
    ranks: list[RankEntry]
    meta: dict[str, Any] = field(default_factory=dict)
    recorded: dict[str, Any] = field(default_factory=dict)  # "step_ends_ns": per rank, when recorded

    def program_of(self, rank: int) -> Program:
        return self.programs[self.ranks[rank].program]

    def group_of(self, rank: int, slot: int) -> tuple[int, ...]:
        return self.groups[self.ranks[rank].groups[slot]]

    def num_nodes(self) -> int:
        """Nodes over all ranks (what a non-deduplicated format would store)."""
        return sum(len(self.programs[e.program].nodes) for e in self.ranks)

    def recorded_step_times(self) -> list[int]:
        """Step durations as the runtime defines them: step i ends when the slowest rank ends it."""
        per_rank = self.recorded.get("step_ends_ns") or []
        return step_times(per_rank)

    def check(self, source: str = "<graph>") -> None:
        """Bindings are complete and consistent with each program's collectives."""
        if len(self.ranks) != self.world:
            raise InputError(f"{len(self.ranks)} rank entries for world {self.world}", file=source, field="ranks")
        for gi, g in enumerate(self.groups):
            if not g or len(set(g)) != len(g) or not all(0 <= r < self.world for r in g):
                raise InputError(f"bad group {list(g)} (world {self.world})", file=source, field=f"groups[{gi}]")
        uses: dict[int, tuple[int, list[tuple[int, Coll | P2P]]]] = {}  # per program, read once (not per rank)
        for r, e in enumerate(self.ranks):
            where = f"ranks[{r}]"
            if not 0 <= e.program < len(self.programs):
                raise InputError(f"program {e.program} does not exist", file=source, field=where)
            if e.program not in uses:
                uses[e.program] = _binding_uses(self.programs[e.program])
            num_slots, firsts = uses[e.program]
            if len(e.groups) < num_slots or not all(0 <= g < len(self.groups) for g in e.groups):
                raise InputError(f"needs {num_slots} valid group bindings", file=source, field=where)
            for i, n in firsts:
                if isinstance(n, Coll):
                    g = self.groups[e.groups[n.slot]]
                    if r not in g:
                        raise InputError(f"rank {r} is not in the group {list(g)} of its node {i}", file=source)
                    if n.root is not None and not 0 <= n.root < len(g):
                        raise InputError(f"node {i}: root {n.root} outside a group of {len(g)}", file=source)
                elif isinstance(n, P2P):
                    g = self.groups[e.groups[n.slot]]
                    if len(g) != 2 or g[0 if n.is_send else 1] != r:
                        raise InputError(f"node {i}: transfer {list(g)} does not start/end at rank {r}", file=source)
                    if n.comm >= 0 and not set(g) <= set(self.groups[e.groups[n.comm]]):
                        raise InputError(f"node {i}: its communicator does not hold transfer {list(g)}", file=source)
        self._check_launch_issue(source)

    def _check_launch_issue(self, source: str) -> None:
        """`recorded.launch_issue_ns` (optional): per rank, [issued, joined] ns per P2P node of a group launch; and
        `recorded.launch_release_ns` (optional, with it): per rank, one release ns per such node."""
        times = self.recorded.get(LAUNCH_ISSUE)
        if times is None:
            if LAUNCH_RELEASE in self.recorded:
                raise InputError(f"{LAUNCH_RELEASE} without {LAUNCH_ISSUE}", file=source, field=LAUNCH_RELEASE)
            return
        where = f"recorded.{LAUNCH_ISSUE}"
        if not (isinstance(times, list) and len(times) == self.world):
            raise InputError(f"expected a list of {self.world} ranks' issue times", file=source, field=where)
        for r, ts in enumerate(times):
            want = len(self.program_of(r).launch_nodes())
            ok = isinstance(ts, list) and len(ts) == want
            if not (ok and all(isinstance(t, list) and len(t) == 2 and _ns(t[0]) and _ns(t[1]) for t in ts)):
                raise InputError(
                    f"rank {r}: expected {want} [issued, joined] pairs (ns >= 0)", file=source, field=f"{where}[{r}]"
                )
        released = self.recorded.get(LAUNCH_RELEASE)
        if released is None:
            return
        where = f"recorded.{LAUNCH_RELEASE}"
        if not (isinstance(released, list) and len(released) == self.world):
            raise InputError(f"expected a list of {self.world} ranks' release times", file=source, field=where)
        for r, ts in enumerate(released):
            if not (isinstance(ts, list) and len(ts) == len(times[r]) and all(map(_ns, ts))):
                raise InputError(
                    f"rank {r}: expected {len(times[r])} release ns (ns >= 0), one per issue time",
                    file=source,
                    field=f"{where}[{r}]",
                )


def _binding_uses(prog: Program) -> tuple[int, list[tuple[int, Coll | P2P]]]:
    """A program's slot count and, for `ExecGraph.check`, its first node (index, node) of each distinct binding use:
    (slot, root) of a collective, (slot, direction, communicator slot) of a transfer. A rank's check of a node
    depends on nothing else, so checking the first of each, in node order, finds the first bad node of the whole."""
    firsts: list[tuple[int, Coll | P2P]] = []
    seen: set[tuple[Any, ...]] = set()
    slots = -1
    for i, n in enumerate(prog.nodes):
        if isinstance(n, Coll):
            key: tuple[Any, ...] = (0, n.slot, n.root)
            slots = max(slots, n.slot)
        elif isinstance(n, P2P):
            key = (1, n.slot, n.is_send, n.comm)
            slots = max(slots, n.slot, n.comm)
        else:
            continue
        if key not in seen:
            seen.add(key)
            firsts.append((i, n))
    return slots + 1, firsts


def _ns(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def step_times(per_rank_ends: list[list[int]]) -> list[int]:
    """Durations of steps whose end is the max over ranks of each rank's i-th step end."""
    if not per_rank_ends:
        return []
    n = min(len(x) for x in per_rank_ends)
    ends = [max(x[i] for x in per_rank_ends) for i in range(n)]
    return [e - (ends[i - 1] if i else 0) for i, e in enumerate(ends)]


# ----- assembling ranks into a deduplicated graph -----------------------------------------------------------------
def assemble(
    parts: list[tuple[Program, list[tuple[int, ...]]]],
    meta: dict[str, Any] | None = None,
    recorded: dict[str, Any] | None = None,
) -> ExecGraph:
    """Rank r's (program, slot groups) -> one graph where equal programs and equal groups are stored once."""
    by_digest: dict[bytes, int] = {}
    programs: list[Program] = []
    gindex: dict[tuple[int, ...], int] = {}
    groups: list[tuple[int, ...]] = []
    ranks: list[RankEntry] = []
    for prog, slot_groups in parts:
        key = prog.encode()
        k = by_digest.get(key)
        if k is None:
            k = by_digest[key] = len(programs)
            programs.append(prog)
        bound = []
        for g in slot_groups:
            g = tuple(int(x) for x in g)
            if g not in gindex:
                gindex[g] = len(groups)
                groups.append(g)
            bound.append(gindex[g])
        ranks.append(RankEntry(k, tuple(bound)))
    return ExecGraph(len(parts), groups, programs, ranks, dict(meta or {}), dict(recorded or {}))


# ----- files ------------------------------------------------------------------------------------------------------
def save(graph: ExecGraph, directory: str | Path) -> Path:
    """Write graph.json and programs/ into `directory`; return the index path."""
    d = Path(directory)
    (d / PROGRAM_DIR).mkdir(parents=True, exist_ok=True)
    files = []
    for k, prog in enumerate(graph.programs):
        data = prog.encode()
        rel = f"{PROGRAM_DIR}/p{k}.msgpack"
        (d / rel).write_bytes(data)
        files.append({"file": rel, "sha256": hashlib.sha256(data).hexdigest(), "nodes": len(prog.nodes)})
    index = {
        "format": FORMAT,
        "version": VERSION,
        "world": graph.world,
        "meta": graph.meta,
        "groups": [list(g) for g in graph.groups],
        "programs": files,
        "ranks": [[e.program, list(e.groups)] for e in graph.ranks],
        "recorded": graph.recorded,
    }
    path = d / INDEX
    path.write_text(json.dumps(index, separators=(",", ":")) + "\n")
    return path


def is_graph_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / INDEX).is_file() or (p.name == INDEX and p.is_file())


def load(path: str | Path) -> ExecGraph:
    """Read a graph directory (or its graph.json); every problem is an InputError naming file and field."""
    p = Path(path)
    index_path = p if p.name == INDEX and p.is_file() else p / INDEX
    src = str(index_path)
    if not index_path.is_file():
        raise InputError(f"no {INDEX} here: not an execution-graph directory", file=str(p))
    try:
        index = json.loads(index_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"corrupt or truncated index ({exc})", file=src) from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise InputError(f"not a {FORMAT} index", file=src, field="format")
    if index.get("version") != VERSION:
        raise InputError(
            f"format version {index.get('version')!r}; this phantora reads version {VERSION}", file=src, field="version"
        )
    world = _field(index, "world", int, src)
    groups = [tuple(g) for g in _field(index, "groups", list, src)]
    programs = []
    for k, ent in enumerate(_field(index, "programs", list, src)):
        if not isinstance(ent, dict) or not isinstance(ent.get("file"), str):
            raise InputError("a program entry needs a 'file'", file=src, field=f"programs[{k}]")
        fpath = index_path.parent / ent["file"]
        if not fpath.is_file():
            raise InputError("program file missing", file=str(fpath))
        data = fpath.read_bytes()
        if ent.get("sha256") and hashlib.sha256(data).hexdigest() != ent["sha256"]:
            raise InputError("program file is corrupt or truncated (SHA-256 mismatch)", file=str(fpath))
        programs.append(Program.decode(data, str(fpath)))
    ranks = []
    for r, ent in enumerate(_field(index, "ranks", list, src)):
        if not (isinstance(ent, list) and len(ent) == 2 and isinstance(ent[0], int) and isinstance(ent[1], list)):
            raise InputError("expected [program, [group, ...]]", file=src, field=f"ranks[{r}]")
        ranks.append(RankEntry(ent[0], tuple(ent[1])))
    graph = ExecGraph(world, groups, programs, ranks, dict(index.get("meta") or {}), dict(index.get("recorded") or {}))
    graph.check(src)
    return graph


def _field(index: dict[str, Any], name: str, typ: type, src: str) -> Any:
    val = index.get(name)
    if not isinstance(val, typ) or isinstance(val, bool):
        raise InputError(f"missing or not a {typ.__name__}", file=src, field=name)
    return val


def dir_size_bytes(directory: str | Path) -> int:
    """Bytes on disk of a graph directory (index + programs)."""
    d = Path(directory)
    return sum(p.stat().st_size for p in [d / INDEX, *sorted((d / PROGRAM_DIR).glob("*.msgpack"))] if p.is_file())
