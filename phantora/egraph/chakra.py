"""Export an execution graph to the MLCommons Chakra execution-trace (ET) schema, and read it back.

The Chakra schema package itself is not on PyPI, so the messages of its ``et_def.proto`` that an ET
file uses (package ``ChakraProtoMsg``: GlobalMetadata, Node, AttributeProto, IOInfo) are declared
here with the schema's field numbers and built with the ``protobuf`` library at run time. Files are
what Chakra's own tools write: per rank ``<prefix>.<rank>.et``, a stream of messages each prefixed by
its varint length, GlobalMetadata first. A ``<prefix>.comm_groups.json`` maps each ``pg_name`` to its
ranks (the communicator-group file ASTRA-sim takes).

Mapping: Compute -> COMP_NODE (``duration_micros``, plus the exact ``duration_ns``); Coll ->
COMM_COLL_NODE (``comm_type``, ``comm_size`` in bytes, ``pg_name``); P2P -> COMM_SEND_NODE /
COMM_RECV_NODE (``comm_src``, ``comm_dst``, ``comm_tag``); Wait and Step -> zero-length COMP_NODEs.
A Chakra comm node blocks its dependents, so stream order skips it: the next node of the stream depends
on the node before the collective, and only the Wait depends on the collective itself. Extra
attributes (``phantora_type``, ``stream``, ``seq``, ``dtype``, ``root``, ``phantora_redop`` when not sum,
``phantora_pg`` when not the first group over the ranks, ``phantora_group_sizes`` for a coalesced call (and
``phantora_group_dtypes`` where its calls' dtypes differ, ``phantora_group_kinds``, ``phantora_group_redops`` and
``phantora_group_roots`` where their kinds, reductions or roots do),
``phantora_conn``, ``phantora_comm``,
``phantora_launch`` and ``phantora_issue_ns`` for a transfer of an NCCL group launch) let `read_chakra` rebuild
the graph exactly; Chakra consumers ignore attributes they do not know.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from phantora.egraph.builder import ProgramBuilder, build_graph
from phantora.egraph.call_env import recorded_env
from phantora.egraph.format import LAUNCH_ISSUE, LAUNCH_RELEASE, P2P, Coll, Compute, ExecGraph, NcclEnv, Wait
from phantora.errors import InputError, PhantoraError

SCHEMA_VERSION = "0.0.4"
COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
COMM_TYPE = {
    "all_reduce": 0,
    "reduce": 1,
    "all_gather": 2,
    "broadcast": 5,
    "all_to_all": 6,
    "reduce_scatter": 7,
    "barrier": 9,
}
_ATTR_FIELDS = {  # AttributeProto oneof "value": name -> (field number, protobuf type)
    "double_val": (3, "TYPE_DOUBLE"),
    "int32_val": (7, "TYPE_INT32"),
    "int64_val": (9, "TYPE_INT64"),
    "uint32_val": (11, "TYPE_UINT32"),
    "uint64_val": (13, "TYPE_UINT64"),
    "bool_val": (27, "TYPE_BOOL"),
    "string_val": (29, "TYPE_STRING"),
}

_classes: dict[str, Any] | None = None
# A comm node's `after` nodes (space-separated ids), which are also among its data deps: read back as `after`, so an
# explicit dep on a comm node (on its issue) stays a dep
AFTER_ATTR = "phantora_after"
# A Wait that ended at its lone sends' hand-off (egraph node type 7): read back as such, or its replay waits for the
# sends' flows and a both-send-first program deadlocks.
HANDOFF_ATTR = "phantora_handoff"
CONN_ATTR = "phantora_conn"  # a P2P's communicator (P2P.conn), when not the rank's first: its sends' own slot window
COMM_ATTR = "phantora_comm"  # that communicator's group (a comm_groups.json key, as pg_name), when not the pair's own
LAUNCH_ATTR = "phantora_launch"  # a P2P's NCCL group launch (P2P.launch), on the communicator `phantora_comm` names
ISSUE_ATTR = "phantora_issue_ns"  # that transfer's recorded issue ns (recorded.launch_issue_ns)
JOINED_ATTR = "phantora_joined_ns"  # the latest completion its rank joined before it (recorded.launch_issue_ns)
RELEASE_ATTR = "phantora_release_ns"  # window mode: the ns its rank was last released at (recorded.launch_release_ns)
REDOP_ATTR = "phantora_redop"  # a Coll's reduction, when not sum (Coll.redop)
PG_ATTR = "phantora_pg"  # a Coll's or P2P's process group over its ranks, when not the first (Coll.pg, P2P.pg)
GROUP_ATTR = "phantora_group_sizes"  # a coalesced Coll's calls' bytes, space-separated (Coll.group_sizes)
GROUP_DTYPES_ATTR = "phantora_group_dtypes"  # their dtypes where they differ, space-separated (Coll.group_dtypes)
# their kinds, reductions and group-local roots (-1: none) where they differ, space-separated (Coll.group_kinds, ...)
GROUP_KINDS_ATTR, GROUP_REDOPS_ATTR = "phantora_group_kinds", "phantora_group_redops"
GROUP_ROOTS_ATTR = "phantora_group_roots"
# NCCL_* variables as JSON [[name, value], ...]: a call's own (Coll/P2P.nccl_env) on its node, the run's in the metadata
NCCL_ENV_ATTR = "phantora_nccl_env"
HOST_ATTR = "phantora_gloo"  # a plain gloo group's call, outside the NCCL model (Coll/P2P.host)


def _messages() -> dict[str, Any]:
    """Message classes for the subset of et_def.proto an ET file needs (built once)."""
    global _classes
    if _classes is not None:
        return _classes
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise PhantoraError("Chakra export needs the protobuf package: pip install protobuf") from None
    fd = descriptor_pb2.FileDescriptorProto(name="phantora_chakra_et_def.proto", package="ChakraProtoMsg")
    fd.syntax = "proto3"
    f = descriptor_pb2.FieldDescriptorProto
    opt, rep = f.LABEL_OPTIONAL, f.LABEL_REPEATED

    def add(msg: Any, name: str, num: int, typ: str, label: int = opt, type_name: str = "", oneof: int = -1) -> None:
        fld = msg.field.add(name=name, number=num, type=getattr(f, typ), label=label)
        if type_name:
            fld.type_name = type_name
        if oneof >= 0:
            fld.oneof_index = oneof

    attr = fd.message_type.add(name="AttributeProto")
    add(attr, "name", 1, "TYPE_STRING")
    add(attr, "doc_string", 2, "TYPE_STRING")
    attr.oneof_decl.add(name="value")
    for name, (num, typ) in _ATTR_FIELDS.items():
        add(attr, name, num, typ, oneof=0)
    meta = fd.message_type.add(name="GlobalMetadata")
    add(meta, "version", 1, "TYPE_STRING")
    add(meta, "attr", 2, "TYPE_MESSAGE", rep, ".ChakraProtoMsg.AttributeProto")
    io = fd.message_type.add(name="IOInfo")
    for num, name in enumerate(("values", "shapes", "types"), start=1):
        add(io, name, num, "TYPE_STRING")
    enum = fd.enum_type.add(name="NodeType")
    for num, name in enumerate(("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE",
                                "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")):  # fmt: skip
        enum.value.add(name=name, number=num)
    node = fd.message_type.add(name="Node")
    add(node, "id", 1, "TYPE_UINT64")
    add(node, "name", 2, "TYPE_STRING")
    add(node, "type", 3, "TYPE_ENUM", type_name=".ChakraProtoMsg.NodeType")
    add(node, "ctrl_deps", 4, "TYPE_UINT64", rep)
    add(node, "data_deps", 5, "TYPE_UINT64", rep)
    add(node, "start_time_micros", 6, "TYPE_UINT64")
    add(node, "duration_micros", 7, "TYPE_UINT64")
    add(node, "inputs", 8, "TYPE_MESSAGE", type_name=".ChakraProtoMsg.IOInfo")
    add(node, "outputs", 9, "TYPE_MESSAGE", type_name=".ChakraProtoMsg.IOInfo")
    add(node, "attr", 10, "TYPE_MESSAGE", rep, ".ChakraProtoMsg.AttributeProto")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    _classes = {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ChakraProtoMsg.{n}"))
        for n in ("AttributeProto", "GlobalMetadata", "Node")
    }
    return _classes


def _after_attr(after: tuple[int, ...]) -> list[Any]:
    """The attribute that tells a comm node's `after` from its other data deps (none when it has none)."""
    return [_attr(AFTER_ATTR, string_val=" ".join(map(str, after)))] if after else []


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _attr(name: str, **value: Any) -> Any:
    return _messages()["AttributeProto"](name=name, **value)


