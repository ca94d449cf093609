"""The wire protocol of the bridge: every message type, its fields, and the msgpack codec.

A message is one msgpack map ``{"v": VERSION, "type": NAME, "t": NS, ...fields}``. ``t`` is a
simulated timestamp in integer ns (the sender's clock, or the network's time for replies; 0
where no time applies). Never pickle: only msgpack maps of ints, strings, lists, bools and nil.

Peers and who sends what (-> request, <- reply, ~> one-way):

rank -> coordinator
  hello -> welcome | error          role "rank", the run token, rank, world
  coll ~>                           collective request: handle, group, seq, kind, nbytes, dtype, root
  p2p ~>                            send or recv: handle, peer, send, tag, seq, nbytes (``handoff``: a lone send's
                                    kernel ns; the calls after it follow its hand-off, not its flow; ``gate``: the
                                    rank's earlier sends whose flows end before it hands off); a recv from any
                                    source (gloo's recvAnysource) gives ``any``, its candidates' [rank, pg] pairs
  io ~>                             a checkpoint file read or written: handle, kind, nbytes, the storage's bandwidths
  value ~>                          an object collective's bytes (torch's pickle, opaque here) under group + key
  values -> valued                  the bytes posted under group + key, one per member (nil: none posted)
  handoff -> handed                 ns from a lone send's start to its hand-off to ``peer`` (nil: not timed), with
                                    ``slots`` (its steps per channel part) and ``one_op`` (a shared network buffer),
                                    ``zero_copy`` (registered buffers: no hand-off), ``back_ns`` (the ns after an
                                    earlier send's flows end that its slots are the sender's again: the path's
                                    propagation back); asked with an optional ``comm``
  clock ~> / -> result              clock report; ``block`` = window barrier (reply when the network caught up)
  wait -> result                    block until one of ``handles`` is done, or the network passed ``until``
  cancel -> cancelled               a wait past its wall-clock deadline (torch's ``Work.wait(timeout)``) given up:
                                    the rank runs again; the wait's ``result``, if already sent, comes first
  test -> result                    is ``h`` done by ``t``? (exact mode; answered once the network reached t)
  finish -> ack                     rank done, with its results map
coordinator -> rank
  error ~>                          the run failed; ``text`` is the diagnostic
  heartbeat ~>                      liveness while a rank waits
  source ~>                         the send a recv from any source takes: its handle ``h``, ``src``, ``seq``
                                    (sent while the rank is blocked, before the recv's result; bridge/anysource.py)
coordinator -> network server
  hello -> welcome                  role "coordinator"; the welcome means the engine is built (ready)
  submit -> state                   flows eligible from ``at``
  advance -> completions            run to ``until``; with ``watch``, stop at the first watched completion
                                    (none completes before ``earliest``)
  drain -> completions              run until nothing is in flight
  get_stats -> stats                engine counters
  get_scenario -> scenario          a scenario's engine: link actions applied, background FCT slowdowns ({} without)
  get_transport -> transport        per flow: [id, retx packets, retx bytes, out-of-order packets, reorder max bytes]
  post -> posted                    decomposition worker: flows as columns (deps on its own flows only), each submitted
                                    at its ``at``, ``gated`` ones also waiting for their gate; ``gates`` opened
                                    as [flow id, ns]; then run to ``until`` (INF_NS: until idle; netsim.decompose);
                                    ``done``: its completions' ids and ends, their other columns in one bin
                                    (``rest``: bridge.columns)
  get_records -> records            decomposition worker: its fabric records (PFC, marks, ...) and channels
  shutdown ~>                       exit
  (advance, drain and post with ``beat`` true: the server's ns-3 runs the call in chunks and sends, between two,)
  <~ progress                       its clock, events, CPU s (phantora.progress.Beat; with workers, theirs merged)
supervisor <-> coordinator
  hello -> welcome, exited ~>, heartbeat ~> ; outcome ~> (the run's results) or error ~>
  progress ~>                       the network's, passed on (RunSpec.progress: the launcher shows it)
  jobfail ~>                        several jobs: one job failed (and only it ends); its ranks got the error

A rank of a multi-job run adds ``job`` (its job's index) to its hello; its ranks are the job's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from bridge.errors import ProtocolError
from phantora.netsim.base import INF_NS as INF_NS  # "never" on the wire (fits int64)
from phantora.netsim.base import Completion, Flow
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FabricObserver,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
    Trim,
    fields_getter,
)

VERSION = 1
MAX_MESSAGE_BYTES = 64 << 20  # larger messages get an "oversized" error reply
HARD_MAX_MESSAGE_BYTES = 4 * MAX_MESSAGE_BYTES  # ZeroMQ drops the connection above this

# Error codes carried by `error` messages and BridgeError.code.
E_MALFORMED = "malformed"
E_OVERSIZED = "oversized"
E_VERSION = "version"
E_AUTH = "auth"
E_UNKNOWN = "unknown-type"
E_PROTOCOL = "protocol"  # a well-formed message that is wrong in this state
E_MISMATCH = "mismatch"
E_DEADLOCK = "deadlock"
E_PEER = "peer-died"
E_TIMEOUT = "timeout"
E_ENGINE = "engine"
E_INTERNAL = "internal"


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_int(v: Any) -> bool:
    return v is None or _int(v)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt_num(v: Any) -> bool:
    return v is None or _num(v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _ints(v: Any) -> bool:
    """A list of ints (not bools). Plain ints, all msgpack decodes to, are checked at C speed (their types counted:
    a list's count compares by identity first, faster than a set of them)."""
    return isinstance(v, list) and (not v or list(map(type, v)).count(int) == len(v) or all(_int(x) for x in v))


def _pairs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, list) and len(x) == 2 and _ints(x) for x in v)


