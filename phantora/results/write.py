"""Writers of the run directory: every producer (live run, replay, netsim, network server) writes through these.

Files are written whole to a temporary name and renamed into place, so a reader (or a user looking at a
run that was killed) never sees half a file, and a re-run never leaves a stale file beside fresh ones.
Columns come from `phantora.results.schema`.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from phantora.netsim.base import Completion
from phantora.netsim.observe import FabricObserver
from phantora.netsim.standalone import standalone_fct_ns
from phantora.results import schema as S
from phantora.topology.model import Topology


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same directory and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_json(path: Path, data: Mapping[str, Any], *, indent: int = 2, sort_keys: bool = True) -> Path:
    """One JSON document (its "schema" key set by the caller), newline-terminated."""
    return write_atomic(path, json.dumps(data, indent=indent, sort_keys=sort_keys, default=str) + "\n")


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    """One CSV file with a header row."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return write_atomic(path, buf.getvalue())


# ----- flows ------------------------------------------------------------------------------------------


def write_flows_csv(
    path: Path, topo: Topology, completions: Iterable[Completion], keys: Mapping[int, int] | None = None
) -> Path:
    """flows.csv: one row per completed flow between two nodes, with its FCT and its FCT alone on the fabric.

    `keys` maps a flow id to its ECMP key (default: the flow id), so the standalone FCT takes the flow's path.
    """
    names = [n.name for n in topo.nodes]
    rows = []
    for c in sorted(completions, key=lambda c: c.flow_id):
        if c.size <= 0 or c.src == c.dst:
            continue
        key = keys.get(c.flow_id, c.flow_id) if keys is not None else c.flow_id
        alone = standalone_fct_ns(topo, c.src, c.dst, c.size, key)
        rows.append([c.flow_id, c.tag, names[c.src], names[c.dst], c.size, c.start_ns, c.end_ns])
        rows[-1] += [c.end_ns - c.start_ns, alone]
    return write_csv(path, S.FLOWS_COLUMNS, rows)


# ----- links ------------------------------------------------------------------------------------------


def write_links_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """links.csv: one row per directed link; the packet engine's rows carry LINK_EXTRA_COLUMNS too."""
    fields = S.LINK_COLUMNS + (S.LINK_EXTRA_COLUMNS if rows and "paused_ns" in rows[0] else ())
    return write_csv(path, fields, ([row[f] for f in fields] for row in rows))


def packet_link_rows(topo: Topology, usage: Sequence[Any]) -> list[dict[str, Any]]:
    """links.csv rows from the packet engine's per-channel counters."""
    rows = []
    for u in usage:
        row = {
            "channel": u.channel,
            "link": u.channel >> 1,
            "from": topo.nodes[u.src].name,
            "to": topo.nodes[u.dst].name,
            "bandwidth_bps": u.bandwidth_bps,
            "bytes": u.bytes,
            "utilisation": round(u.utilisation, 6),
        }
        row.update({k: getattr(u, k) for k in S.LINK_EXTRA_COLUMNS})
        rows.append(row)
    return rows


# ----- the packet engine's traces ---------------------------------------------------------------------


def write_pfc_csv(path: Path, events: Iterable[Any]) -> Path:
    """PFC PAUSE (pause=1) / RESUME (pause=0) frames, as seen by the port they act on."""
    rows = ([e.time_ns, e.node, e.node_type, e.port, e.prio, int(e.pause), e.from_node] for e in events)
    return write_csv(path, S.PFC_COLUMNS, rows)


def write_queues_csv(path: Path, samples: Iterable[Any]) -> Path:
    """Sampled bytes in each switch egress queue (node, port, priority)."""
    return write_csv(path, S.QUEUE_COLUMNS, ([q.time_ns, q.node, q.port, q.prio, q.bytes] for q in samples))


def write_drops_csv(path: Path, drops: Iterable[Any]) -> Path:
    """Packets dropped at switch ingress (buffers full with PFC off)."""
    return write_csv(path, S.DROP_COLUMNS, ([d.time_ns, d.node, d.port, d.prio, d.flow_id, d.seq] for d in drops))


def write_cnps_csv(path: Path, events: Iterable[Any]) -> Path:
    """CNPs (ACKs / NACKs echoing a CE mark) as received by the sending NIC `node`, from the receiver `from_node`."""
    rows = ([e.time_ns, e.node, e.flow_id, e.from_node, e.seq] for e in events)
    return write_csv(path, S.CNP_COLUMNS, rows)


def write_ecn_csv(path: Path, marks: Iterable[Any]) -> Path:
    """CE marks made at switch egress ports (`channel` matches links.csv)."""
    rows = ([m.time_ns, m.node, m.port, m.prio, m.channel, m.flow_id] for m in marks)
    return write_csv(path, S.ECN_COLUMNS, rows)


def per_flow_counts(events: Iterable[Any]) -> Counter[int]:
    """flow id -> number of events (CNPs or marks) of that flow."""
    return Counter(e.flow_id for e in events)


def write_packet_traces(out: Path, observer: FabricObserver) -> list[Path]:
    """pfc.csv, queues.csv, drops.csv, cnps.csv and ecn_marks.csv of an engine that observes the fabric."""
    return [
        write_pfc_csv(out / S.PFC_CSV, observer.pfc_events()),
        write_queues_csv(out / S.QUEUES_CSV, observer.queue_samples()),
        write_drops_csv(out / S.DROPS_CSV, observer.drops()),
        write_cnps_csv(out / S.CNPS_CSV, observer.cnp_events()),
        write_ecn_csv(out / S.ECN_CSV, observer.ecn_mark_events()),
    ]


def write_fabric_traces(out: Path, observer: FabricObserver, topo: Topology, until_ns: int) -> list[Path]:
    """The packet traces and links.csv from the engine's own per-link counters over [0, until_ns]."""
    paths = write_packet_traces(out, observer)
    rows = packet_link_rows(topo, observer.channel_usage(max(1, until_ns)))
    return [*paths, write_links_csv(out / S.LINKS_CSV, rows)]