def export_chakra(graph: ExecGraph, out_dir: str | Path, prefix: str = "phantora") -> list[Path]:
    """Write ``<prefix>.<rank>.et`` for every rank and ``<prefix>.comm_groups.json``; return the paths."""
    msgs = _messages()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(graph.world):
        e = graph.ranks[r]
        nodes = graph.programs[e.program].nodes
        buf = bytearray()
        meta = msgs["GlobalMetadata"](version=SCHEMA_VERSION)
        meta.attr.append(_attr("exporter", string_val="phantora-egraph"))
        meta.attr.append(_attr("rank", int64_val=r))
        meta.attr.append(_attr("world_size", int64_val=graph.world))
        if (run_env := recorded_env(graph)) is not None:
            meta.attr.append(_attr(NCCL_ENV_ATTR, string_val=json.dumps([list(kv) for kv in run_env])))
        for m in (meta, *_rank_nodes(graph, r, nodes, e.groups)):
            data = m.SerializeToString()
            buf += _varint(len(data)) + data
        path = out / f"{prefix}.{r}.et"
        path.write_bytes(bytes(buf))
        paths.append(path)
    groups = {str(i): list(g) for i, g in enumerate(graph.groups)}
    gpath = out / f"{prefix}.comm_groups.json"
    gpath.write_text(json.dumps(groups, indent=1) + "\n")
    return [*paths, gpath]


