"""Writers of the run directory: every producer (live run, replay, netsim, network server) writes through these.

Files are written whole to a temporary name and renamed into place, so a reader (or a user looking at a
run that was killed) never sees half a file, and a re-run never leaves a stale file beside fresh ones.
Columns come from `phantora.results.schema`.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from phantora.netsim.base import Completion, Flow, NetworkSimulator
from phantora.netsim.effective import EffectiveSettings
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.engine_warnings import fabric_warnings, tell
from phantora.netsim.observe import (
    ChannelUsage,
    CnpEvent,
    Drop,
    EcnMark,
    FabricObserver,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
)
from phantora.netsim.record_columns import RecordColumns, flow_counts
from phantora.netsim.standalone import Alone, StandaloneFct, alone_of
from phantora.results import schema as S
from phantora.results.forked import write_blocks
from phantora.topology.model import Topology


@contextmanager
def atomic_text(path: Path) -> Iterator[IO[str]]:
    """A text file written under a temporary name in `path`'s directory and renamed onto `path` when the block
    ends (deleted if it fails), so no reader sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            yield f
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same directory and an atomic rename."""
    path = Path(path)
    with atomic_text(path) as f:
        f.write(text)
    return path


def write_json(path: Path, data: Mapping[str, Any], *, indent: int = 2, sort_keys: bool = True) -> Path:
    """One JSON document (its "schema" key set by the caller), newline-terminated."""
    return write_atomic(path, json.dumps(data, indent=indent, sort_keys=sort_keys, default=str) + "\n")


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    """One CSV file with a header row, streamed row by row into the temporary file (`write_atomic`'s name and
    rename): a file of millions of rows (queues.csv) never sits in memory whole, nor do its rows if `rows` is a
    generator."""
    path = Path(path)
    with atomic_text(path) as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


# ----- flows ------------------------------------------------------------------------------------------


def in_flows_csv(c: Completion) -> bool:
    """Whether flows.csv lists completion `c`: a flow that carried bytes between two endpoints. The others are
    zero-byte timing points: a credit (a flag stored across NVLink) or a join at one GPU, an empty call's steps."""
    return c.size > 0 and c.src != c.dst


def flows_csv_count(completions: Iterable[Completion]) -> dict[str, Any]:
    """flows.csv's rule in numbers: `rows`, the flows it lists (`in_flows_csv`), and `not_written`, the others by
    where they ran (`at_one_endpoint`: src == dst; `zero_bytes`: 0 bytes between two endpoints) and kind (the last
    part of their tag, its digits dropped: `credit`, `done`, `step`), so rows + not_written = the flows planned."""
    rows = 0
    left: dict[str, Counter[str]] = {}
    for c in completions:
        if in_flows_csv(c):
            rows += 1
            continue
        kind = c.tag.rsplit("/", 1)[-1].rstrip("0123456789") or "untagged"
        left.setdefault("at_one_endpoint" if c.src == c.dst else "zero_bytes", Counter())[kind] += 1
    return {"rows": rows, "not_written": {where: dict(sorted(k.items())) for where, k in sorted(left.items())}}


def write_flows_csv(
    path: Path,
    topo: Topology,
    completions: Iterable[Completion],
    *,
    flows: Mapping[int, Flow] | None = None,
    fct_ns: Mapping[int, int] | None = None,
    standalone_ns: Mapping[int, int] | None = None,
    cnps: Mapping[int, int] | None = None,
    ecn_marks: Mapping[int, int] | None = None,
    transport: Mapping[int, FlowTransport] | None = None,
    alone: Mapping[int, Alone] | None = None,
) -> Path:
    """flows.csv: one row per completed flow between two nodes, with its FCT and its FCT alone on the fabric.

    `flows` (id -> Flow) gives each flow's priority, ECMP key (default: the flow id) and rate cap, so the
    standalone FCT takes the flow's path at its own rate (`phantora.netsim.standalone`); `alone` (id -> `Alone`:
    key and cap; absent: its id, no cap) gives those of flows not in `flows` (a live run keeps completions, not
    flows). `rate_cap_bps` is that cap (0: none), empty where neither knows the flow. `nvlink` is 1 for a flow
    on its hosts' NVSwitch alone, 0 for one through the NICs (on the path its standalone FCT takes).
    `fct_ns` and `standalone_ns` (id -> ns) replace the FCT (end - start) and the fluid standalone FCT where a
    producer defines them otherwise (netsim: HPCC's, to the last ACK and with headers). `cnps` and `ecn_marks`
    (id -> count) fill those columns, `transport` (id -> FlowTransport) the retransmission and reordering ones;
    None leaves them empty (not measured).
    """
    names = node_names(topo)
    fluid = StandaloneFct(topo)  # each (src, dst, key)'s route once
    done = [c for c in sorted(completions, key=lambda c: c.flow_id) if in_flows_csv(c)]

    def row(c: Completion) -> list[object]:
        f = flows.get(c.flow_id) if flows is not None else None
        cap: int | None
        if f is not None:
            key, cap, nic = (c.flow_id if f.key is None else f.key), f.rate_bps, f.via_nic
        elif alone is not None:
            key, cap, nic = alone_of(alone, c.flow_id)
        else:
            key, cap, nic = c.flow_id, None, False
        fct = fct_ns[c.flow_id] if fct_ns is not None else c.end_ns - c.start_ns
        alone_ns = (
            standalone_ns[c.flow_id] if standalone_ns is not None else fluid(c.src, c.dst, c.size, key, cap or 0, nic)
        )
        return (
            [c.flow_id, c.tag, names[c.src], names[c.dst], c.src, c.dst, c.size, f.priority if f else ""]
            + [c.start_ns, c.end_ns, fct, alone_ns, f"{fct / alone_ns:.4f}" if alone_ns else ""]
            + [_count(cnps, c.flow_id), _count(ecn_marks, c.flow_id)]
            + _transport(transport, c.flow_id)
            + ["" if cap is None else cap, 0 if topo.nvswitch_of(c.src, c.dst, via_nic=bool(nic)) is None else 1]
        )

    if _needs_quoting({c.tag for c in done}) or _needs_quoting(names):
        return write_csv(path, S.FLOWS_COLUMNS, map(row, done))
    return write_plain_rows(path, S.FLOWS_COLUMNS, done, row)


