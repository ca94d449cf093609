"""Per-job results of a multi-job run: step times, slowdown against the job alone, link use and PFC per job.

- Step time: the steady-state mean (every step but the first, which holds start-up), as `phantora run`
  reports it; a job without steps is timed by its span (end - start).
- Slowdown: the job's time shared / its time alone (the same job, GPUs, engine and traffic class, with
  no other job on the fabric).
- Link use by job: the bytes of each job's flows on each directed link (`links_by_job.csv`), and their
  share of the link's capacity over the run.
- PFC by job (packet mode, from pfc.csv): a PAUSE stops one traffic class of one link (the port of
  `node` towards the switch `from_node` that sent it) until its RESUME. A job *suffers* a pause if one
  of its flows of that class was crossing that link while it lasted (paused time: the overlap with the
  job's flows there). A job *caused* it if one of its flows was leaving that switch on a link the
  paused traffic was heading to (the congested egress) while it lasted. Several jobs may share one
  pause, each counted once; a job can cause the pauses it suffers.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from phantora.results import schema as S
from phantora.results.run_dir import CommKey, nccl_args
from phantora.results.trace_stream import TraceWriter, read_trace_events
from phantora.topology.model import Topology


def step_summary(step_ends: Sequence[int], start_ns: int = 0) -> dict[str, Any]:
    """steps[] and step_time_ns (steady mean without the first step) from the step ends."""
    times = [e - (step_ends[i - 1] if i else start_ns) for i, e in enumerate(step_ends)]
    pairs = zip(step_ends, times, strict=True)
    out: dict[str, Any] = {"steps": [{"index": i, "end_ns": e, "time_ns": t} for i, (e, t) in enumerate(pairs)]}
    steady = times[1:] if len(times) > 1 else times
    if steady:
        out["step_time_ns"] = {
            "mean": statistics.fmean(steady),
            "min": min(steady),
            "max": max(steady),
            "steps_averaged": len(steady),
        }
    return out


def job_time_ns(summary: dict[str, Any]) -> tuple[float | None, str]:
    """(time, what it is): the steady step time, else the job's span."""
    st = summary.get("step_time_ns")
    if isinstance(st, dict) and isinstance(st.get("mean"), (int, float)):
        return float(st["mean"]), "step"
    end, start = summary.get("end_ns"), summary.get("start_ns") or 0
    return (float(end - start), "span") if isinstance(end, (int, float)) else (None, "")


# ----- link use by job ----------------------------------------------------------------------------------------
def link_rows(topo: Topology, per_job: dict[str, dict[int, int]], elapsed_ns: int) -> list[list[Any]]:
    """links_by_job.csv rows: channel, link, from, to, from_id, to_id, bandwidth_bps, job, bytes, utilisation
    (of the link's capacity over `elapsed_ns`); without the job column, the rows of links.csv."""
    rows = []
    names = [n.name for n in topo.nodes]
    for job, chans in per_job.items():
        for ch, nbytes in sorted(chans.items()):
            a, b = topo.channel_ends(ch)
            bw = topo.channel_bandwidth(ch)
            util = nbytes * 8 * 10**9 / (bw * max(1, elapsed_ns))
            rows.append([ch, ch >> 1, names[a], names[b], a, b, bw, job, nbytes, round(util, 6)])
    return rows


LINK_COLUMNS = S.LINKS_BY_JOB_COLUMNS


def channel_bytes(topo: Topology, flows: Iterable[JobFlow]) -> dict[int, int]:
    """Bytes the flows put on each directed channel of their routes."""
    out: dict[int, int] = {}
    for f in flows:
        if f.size and f.src != f.dst:
            for ch in topo.route(f.src, f.dst, f.key, f.via_nic):
                out[ch] = out.get(ch, 0) + f.size
    return out


# ----- PFC by job -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JobFlow:
    """One completed flow of a job: its route's ends and ECMP key, class and when it crossed the fabric."""

    job: str
    src: int
    dst: int
    key: int
    size: int
    prio: int
    start_ns: int
    end_ns: int
    via_nic: bool = False  # through the NICs (`Flow.via_nic`)


Pause = tuple[int, int, int, int, int, int]  # node, port, prio, from_node, start_ns, end_ns