def _list(v: Any) -> bool:
    return isinstance(v, list)


def _bin(v: Any) -> bool:
    return isinstance(v, bytes)


def _map(v: Any) -> bool:
    return isinstance(v, dict)


def _opt_map(v: Any) -> bool:
    return v is None or isinstance(v, dict)


def _any(v: Any) -> bool:
    return True


Check = Callable[[Any], bool]

# type name -> required fields and their checks (extra fields are ignored, for forward compatibility).
SCHEMA: dict[str, dict[str, Check]] = {
    "hello": {"role": _str, "token": _str, "rank": _opt_int, "world": _opt_int, "pid": _int},
    "welcome": {"role": _str, "world": _opt_int, "window_ns": _int, "lease": _int, "info": _map},
    "coll": {
        "h": _int,
        "group": _ints,
        "seq": _int,
        "kind": _str,
        "nbytes": _int,
        "dtype": _str,
        "root": _opt_int,
        "name": _str,
        "algo": _opt_map,
    },
    "p2p": {"h": _int, "peer": _int, "send": _bool, "tag": _int, "seq": _int, "nbytes": _int, "name": _str},
    "io": {"h": _int, "kind": _str, "nbytes": _int, "name": _str, "host_bps": _num, "shared_bps": _opt_num},
    "value": {"group": _ints, "key": _int, "data": _bin},
    "values": {"group": _ints, "key": _int},
    "valued": {"data": _list},
    "handoff": {"peer": _int, "nbytes": _int},
    "handed": {"ns": _opt_int},
    "plans": {"comm": _ints, "ops": _list},  # a rank's group end: its p2p ops [peer, bytes, send] on comm
    "planned": {"plans": _int},
    "clock": {"block": _bool},
    "wait": {"handles": _ints, "until": _int},
    "test": {"h": _int},
    "cancel": {},
    "cancelled": {"now": _int, "lease": _int},  # t: the rank's time as it runs again
    "result": {"h": _opt_int, "t_done": _opt_int, "done": _list, "now": _int, "lease": _int},
    "finish": {"results": _any, "cpu_s": _num},
    "ack": {},
    "error": {"code": _str, "text": _str},
    "heartbeat": {},
    "source": {"h": _int, "src": _int, "seq": _int},
    "shutdown": {"reason": _str},
    "submit": {"flows": _list, "at": _int},
    "advance": {"until": _int, "watch": _ints, "earliest": _opt_int},
    "drain": {"limit": _opt_int},
    "completions": {"done": _list, "now": _int, "in_flight": _int, "next": _opt_int},
    "state": {"now": _int, "in_flight": _int, "next": _opt_int},
    "get_stats": {},
    # flows and done as columns (bridge.columns): one list per field
    "post": {"flows": _map, "at": _ints, "gated": _ints, "gates": _pairs, "until": _int},
    # a decomposition worker's reply to post: its completions and state, the completion bounds of its started
    # flows that rose ([id, ns, id, ns, ...]) and the CPU and wall seconds the post took
    "posted": {
        "done": _map,
        "now": _int,
        "in_flight": _int,
        "next": _opt_int,
        "bounds": _ints,
        "cpu": _num,
        "wall": _num,
    },
    # a decomposition worker asked to plan groups of a workload's ops (`phantora.plan_split.group_job` maps), and its
    # reply: `plan_group`'s maps in order, packed as one msgpack bin, and the CPU seconds the planning and packing took
    "plan_groups": {"jobs": _list},
    "groups_planned": {"replies": _bin, "cpu": _num},
    "get_records": {"elapsed": _int},
    "records": {"records": _map},
    "stats": {"stats": _map},
    "get_scenario": {},
    "scenario": {"scenario": _map},
    "get_transport": {},
    "transport": {"rows": _list},
    "exited": {"who": _str, "rank": _opt_int, "code": _int},
    "jobfail": {"job": _int, "code": _str, "text": _str},  # coordinator -> supervisor: only this job ends
    "joined": {"ranks": _int},  # coordinator -> supervisor: every live rank has connected
    "outcome": {"outcome": _map},
    "where": {},  # supervisor -> coordinator, a run past its bound: where do the ranks stand?
    "stood": {"ranks": _list},  # ... the answer, `CoordinatorCore.stood()`
    # from inside a long engine call (`phantora.progress.Beat`): sim ns, events, CPU s, worker processes, the slowest
    "progress": {"sim": _int, "events": _int, "cpu": _num, "workers": _int, "slowest": _int},
}


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded, checked message: its type, simulated time and fields."""

    type: str
    t: int
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def encode(type_: str, t: int = 0, **fields: Any) -> bytes:
    """One message as msgpack bytes. Checks the fields against SCHEMA (a bug on our side raises)."""
    schema = SCHEMA.get(type_)
    if schema is None:
        raise ValueError(f"unknown message type {type_!r}")
    for name, check in schema.items():
        if name not in fields or not check(fields[name]):
            raise ValueError(f"message {type_!r}: bad or missing field {name!r}: {fields.get(name)!r}")
    if not _int(t):
        raise ValueError(f"message {type_!r}: t must be an int of ns, got {t!r}")
    return msgpack.packb({"v": VERSION, "type": type_, "t": t, **fields}, use_bin_type=True)


def decode(raw: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Bytes -> Message, or ProtocolError with the code of what is wrong (never another exception)."""
    if len(raw) > max_bytes:
        raise ProtocolError(f"message of {len(raw)} bytes is over the {max_bytes}-byte limit", code=E_OVERSIZED)
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types (ValueError, ExtraData, FormatError, StackError ...)
        raise ProtocolError(f"not a msgpack message ({type(exc).__name__})", code=E_MALFORMED) from None
    if not isinstance(obj, dict) or "v" not in obj or "type" not in obj:
        raise ProtocolError("not a bridge message (a map with 'v' and 'type' is expected)", code=E_MALFORMED)
    v, type_ = obj.pop("v"), obj.pop("type")
    if v != VERSION:
        raise ProtocolError(f"protocol version {v!r} is not supported (this side speaks {VERSION})", code=E_VERSION)
    schema = SCHEMA.get(type_) if isinstance(type_, str) else None
    if schema is None:
        raise ProtocolError(f"unknown message type {type_!r}", code=E_UNKNOWN)
    t = obj.pop("t", None)
    if not _int(t):
        raise ProtocolError(f"message {type_!r}: 't' must be integer ns, got {t!r}", code=E_MALFORMED)
    for name, check in schema.items():
        if name not in obj:
            raise ProtocolError(f"message {type_!r}: missing field {name!r}", code=E_MALFORMED)
        if not check(obj[name]):
            raise ProtocolError(f"message {type_!r}: bad value for {name!r}: {obj[name]!r:.80}", code=E_MALFORMED)
    return Message(type_, t, obj)