CSV_SPECIAL = frozenset(',"\r\n')  # a field holding one of these is quoted by csv.writer (QUOTE_MINIMAL)
# rows made and formatted into one string before it is written (`write_columns`, `write_plain_rows`): a block's
# rows, their strings and its text are what writing holds, not the file's (918,528 flows.csv rows, the 256-GPU
# MoE step's, in one process: 422 MB more at 1 << 20, 124 MB at 1 << 14, in the same CPU; 2026-12-01)
ROWS_AT_ONCE = 1 << 14


def _needs_quoting(texts: Iterable[str]) -> bool:
    """Would csv.writer quote one of these strings (QUOTE_MINIMAL: a comma, a quote, a line break)?"""
    return any(CSV_SPECIAL.intersection(x) for x in texts)


def write_plain_rows(
    path: Path, header: Sequence[str], rows: Sequence[Any], make: Callable[[Any], Sequence[object]] | None = None
) -> Path:
    """`write_csv` of rows of ints and strings none of which needs quoting, byte for byte as it writes them (str()
    of each field, commas, CRLF), formatted by one `%s` template a row, a block of rows at a time (`make`: each
    item of `rows` made into its row as its block is formatted; large files by several processes,
    `phantora.results.forked`)."""
    path = Path(path)
    template = ",".join(["%s"] * len(header)) + "\r\n"

    def text(a: int, b: int) -> str:
        block = rows[a:b] if make is None else map(make, rows[a:b])
        return "".join(map(template.__mod__, map(tuple, block)))

    with atomic_text(path) as f:
        csv.writer(f).writerow(header)
        write_blocks(f, path, len(rows), text, ROWS_AT_ONCE)
    return path


def write_columns(path: Path, header: Sequence[str], columns: Sequence[Sequence[Any]]) -> Path:
    """A CSV file of equal-length columns (ints and strings), byte for byte as `write_csv` writes their rows:
    when no string needs quoting, each row is formatted by one `%` template (no csv.writer call or row list a row),
    a block of rows at a time (large files by several processes, `phantora.results.forked`)."""
    if any(_needs_quoting(set(c)) for c in columns if c and isinstance(c[0], str)):
        return write_csv(path, header, zip(*columns, strict=True))
    template = ",".join("%s" if c and isinstance(c[0], str) else "%d" for c in columns) + "\r\n"
    path = Path(path)
    n = len(columns[0]) if columns else 0

    def text(a: int, b: int) -> str:
        return "".join(map(template.__mod__, zip(*[c[a:b] for c in columns], strict=True)))

    with atomic_text(path) as f:
        csv.writer(f).writerow(header)
        write_blocks(f, path, n, text, ROWS_AT_ONCE)
    return path


def _transport(transport: Mapping[int, FlowTransport] | None, flow_id: int) -> list[int | str]:
    t = transport.get(flow_id) if transport is not None else None
    if t is None:
        return ["", "", "", ""]
    return [t.retx_packets, t.retx_bytes, t.ooo_packets, t.reorder_max_bytes]


def _count(counts: Mapping[int, int] | None, flow_id: int) -> int | str:
    return "" if counts is None else counts.get(flow_id, 0)


def node_names(topo: Topology) -> list[str]:
    """Node id -> its name, as every file of the run directory names nodes."""
    return [n.name for n in topo.nodes]