def read_pfc_rows(path: Path) -> list[tuple[int, int, int, int, int, int]]:
    """(time_ns, node id, port, prio, pause, from_node id) of each row of pfc.csv (results/write.py's
    `write_pfc_csv`): `node` and `from_node` hold names there, `node_id` and `from_node_id` the ids; files
    written before names held the ids in `node` and `from_node`."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        named = "node_id" in (reader.fieldnames or ())
        node, frm = ("node_id", "from_node_id") if named else ("node", "from_node")
        return [
            (int(r["time_ns"]), int(r[node]), int(r["port"]), int(r["prio"]), int(r["pause"]), int(r[frm]))
            for r in reader
        ]


def pause_spans(rows: Iterable[Sequence[int]], end_ns: int) -> list[Pause]:
    """(node, port, prio, from_node, start, end) of each PFC pause from pfc.csv rows (time, node, port, prio,
    pause, from_node): a pause lasts until its resume (a second pause extends it), or until `end_ns`."""
    open_at: dict[tuple[int, int, int], tuple[int, int]] = {}
    out: list[Pause] = []
    for t, node, port, prio, pause, frm in sorted(rows, key=lambda r: r[0]):
        key = (node, port, prio)
        if pause and key not in open_at:
            open_at[key] = (t, frm)
        elif not pause and key in open_at:
            t0, f0 = open_at.pop(key)
            out.append((node, port, prio, f0, t0, t))
    for (node, port, prio), (t0, f0) in open_at.items():
        out.append((node, port, prio, f0, t0, max(end_ns, t0)))
    return sorted(out)


def _paused_channel(topo: Topology, node: int, port: int, frm: int) -> int | None:
    """The directed channel a pause stops: from `node`'s port `port` to the switch `frm` that sent it."""
    nbrs = topo.neighbours(node)
    if 0 <= port < len(nbrs) and nbrs[port][0] == frm:
        return nbrs[port][1]
    return next((ch for v, ch in nbrs if v == frm), None)


def _overlap(a: int, b: int, spans: list[tuple[int, int]]) -> int:
    """Length of [a, b) covered by the union of `spans`."""
    cut = sorted((max(a, s), min(b, e)) for s, e in spans if s < b and e > a)
    total, cur = 0, a
    for s, e in cut:
        s = max(s, cur)
        if e > s:
            total += e - s
            cur = e
    return total


def pfc_by_job(topo: Topology, flows: Sequence[JobFlow], pauses: Sequence[Pause]) -> dict[str, dict[str, int]]:
    """Per job: pauses suffered and caused (counts) and paused ns suffered (see the module doc)."""
    on: dict[tuple[int, int], list[tuple[JobFlow, int]]] = {}  # (channel, prio) -> flows crossing it, next hop
    leaving: dict[int, list[JobFlow]] = {}  # channel -> flows on it (any class)
    for f in flows:
        if not f.size or f.src == f.dst:
            continue
        path = topo.route(f.src, f.dst, f.key, f.via_nic)
        for i, ch in enumerate(path):
            on.setdefault((ch, f.prio), []).append((f, path[i + 1] if i + 1 < len(path) else -1))
            leaving.setdefault(ch, []).append(f)
    jobs = sorted({f.job for f in flows})
    out = {j: {"pauses_suffered": 0, "paused_ns_suffered": 0, "pauses_caused": 0} for j in jobs}
    for node, port, prio, frm, t0, t1 in pauses:
        paused = _paused_channel(topo, node, port, frm)
        if paused is None:
            continue
        ch = paused
        crossing = [(f, nxt) for f, nxt in on.get((ch, prio), ()) if f.start_ns < t1 and f.end_ns > t0]
        for job in sorted({f.job for f, _ in crossing}):
            spans = [(f.start_ns, f.end_ns) for f, _ in crossing if f.job == job]
            out[job]["pauses_suffered"] += 1
            out[job]["paused_ns_suffered"] += _overlap(t0, t1, spans)
        egress = {nxt for _, nxt in crossing if nxt >= 0}
        causes = {f.job for e in egress for f in leaving.get(e, ()) if f.start_ns < t1 and f.end_ns > t0}
        for job in causes:
            out[job]["pauses_caused"] += 1
    return out