# ----- flows and completions on the wire ------------------------------------------------------
def flow_to_wire(f: Flow, deps: Sequence[int] | None = None) -> list[Any]:
    """9 fields; a 10th, the DLCP loss budget, an 11th, the rate cap (payload bits/s), a 12th, the connection, a
    13th, the queue, and a 14th, 1 for a flow through the NICs, only when needed (a trailing field is sent when it or
    a later one is not 0). `deps` replaces the flow's own."""
    row = [f.id, f.src, f.dst, f.size, list(f.deps if deps is None else deps), f.delay_ns, f.tag, f.priority, f.key]
    extra = [f.loss_budget, f.rate_bps, f.conn, f.queue, int(f.via_nic)]
    while extra and not extra[-1]:
        extra.pop()
    return [*row, *extra]


def flow_from_wire(row: Any) -> Flow:
    """A wire row (9 to 14 fields) -> Flow; ProtocolError if the row is not a well-formed flow."""
    if not isinstance(row, list) or not 9 <= len(row) <= 14:
        raise ProtocolError(f"a flow is a list of 9 (to 14) fields, got {row!r:.80}", code=E_MALFORMED)
    fid, src, dst, size, deps, delay, tag, prio, key = row[:9]
    budget, rate, conn, queue, nic = [*row[9:], 0, 0, 0, 0, 0][:5]
    ints = (fid, src, dst, size, delay, prio, budget, rate, conn, queue)
    if not (all(_int(x) for x in ints) and _ints(deps) and _str(tag) and _opt_int(key) and nic in (0, 1)):
        raise ProtocolError(f"bad flow fields {row!r:.80}", code=E_MALFORMED)
    return Flow(fid, src, dst, size, tuple(deps), delay, tag, prio, key, budget, rate, conn, queue, bool(nic))


