"""CSV writers for the packet engine's traces: PFC frames, queue samples, drops, CNPs, ECN marks, per-link counters.

`phantora netsim` and `phantora replay --network ns3` both write these, with the same columns, so
`phantora compare` reads either.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

PFC_COLUMNS = ["time_ns", "node", "node_type", "port", "prio", "pause", "from_node"]
QUEUE_COLUMNS = ["time_ns", "node", "port", "prio", "bytes"]
DROP_COLUMNS = ["time_ns", "node", "port", "prio", "flow_id", "seq"]
CNP_COLUMNS = ["time_ns", "node", "flow_id", "from_node", "seq"]
ECN_COLUMNS = ["time_ns", "node", "port", "prio", "channel", "flow_id"]
LINK_EXTRA_COLUMNS = ["packets", "paused_ns", "ecn_marks", "max_queue_bytes"]


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    """Write one CSV file with a header row."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_pfc_csv(path: Path, events: Iterable[Any]) -> Path:
    """PFC PAUSE (pause=1) / RESUME (pause=0) frames, as seen by the port they act on."""
    rows = ([e.time_ns, e.node, e.node_type, e.port, e.prio, int(e.pause), e.from_node] for e in events)
    return write_csv(path, PFC_COLUMNS, rows)


def write_queues_csv(path: Path, samples: Iterable[Any]) -> Path:
    """Sampled bytes in each switch egress queue (node, port, priority)."""
    return write_csv(path, QUEUE_COLUMNS, ([q.time_ns, q.node, q.port, q.prio, q.bytes] for q in samples))


def write_drops_csv(path: Path, drops: Iterable[Any]) -> Path:
    """Packets dropped at switch ingress (buffers full with PFC off)."""
    return write_csv(path, DROP_COLUMNS, ([d.time_ns, d.node, d.port, d.prio, d.flow_id, d.seq] for d in drops))


def write_cnps_csv(path: Path, events: Iterable[Any]) -> Path:
    """CNPs (ACKs / NACKs echoing a CE mark) as received by the sending NIC `node`, from the receiver `from_node`."""
    rows = ([e.time_ns, e.node, e.flow_id, e.from_node, e.seq] for e in events)
    return write_csv(path, CNP_COLUMNS, rows)


def write_ecn_csv(path: Path, marks: Iterable[Any]) -> Path:
    """CE marks made at switch egress ports (`channel` matches links.csv)."""
    rows = ([m.time_ns, m.node, m.port, m.prio, m.channel, m.flow_id] for m in marks)
    return write_csv(path, ECN_COLUMNS, rows)


def per_flow_counts(events: Iterable[Any]) -> Counter[int]:
    """flow id -> number of events (CNPs or marks) of that flow."""
    return Counter(e.flow_id for e in events)


def write_packet_traces(out: Path, sim: Any) -> list[Path]:
    """pfc.csv, queues.csv, drops.csv, cnps.csv and ecn_marks.csv of the ns-3 engine; nothing for other engines."""
    if not hasattr(sim, "pfc_events"):
        return []
    return [
        write_pfc_csv(out / "pfc.csv", sim.pfc_events()),
        write_queues_csv(out / "queues.csv", sim.queue_samples()),
        write_drops_csv(out / "drops.csv", sim.drops()),
        write_cnps_csv(out / "cnps.csv", sim.cnp_events()),
        write_ecn_csv(out / "ecn_marks.csv", sim.ecn_mark_events()),
    ]
