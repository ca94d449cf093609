"""Outputs of a replay: the printed table, results.json, flows.csv and links.csv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phantora.netsim.base import Completion, Flow, NetworkSimulator
from phantora.replay import ReplayResult
from phantora.results import schema as S
from phantora.results.write import write_fabric_traces, write_flows_csv, write_json, write_links_csv
from phantora.topology.model import Topology


def channel_bytes(topo: Topology, flows: list[Flow], completions: list[Completion]) -> list[int]:
    """Bytes carried by each directed channel, from the routes of the completed flows."""
    by_id = {f.id: f for f in flows}
    carried = [0] * topo.num_channels
    for c in completions:
        f = by_id[c.flow_id]
        for ch in topo.route(f.src, f.dst, f.key if f.key is not None else f.id):
            carried[ch] += f.size
    return carried


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
        "schema": S.REPLAY,
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
    engine: NetworkSimulator | None = None,
) -> dict[str, Path]:
    """Write results.json, flows.csv and links.csv into `out`; return their paths.

    With the ns-3 engine (still open) as `engine`, links.csv takes the engine's own per-link
    counters (bytes on the wire incl. headers and ACKs, paused time, ECN marks, max queue) and
    pfc.csv, queues.csv and drops.csv are written too.
    """
    out.mkdir(parents=True, exist_ok=True)
    data = results_dict(res, workload=workload, topology=topology, network=network)
    paths = {"results": write_json(out / S.RESULTS_JSON, data)}
    keys = {f.id: (f.key if f.key is not None else f.id) for f in res.flows}
    paths["flows"] = write_flows_csv(out / S.FLOWS_CSV, topology, res.completions, keys)
    fabric = engine.fabric() if engine is not None else None
    if fabric is not None:
        for p in write_fabric_traces(out, fabric, topology, res.makespan_ns):
            paths[p.stem] = p
    else:
        rows = link_rows(topology, channel_bytes(topology, res.flows, res.completions), res.makespan_ns)
        paths["links"] = write_links_csv(out / S.LINKS_CSV, rows)
    return paths


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