# ----- links ------------------------------------------------------------------------------------------


def link_rows(topo: Topology, usage: Iterable[ChannelUsage | PacketChannelUsage]) -> list[list[Any]]:
    """links.csv rows from an engine's per-channel counters; the packet counters stay empty for the flow engine."""
    names = node_names(topo)
    rows = []
    for u in sorted(usage, key=lambda u: u.channel):
        row = [u.channel, u.channel >> 1, names[u.src], names[u.dst], u.src, u.dst, u.bandwidth_bps, u.bytes]
        row.append(f"{u.utilisation:.6f}")
        row += [getattr(u, k, "") for k in S.LINK_EXTRA_COLUMNS]
        rows.append(row)
    return rows


def write_links_csv(path: Path, topo: Topology, usage: Iterable[ChannelUsage | PacketChannelUsage]) -> Path:
    """links.csv: one row per directed channel that carried traffic."""
    return write_csv(path, S.LINK_COLUMNS, link_rows(topo, usage))


# ----- the packet engine's traces ---------------------------------------------------------------------


def _peer(topo: Topology, node: int, port: int) -> str:
    """The name of the node at the other end of `node`'s `port` (ports are numbered as its links attach)."""
    adj = topo.neighbours(node)
    return topo.nodes[adj[port][0]].name if 0 <= port < len(adj) else ""


def _named(names: list[str], ids: list[int]) -> list[str]:
    return [names[i] for i in ids]


def write_pfc_csv(path: Path, topo: Topology, events: Iterable[PfcEvent]) -> Path:
    """PFC PAUSE (pause=1) / RESUME (pause=0) frames, as seen by the port they act on."""
    names = node_names(topo)
    if isinstance(events, RecordColumns):
        t, node, ntype, port, prio, pause, src = events.rows()
        cols: list[Sequence[Any]] = [t, _named(names, node), node, ntype, port, prio, pause, _named(names, src), src]
        return write_columns(path, S.PFC_COLUMNS, cols)
    rows = (
        [e.time_ns, names[e.node], e.node, e.node_type, e.port, e.prio, int(e.pause), names[e.from_node], e.from_node]
        for e in events
    )
    return write_csv(path, S.PFC_COLUMNS, rows)


def write_queues_csv(path: Path, topo: Topology, samples: Iterable[QueueSample]) -> Path:
    """Sampled bytes in each switch egress queue (node, port towards `peer`, priority)."""
    names = node_names(topo)
    peers: dict[tuple[int, int], str] = {}

    def rows() -> Iterator[list[Any]]:  # one at a time: the samples may be many millions (docs/packet-model.md)
        for q in samples:
            peer = peers.get((q.node, q.port))
            if peer is None:
                peer = peers[(q.node, q.port)] = _peer(topo, q.node, q.port)
            yield [q.time_ns, names[q.node], q.node, q.port, peer, q.prio, q.bytes]

    return write_csv(path, S.QUEUE_COLUMNS, rows())


def write_drops_csv(path: Path, topo: Topology, drops: Iterable[Drop]) -> Path:
    """Packets dropped at switch ingress (buffers full with PFC off)."""
    names = node_names(topo)
    if isinstance(drops, RecordColumns):
        t, node, port, prio, fid, seq = drops.rows()
        return write_columns(path, S.DROP_COLUMNS, [t, _named(names, node), node, port, prio, fid, seq])
    rows = ([d.time_ns, names[d.node], d.node, d.port, d.prio, d.flow_id, d.seq] for d in drops)
    return write_csv(path, S.DROP_COLUMNS, rows)


def write_cnps_csv(path: Path, topo: Topology, events: Iterable[CnpEvent]) -> Path:
    """CNPs (ACKs / NACKs echoing a CE mark) as received by the sending NIC `node`, from the receiver `from_node`."""
    names = node_names(topo)
    if isinstance(events, RecordColumns):
        t, node, fid, src, seq = events.rows()
        return write_columns(path, S.CNP_COLUMNS, [t, _named(names, node), node, fid, _named(names, src), src, seq])
    rows = ([e.time_ns, names[e.node], e.node, e.flow_id, names[e.from_node], e.from_node, e.seq] for e in events)
    return write_csv(path, S.CNP_COLUMNS, rows)


def write_ecn_csv(path: Path, topo: Topology, marks: Iterable[EcnMark]) -> Path:
    """CE marks made at switch egress ports (`channel` matches links.csv)."""
    names = node_names(topo)
    if isinstance(marks, RecordColumns):
        t, node, port, prio, ch, fid = marks.rows()
        return write_columns(path, S.ECN_COLUMNS, [t, _named(names, node), node, port, prio, ch, fid])
    rows = ([m.time_ns, names[m.node], m.node, m.port, m.prio, m.channel, m.flow_id] for m in marks)
    return write_csv(path, S.ECN_COLUMNS, rows)