# ----- the per-job timeline ---------------------------------------------------------------------------------
NETWORK_PID = 1 << 20  # pid of job j's network lane: NETWORK_PID + j (its ranks' pids are their global ranks)


def job_comm_args(records: Iterable[dict[str, Any]], job: int, offset: int) -> dict[CommKey, dict[str, Any]]:
    """NCCL's choice of each of live job `job`'s collectives (cosim.json's records, in the coordinator's ranks) for
    its ranks' spans, which name the job's own ranks: `nccl_args` of its records shifted down by `offset`."""
    mine = []
    for rec in records:
        if rec.get("job") != job:
            continue
        local = {**rec, "group": [int(g) - offset for g in rec.get("group", ())]}
        if isinstance(rec.get("names"), list):
            local["names"] = [[int(g) - offset, n] for g, n in rec["names"]]
        mine.append(local)
    return nccl_args(mine)


def job_trace_events(
    name: str, index: int, offset: int, rank_events: Iterable[dict[str, Any]], collectives: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One job's Perfetto events: its ranks as processes "<job> rank r" (pid = global rank), and a process
    "<job> network" with each collective from its start to its end (overlapping ones on extra lanes)."""
    return [*(job_rank_event(name, offset, ev) for ev in rank_events), *job_network_events(name, index, collectives)]


def job_rank_event(name: str, offset: int, event: dict[str, Any]) -> dict[str, Any]:
    """An event of the job's rank r (its pid) as the run's trace holds it: pid offset + r, process "<job> rank r"."""
    ev = dict(event)
    local = int(ev.get("pid", 0))
    ev["pid"] = offset + local
    if ev.get("ph") == "M" and ev.get("name") == "process_name":
        ev["args"] = {"name": f"{name} rank {local}"}
    elif ev.get("ph") == "M" and ev.get("name") == "process_sort_index":
        ev["args"] = {"sort_index": offset + local}
    return ev


def job_network_events(name: str, index: int, collectives: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The process "<job> network" (pid NETWORK_PID + index): each collective from its start to its end, overlapping
    ones on extra lanes."""
    pid = NETWORK_PID + index
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{name} network"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
    ]
    lanes: list[int] = []
    for c in sorted(collectives, key=lambda c: (c["t_start"], c["end_ns"])):
        lane = next((i for i, t in enumerate(lanes) if t <= c["t_start"]), len(lanes))
        if lane == len(lanes):
            lanes.append(0)
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane, "args": {"name": f"comm.{lane}"}})
        lanes[lane] = c["end_ns"]
        out.append(
            {
                "name": c.get("name") or c["kind"],
                "cat": "comm",
                "ph": "X",
                "pid": pid,
                "tid": lane,
                "ts": c["t_start"] / 1000.0,
                "dur": (c["end_ns"] - c["t_start"]) / 1000.0,
                "args": {"job": name, "kind": c["kind"]},
            }
        )
    return out


@dataclass
class JobTrace:
    """One job's part of the run's trace: its ranks' trace.json (None: no live ranks) and its collectives."""

    name: str
    index: int  # the job's place in the spec (its network lane's pid)
    offset: int  # its rank 0's global rank
    ranks_trace: Path | None
    collectives: Sequence[dict[str, Any]]


def write_jobs_trace(
    f: IO[str],
    jobs: Iterable[JobTrace],
    extra_events: Iterable[dict[str, Any]] = (),
    notes: Mapping[str, Any] | None = None,
) -> None:
    """The run's trace.json to `f`: each job's rank events (read from its trace.json an event at a time) and network
    lane, job after job, then `extra_events` (a scenario's), and `notes` as otherData. It holds one event at a time
    and one block of the file read, never a job's document (`phantora.results.trace_stream`)."""
    out = TraceWriter(f)
    for job in jobs:
        if job.ranks_trace is not None:
            for ev in read_trace_events(job.ranks_trace):
                out.write(job_rank_event(job.name, job.offset, ev))
        for ev in job_network_events(job.name, job.index, job.collectives):
            out.write(ev)
    for ev in extra_events:
        out.write(ev)
    out.close(notes)