def _rank_nodes(graph: ExecGraph, rank: int, nodes: list[Any], bound: tuple[int, ...]) -> list[Any]:
    Node = _messages()["Node"]  # noqa: N806 - a message class
    out = []
    launches = {i: k for k, i in enumerate(graph.program_of(rank).launch_nodes())}  # node -> its issue time's index
    issue = graph.recorded[LAUNCH_ISSUE][rank] if LAUNCH_ISSUE in graph.recorded else None
    release = graph.recorded[LAUNCH_RELEASE][rank] if LAUNCH_RELEASE in graph.recorded else None
    stream_tail: dict[int, int] = {}  # stream -> last node its successors depend on (collectives skipped)
    for i, n in enumerate(nodes):
        node = Node(id=i)
        deps = list(n.deps)
        if n.stream in stream_tail:
            deps.insert(0, stream_tail[n.stream])
        attrs = [_attr("is_cpu_op", bool_val=False), _attr("stream", int64_val=n.stream)]
        if isinstance(n, Compute):
            node.name, node.type, node.duration_micros = n.name, COMP_NODE, round(n.dur_ns / 1000)
            attrs += [_attr("phantora_type", string_val="compute"), _attr("duration_ns", uint64_val=n.dur_ns)]
        elif isinstance(n, Coll):
            g = bound[n.slot]
            deps += list(n.after)  # a comm node issues once its comm deps completed: the stream order
            attrs += _after_attr(n.after)
            node.name, node.type = f"{n.kind}#{n.seq}", COMM_COLL_NODE
            attrs += [
                _attr("phantora_type", string_val="collective"),
                _attr("comm_type", int64_val=COMM_TYPE[n.kind]),
                _attr("comm_size", int64_val=n.nbytes),
                _attr("pg_name", string_val=str(g)),
                _attr("seq", int64_val=n.seq),
                _attr("dtype", string_val=n.dtype),
            ]
            if n.root is not None:
                attrs.append(_attr("root", int64_val=n.root))
            if n.redop != "sum":
                attrs.append(_attr(REDOP_ATTR, string_val=n.redop))
            if n.pg:
                attrs.append(_attr(PG_ATTR, int64_val=n.pg))
            if n.group_sizes:
                attrs.append(_attr(GROUP_ATTR, string_val=" ".join(map(str, n.group_sizes))))
            if n.group_dtypes:
                attrs.append(_attr(GROUP_DTYPES_ATTR, string_val=" ".join(n.group_dtypes)))
            if n.group_kinds:
                attrs.append(_attr(GROUP_KINDS_ATTR, string_val=" ".join(n.group_kinds)))
            if n.group_redops:
                attrs.append(_attr(GROUP_REDOPS_ATTR, string_val=" ".join(n.group_redops)))
            if n.group_roots:
                roots = " ".join(str(-1 if r is None else r) for r in n.group_roots)
                attrs.append(_attr(GROUP_ROOTS_ATTR, string_val=roots))
            attrs += _env_attr(n.nccl_env)
            if n.host:
                attrs.append(_attr(HOST_ATTR, bool_val=True))
        elif isinstance(n, P2P):
            src, dst = graph.groups[bound[n.slot]]
            deps += list(n.after)
            attrs += _after_attr(n.after)
            node.name = f"{'send' if n.is_send else 'recv'}#{n.seq}"
            node.type = COMM_SEND_NODE if n.is_send else COMM_RECV_NODE
            attrs += [
                _attr("phantora_type", string_val="p2p"),
                _attr("comm_src", int32_val=src),
                _attr("comm_dst", int32_val=dst),
                _attr("comm_tag", int32_val=n.tag),
                _attr("comm_size", int64_val=n.nbytes),
                _attr("seq", int64_val=n.seq),
            ]
            if n.pg:
                attrs.append(_attr(PG_ATTR, int64_val=n.pg))
            if n.conn:  # a communicator after the rank's first: lone sends on it have their own slots (P2P.conn)
                attrs.append(_attr(CONN_ATTR, int64_val=n.conn))
            if n.comm >= 0:  # its ranks, when not the pair's own (P2P.comm: whether NCCL uses PXN)
                attrs.append(_attr(COMM_ATTR, string_val=str(bound[n.comm])))
            if n.launch >= 0:  # one NCCL group launch on that communicator, and when this end issued it
                attrs.append(_attr(LAUNCH_ATTR, int64_val=n.launch))
                if issue is not None:
                    issued, joined = issue[launches[i]]
                    attrs += [_attr(ISSUE_ATTR, int64_val=issued), _attr(JOINED_ATTR, int64_val=joined)]
                if release is not None:
                    attrs.append(_attr(RELEASE_ATTR, int64_val=release[launches[i]]))
            attrs += _env_attr(n.nccl_env)
            if n.host:
                attrs.append(_attr(HOST_ATTR, bool_val=True))
        elif isinstance(n, Wait):
            node.name, node.type = "wait", COMP_NODE
            deps += list(n.refs)
            attrs.append(_attr("phantora_type", string_val="wait"))
            if n.handoff:  # it ends at its sends' hand-off, not their flows' end (Wait.handoff)
                attrs.append(_attr(HANDOFF_ATTR, bool_val=True))
        else:
            node.name, node.type = f"step#{n.index}", COMP_NODE
            attrs += [_attr("phantora_type", string_val="step"), _attr("step", int64_val=n.index)]
        node.data_deps.extend(dict.fromkeys(deps))
        node.attr.extend(attrs)
        if not isinstance(n, (Coll, P2P)):
            stream_tail[n.stream] = i
        out.append(node)
    return out