def per_flow_counts(events: Iterable[Any]) -> Counter[int]:
    """flow id -> number of events (CNPs or marks) of that flow."""
    if isinstance(events, RecordColumns):
        return Counter(flow_counts(events))
    return Counter(e.flow_id for e in events)


def write_packet_traces(
    out: Path,
    topo: Topology,
    observer: FabricObserver,
    cnps: Sequence[CnpEvent] | None = None,
    marks: Sequence[EcnMark] | None = None,
) -> list[Path]:
    """pfc.csv, queues.csv, drops.csv, cnps.csv and ecn_marks.csv of an engine that observes the fabric (`cnps`
    and `marks`: its CNPs and CE marks, if the caller has read them already)."""
    return [
        write_pfc_csv(out / S.PFC_CSV, topo, observer.pfc_events()),
        write_queues_csv(out / S.QUEUES_CSV, topo, observer.queue_samples()),
        write_drops_csv(out / S.DROPS_CSV, topo, observer.drops()),
        write_cnps_csv(out / S.CNPS_CSV, topo, observer.cnp_events() if cnps is None else cnps),
        write_ecn_csv(out / S.ECN_CSV, topo, observer.ecn_mark_events() if marks is None else marks),
    ]


def write_fabric_traces(
    out: Path,
    observer: FabricObserver,
    topo: Topology,
    until_ns: int,
    spec: EngineSpec | None = None,
    cnps: Sequence[CnpEvent] | None = None,
    marks: Sequence[EcnMark] | None = None,
) -> list[Path]:
    """The packet traces and links.csv from the engine's own per-link counters over [0, until_ns], and engine.json
    (what the engine ran by; `spec`: the run's EngineSpec, recorded with it; `cnps`, `marks`: as
    `write_packet_traces`)."""
    paths = write_packet_traces(out, topo, observer, cnps, marks)
    paths.append(write_links_csv(out / S.LINKS_CSV, topo, observer.channel_usage(max(1, until_ns))))
    return [*paths, write_engine_json(out, observer.effective(), spec, topo)]


def engine_document(
    settings: EffectiveSettings | None, spec: EngineSpec | None, topo: Topology | None = None
) -> dict[str, Any]:
    """engine.json: the run's `EngineSpec` as plain data ("spec", None if not given), the packet engine's own
    report of what it ran by ("ns3": `EffectiveSettings.report`, None for an engine without ns-3) and "warnings"
    on what it ran by (switches without a shared buffer, named from `topo`)."""
    return {
        "schema": S.ENGINE,
        "spec": None if spec is None else json.loads(json.dumps(spec.to_dict(), default=str)),
        "ns3": None if settings is None else settings.report(),
        "warnings": [] if settings is None else fabric_warnings(settings, topo),
    }


def write_engine_json(
    out: Path, settings: EffectiveSettings | None, spec: EngineSpec | None = None, topo: Topology | None = None
) -> Path:
    """out/engine.json (`engine_document`); its warnings also go to stderr, one line each, unless they were told
    when the engine was built (`phantora.netsim.engine_warnings.tell`)."""
    doc = engine_document(settings, spec, topo)
    if settings is not None:
        tell(settings, doc["warnings"])
    return write_json(out / S.ENGINE_JSON, doc, sort_keys=False)


def write_network_files(
    out: Path,
    topo: Topology,
    engine: NetworkSimulator,
    completions: Iterable[Completion],
    *,
    elapsed_ns: int,
    flows: Mapping[int, Flow] | None = None,
    spec: EngineSpec | None = None,
) -> list[Path]:
    """Every network file an engine (still open) can give: flows.csv and links.csv from any engine; with the
    packet engine also its traces (pfc, queues, drops, cnps, ecn_marks) and each flow's CNPs and CE marks.

    `elapsed_ns` is the time the links' utilisation is taken over (the run's makespan)."""
    fabric = engine.fabric()
    if fabric is None:
        channels = engine.channels()
        path = write_flows_csv(out / S.FLOWS_CSV, topo, completions, flows=flows)
        if channels is None:
            return [path]
        return [path, write_links_csv(out / S.LINKS_CSV, topo, channels.channel_usage(max(1, elapsed_ns)))]
    cnp_events, mark_events = fabric.cnp_events(), fabric.ecn_mark_events()  # read once: counted, then written
    path = write_flows_csv(
        out / S.FLOWS_CSV,
        topo,
        completions,
        flows=flows,
        cnps=per_flow_counts(cnp_events),
        ecn_marks=per_flow_counts(mark_events),
        transport=fabric.flow_transport(),
    )
    return [path, *write_fabric_traces(out, fabric, topo, elapsed_ns, spec, cnp_events, mark_events)]
