"""Outputs of a replay: the printed table, results.json, flows.csv and links.csv."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from phantora.netsim.base import Completion, Flow
from phantora.replay import ReplayResult
from phantora.report.packet_traces import LINK_EXTRA_COLUMNS, write_packet_traces
from phantora.topology.model import Topology
from phantora.units import transmit_ns


def channel_bytes(topo: Topology, flows: list[Flow], completions: list[Completion]) -> list[int]:
    """Bytes carried by each directed channel, from the routes of the completed flows."""
    by_id = {f.id: f for f in flows}
    carried = [0] * topo.num_channels
    for c in completions:
        f = by_id[c.flow_id]
        for ch in topo.route(f.src, f.dst, f.key if f.key is not None else f.id):
            carried[ch] += f.size
    return carried


def standalone_fct_ns(topo: Topology, src: int, dst: int, size: int, key: int) -> int:
    """FCT of the flow alone on an idle network: size at the path's bottleneck rate plus path latency."""
    path = topo.route(src, dst, key)
    if not path:
        return 0
    return transmit_ns(size, topo.path_bottleneck_bps(path)) + topo.path_latency_ns(path)


def link_rows(topo: Topology, carried: list[int], makespan_ns: int) -> list[dict[str, Any]]:
    """One row per directed channel that carried traffic: bytes and mean utilisation over the run."""
    rows = []
    for ch, nbytes in enumerate(carried):
        if not nbytes:
            continue
        a, b = topo.channel_ends(ch)
        bw = topo.channel_bandwidth(ch)
        util = nbytes * 8 * 1e9 / (bw * makespan_ns) if makespan_ns else 0.0
        rows.append(
            {
                "channel": ch,
                "link": ch >> 1,
                "from": topo.nodes[a].name,
                "to": topo.nodes[b].name,
                "bandwidth_bps": bw,
                "bytes": nbytes,
                "utilisation": round(util, 6),
            }
        )
    return rows


def results_dict(res: ReplayResult, *, workload: str, topology: Topology, network: str) -> dict[str, Any]:
    """Deterministic summary (no wall-clock figures) for results.json."""
    return {
        "schema": "phantora.replay/1",
        "workload": workload,
        "topology": topology.summary(),
        "network": network,
        "makespan_ns": res.makespan_ns,
        "ops": [
            {
                "name": r.name,
                "kind": r.kind,
                "bytes": r.nbytes,
                "ranks": r.nranks,
                "start_ns": r.start_ns,
                "end_ns": r.end_ns,
                "duration_ns": r.duration_ns,
                "flows": r.flows,
                **{k: round(v, 3) for k, v in r.metrics.items() if k not in ("duration_ns",)},
            }
            for r in res.ops
        ],
        "engine": {k: v for k, v in res.engine_stats.items() if "wall" not in k},
    }


def write_replay_outputs(
    out: Path,
    res: ReplayResult,
    *,
    workload: str,
    topology: Topology,
    network: str,
    engine: Any | None = None,
) -> dict[str, Path]:
    """Write results.json, flows.csv and links.csv into `out`; return their paths.

    With the ns-3 engine (still open) as `engine`, links.csv takes the engine's own per-link
    counters (bytes on the wire incl. headers and ACKs, paused time, ECN marks, max queue) and
    pfc.csv, queues.csv and drops.csv are written too.
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "flows": out / "flows.csv", "links": out / "links.csv"}
    data = results_dict(res, workload=workload, topology=topology, network=network)
    paths["results"].write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    names = [n.name for n in topology.nodes]
    keys = {f.id: (f.key if f.key is not None else f.id) for f in res.flows}
    with paths["flows"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["flow_id", "tag", "src", "dst", "size_bytes", "start_ns", "end_ns", "fct_ns", "standalone_fct_ns"])
        for c in sorted(res.completions, key=lambda c: c.flow_id):
            alone = standalone_fct_ns(topology, c.src, c.dst, c.size, keys[c.flow_id])
            fct = c.end_ns - c.start_ns
            w.writerow([c.flow_id, c.tag, names[c.src], names[c.dst], c.size, c.start_ns, c.end_ns, fct, alone])
    if engine is not None and hasattr(engine, "pfc_events"):
        rows = packet_link_rows(topology, engine.channel_usage(max(1, res.makespan_ns)))
        for p in write_packet_traces(out, engine):
            paths[p.stem] = p
    else:
        rows = link_rows(topology, channel_bytes(topology, res.flows, res.completions), res.makespan_ns)
    write_links_csv(paths["links"], rows)
    return paths


LINK_COLUMNS = ["channel", "link", "from", "to", "bandwidth_bps", "bytes", "utilisation"]


def write_links_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """links.csv: one row per directed link; the packet engine's rows carry LINK_EXTRA_COLUMNS too."""
    fields = LINK_COLUMNS + (LINK_EXTRA_COLUMNS if rows and "paused_ns" in rows[0] else [])
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def packet_link_rows(topo: Topology, usage: list[Any]) -> list[dict[str, Any]]:
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
        row.update({k: getattr(u, k) for k in LINK_EXTRA_COLUMNS})
        rows.append(row)
    return rows


def format_table(res: ReplayResult) -> str:
    """Human table: one line per op with time, algbw and busbw (GB/s, nccl-tests definitions)."""
    head = (
        f"{'op':<24} {'kind':<15} {'ranks':>5} {'size':>10} {'start us':>11} {'time us':>11} "
        f"{'algbw GB/s':>11} {'busbw GB/s':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in res.ops:
        algbw, busbw = r.metrics.get("algbw", 0) / 1e9, r.metrics.get("busbw", 0) / 1e9
        lines.append(
            f"{r.name[:24]:<24} {r.kind:<15} {r.nranks:>5} {_size(r.nbytes):>10} {r.start_ns / 1e3:>11.2f} "
            f"{r.duration_ns / 1e3:>11.2f} {algbw:>11.2f} {busbw:>11.2f}"
        )
    lines.append(f"makespan: {res.makespan_ns / 1e3:.2f} us simulated, {res.wall_s:.3f} s wall")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n}B"
