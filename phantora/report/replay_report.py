"""Outputs of a replay: the printed table, results.json and the network files (flows.csv, links.csv, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phantora.netsim.base import NetworkSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.replay import ReplayResult
from phantora.results import schema as S
from phantora.results.run_dir import RunDir
from phantora.results.write import flows_csv_count, write_network_files
from phantora.topology.model import Topology


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
                **({"nccl": r.nccl} if r.nccl else {}),
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
    engine: NetworkSimulator,
    extra: Mapping[str, Any] | None = None,
    spec: EngineSpec | None = None,
) -> dict[str, Path]:
    """Write results.json (plus the sections in `extra`) and every network file the engine (still open) gives
    (`write_network_files`; `spec`: the engine's EngineSpec, recorded in engine.json)."""
    out.mkdir(parents=True, exist_ok=True)
    data = results_dict(res, workload=workload, topology=topology, network=network)
    data.update(extra or {})
    data["flows_csv"] = flows_csv_count(res.completions)  # its rows and the zero-byte flows it leaves out
    paths = {"results": RunDir(out).write_json(S.RESULTS_JSON, data)}
    by_id = {f.id: f for f in res.flows}
    files = write_network_files(
        out, topology, engine, res.completions, elapsed_ns=res.makespan_ns, flows=by_id, spec=spec
    )
    for p in files:
        paths[p.stem] = p
    return paths


def format_table(res: ReplayResult) -> str:
    """Human table: one line per op with time, algbw and busbw (GB/s, nccl-tests definitions)."""
    head = (
        f"{'op':<24} {'kind':<15} {'ranks':>5} {'size':>10} {'start µs':>11} {'time µs':>11} "
        f"{'algbw GB/s':>11} {'busbw GB/s':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in res.ops:
        algbw, busbw = r.metrics.get("algbw", 0) / 1e9, r.metrics.get("busbw", 0) / 1e9
        lines.append(
            f"{r.name[:24]:<24} {r.kind:<15} {r.nranks:>5} {_size(r.nbytes):>10} {r.start_ns / 1e3:>11.2f} "
            f"{r.duration_ns / 1e3:>11.2f} {algbw:>11.2f} {busbw:>11.2f}"
        )
    lines.append(f"makespan: {res.makespan_ns / 1e3:.2f} µs simulated, {res.wall_s:.3f} s wall")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n}B"