def completion_to_wire(c: Completion) -> list[Any]:
    """7 fields; an 8th, the lost ranges as [offset, bytes] pairs, only when some bytes were lost."""
    row = [c.flow_id, c.start_ns, c.end_ns, c.size, c.src, c.dst, c.tag]
    return [*row, [list(r) for r in c.lost]] if c.lost else row


def completion_from_wire(row: Any) -> Completion:
    if not isinstance(row, list) or len(row) not in (7, 8):
        raise ProtocolError(f"a completion is a list of 7 (or 8) fields, got {row!r:.80}", code=E_MALFORMED)
    if len(row) == 8:
        lost = row[7]
        if not isinstance(lost, list) or not all(isinstance(r, list) and len(r) == 2 and _ints(r) for r in lost):
            raise ProtocolError(f"bad lost ranges {lost!r:.80}", code=E_MALFORMED)
        fid, start, end, size, src, dst, tag = row[:7]
        return Completion(fid, start, end, size, src, dst, tag, tuple((int(a), int(b)) for a, b in lost))
    return Completion(*row)


def transport_row(t: FlowTransport) -> list[int]:
    """A flow's transport counters on the wire: [id, retx packets, retx bytes, out-of-order packets, reorder max]."""
    return [t.flow_id, t.retx_packets, t.retx_bytes, t.ooo_packets, t.reorder_max_bytes]


def transport_from_rows(rows: Any) -> dict[int, FlowTransport]:
    """Flow id -> its counters, from `transport_row` lists (a malformed row is a protocol error)."""
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 5 and _ints(r) for r in rows):
        raise ProtocolError(f"transport rows are lists of 5 ints, got {rows!r:.80}", code=E_MALFORMED)
    return {int(r[0]): FlowTransport(*(int(x) for x in r)) for r in rows}


def flows_to_wire(flows: Sequence[Flow]) -> list[list[Any]]:
    return [flow_to_wire(f) for f in flows]


# ----- a decomposition worker's fabric records on the wire ------------------------------------------
RECORD_KINDS = {
    "pfc": PfcEvent,
    "queues": QueueSample,
    "drops": Drop,
    "trims": Trim,
    "cnps": CnpEvent,
    "marks": EcnMark,
    "transport": FlowTransport,
    "usage": PacketChannelUsage,
}


def records_to_wire(fabric: FabricObserver, elapsed_ns: int) -> dict[str, list[list[Any]]]:
    """Every record of a fabric observer as rows of its dataclass's fields (channel use over `elapsed_ns`)."""
    lists: dict[str, Sequence[Any]] = {
        "pfc": fabric.pfc_events(),
        "queues": fabric.queue_samples(),
        "drops": fabric.drops(),
        "trims": fabric.trims(),
        "cnps": fabric.cnp_events(),
        "marks": fabric.ecn_mark_events(),
        "transport": list(fabric.flow_transport().values()),
        "usage": fabric.channel_usage(elapsed_ns),
    }
    # each row its record's fields in order (astuple's, the records being flat)
    out = {k: [list(fields_getter(type(r))(r)) for r in v] for k, v in lists.items()}
    out["effective"] = [[k, v] for k, v in fabric.effective().to_pairs()]  # what the fabric runs by
    return out


def records_from_wire(d: dict[str, Any]) -> dict[str, list[Any]]:
    """`records_to_wire`'s map back to records; ProtocolError if a row does not fit its kind."""
    out: dict[str, list[Any]] = {}
    for kind, cls in RECORD_KINDS.items():
        rows = d.get(kind, [])
        try:
            out[kind] = [cls(*row) for row in rows]
        except TypeError:
            raise ProtocolError(f"bad {kind} records", code=E_MALFORMED) from None
    pairs = d.get("effective", [])
    if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(w, str) for w in p) for p in pairs):
        raise ProtocolError("bad effective settings", code=E_MALFORMED)
    out["effective"] = [(str(k), str(v)) for k, v in pairs]
    return out