def _env_attr(env: NcclEnv | None) -> list[Any]:
    return [] if env is None else [_attr(NCCL_ENV_ATTR, string_val=json.dumps([list(kv) for kv in env]))]


def _env_of(text: Any, src: str) -> NcclEnv | None:
    """The NCCL_* pairs of an NCCL_ENV_ATTR value; None if absent."""
    if text is None:
        return None
    try:
        pairs = json.loads(str(text))
        return tuple((str(k), str(v)) for k, v in pairs)
    except (ValueError, TypeError):
        raise InputError(f"{NCCL_ENV_ATTR} is not a list of [name, value] pairs: {text!r:.60}", file=src) from None


def _read_messages(path: Path) -> list[bytes]:
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        size, shift = 0, 0
        while True:
            if pos >= len(data) or shift > 63:
                raise InputError(f"truncated length prefix at byte {pos}", file=str(path))
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(data):
            raise InputError(f"truncated message at byte {pos} ({size} bytes announced)", file=str(path))
        out.append(data[pos : pos + size])
        pos += size
    return out


def read_chakra(directory: str | Path, prefix: str = "phantora") -> ExecGraph:
    """Rebuild an ExecGraph from files written by `export_chakra` (round trip; needs the phantora_* attributes)."""
    msgs = _messages()
    d = Path(directory)
    gpath = d / f"{prefix}.comm_groups.json"
    try:
        groups = {int(k): tuple(v) for k, v in json.loads(gpath.read_text()).items()}
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the communicator groups ({exc})", file=str(gpath)) from None
    files = sorted(d.glob(f"{prefix}.*.et"), key=lambda p: int(p.name[len(prefix) + 1 : -3]))
    builders = []
    issued: list[list[list[int]]] = []  # each rank's [issued, joined(, release)] ns of its group launches' transfers
    run_env: NcclEnv | None = None
    for r, path in enumerate(files):
        raw = _read_messages(path)
        if not raw:
            raise InputError("empty ET file", file=str(path))
        meta = msgs["GlobalMetadata"].FromString(raw[0])
        if meta.version != SCHEMA_VERSION:
            raise InputError(f"schema version {meta.version!r}, expected {SCHEMA_VERSION}", file=str(path))
        named = {x.name: x.string_val for x in meta.attr if x.name == NCCL_ENV_ATTR}
        run_env = _env_of(named.get(NCCL_ENV_ATTR), str(path)) or run_env
        issued.append([])
        builders.append(_rank_builder(r, [msgs["Node"].FromString(x) for x in raw[1:]], groups, str(path), issued[-1]))
    meta_out: dict[str, Any] = {"source": "chakra"}
    if run_env is not None:  # the run's NCCL_* (algo_from_meta reads them as a recording's)
        meta_out["algo"] = {"nccl_env": [list(kv) for kv in run_env]}
    times: dict[str, Any] = {}
    if any(issued):  # files written before group launches have none
        times[LAUNCH_ISSUE] = [[t[:2] for t in ts] for ts in issued]
        if all(len(t) == 3 for ts in issued for t in ts):  # a window-mode recording's releases
            times[LAUNCH_RELEASE] = [[t[2] for t in ts] for ts in issued]
    return build_graph(builders, meta=meta_out, recorded=times)


def _rank_builder(
    rank: int, nodes: list[Any], groups: dict[int, tuple[int, ...]], src: str, issued: list[list[int]]
) -> ProgramBuilder:
    """The rank's program from its nodes; [issued, joined] ns of its group launches' transfers appended to `issued`
    (and their release ns third, where the file has them)."""
    b = ProgramBuilder(rank)
    tail: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if node.id != i:
            raise InputError(f"node ids must be 0..n-1 in order, got {node.id} at {i}", file=src)
        late = next((d for d in node.data_deps if d >= i), None)
        if late is not None:
            raise InputError(f"node {i} depends on node {late}, which is not an earlier node", file=src)
        a = {x.name: getattr(x, x.WhichOneof("value")) for x in node.attr if x.WhichOneof("value")}
        kind, stream = a.get("phantora_type"), int(a.get("stream", 0))
        deps = [d for d in node.data_deps if d != tail.get(stream)]
        try:
            after = [int(x) for x in str(a.get(AFTER_ATTR, "")).split()]  # (a comm node's; in its data deps too)
        except ValueError:
            raise InputError(f"node {i}: {AFTER_ATTR} is not a list of node ids", file=src) from None
        rest = [d for d in deps if d not in after]
        if kind == "compute":
            b.compute(node.name, int(a["duration_ns"]), stream, deps)
        elif kind == "collective":
            coll = node.name.split("#")[0]
            group = groups[int(a["pg_name"])]
            op = str(a.get(REDOP_ATTR, "sum"))  # absent: sum (files written before reductions were recorded)
            env = _env_of(a.get(NCCL_ENV_ATTR), src)
            try:
                sizes = [int(x) for x in str(a.get(GROUP_ATTR, "")).split()]
                roots = [None if int(x) < 0 else int(x) for x in str(a.get(GROUP_ROOTS_ATTR, "")).split()]
            except ValueError:
                raise InputError(
                    f"node {i}: {GROUP_ATTR} or {GROUP_ROOTS_ATTR} is not a list of integers", file=src
                ) from None
            b.collective(
                coll,
                group,
                a["comm_size"],
                a["dtype"],
                a.get("root"),
                a["seq"],
                stream,
                rest,
                after=after,
                redop=op,
                nccl_env=env,
                pg=int(a.get(PG_ATTR, 0)),
                group_sizes=sizes,
                group_dtypes=str(a.get(GROUP_DTYPES_ATTR, "")).split(),
                group_kinds=str(a.get(GROUP_KINDS_ATTR, "")).split(),
                group_redops=str(a.get(GROUP_REDOPS_ATTR, "")).split(),
                host=bool(a.get(HOST_ATTR, False)),
                group_roots=roots,
            )
        elif kind == "p2p":
            send = node.type == COMM_SEND_NODE
            peer = a["comm_dst"] if send else a["comm_src"]
            on = groups[int(a[COMM_ATTR])] if COMM_ATTR in a else None
            b.p2p(
                peer,
                send,
                a["comm_size"],
                a["comm_tag"],
                a["seq"],
                stream,
                rest,
                after=after,
                conn=a.get(CONN_ATTR, 0),
                comm=on,
                nccl_env=_env_of(a.get(NCCL_ENV_ATTR), src),
                launch=a.get(LAUNCH_ATTR),
                pg=int(a.get(PG_ATTR, 0)),
                host=bool(a.get(HOST_ATTR, False)),
            )
            if LAUNCH_ATTR in a and ISSUE_ATTR in a:
                release = [int(a[RELEASE_ATTR])] if RELEASE_ATTR in a else []
                issued.append([int(a[ISSUE_ATTR]), int(a.get(JOINED_ATTR, 0)), *release])
        elif kind == "wait":
            comm = [d for d in deps if nodes[d].type in (COMM_COLL_NODE, COMM_SEND_NODE, COMM_RECV_NODE)]
            b.wait(comm, stream, [d for d in deps if d not in comm], handoff=bool(a.get(HANDOFF_ATTR, False)))
        elif kind == "step":
            b.step(int(a["step"]), stream, deps)
        else:
            raise InputError(f"node {i} has no phantora_type attribute: not written by phantora", file=src)
        if kind not in ("collective", "p2p"):
            tail[stream] = i
    return b
