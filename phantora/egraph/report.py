"""Text and JSON reports of a graph replay, next to the recorded step times when the graph has them."""

from __future__ import annotations

from typing import Any

from phantora.egraph.format import ExecGraph
from phantora.egraph.replay import GraphReplayResult
from phantora.results import schema


def format_graph_result(res: GraphReplayResult, graph: ExecGraph) -> str:
    """Steps (replayed vs recorded), communication per kind, and the size of the replayed DAG."""
    recorded = graph.recorded_step_times()
    lines = []
    for i, t in enumerate(res.step_times_ns[:20]):
        line = f"  step {i:>3}: {t / 1e6:10.3f} ms"
        if i < len(recorded):
            rec = recorded[i]
            diff = 100 * (t - rec) / rec if rec else 0.0
            line += f"   recorded {rec / 1e6:10.3f} ms  ({diff:+.3f}%)"
        lines.append(line)
    if len(res.step_times_ns) > 20:
        lines.append(f"  ... {len(res.step_times_ns) - 20} more steps")
    if not res.step_times_ns:
        lines.append(f"  no step marks; last rank ends at {max(res.rank_end_ns, default=0) / 1e6:.3f} ms")
    for kind, c in res.comm.items():
        lines.append(
            f"  {kind:<15} {c['count']:>6} calls {c['bytes'] / 2**20:12.1f} MiB  busy {c['busy_ns'] / 1e6:10.3f} ms"
        )
    lines.append(
        f"  {res.flows:,} flows ({res.markers:,} markers); plan {res.plan_s:.2f} s, total {res.wall_s:.2f} s wall"
    )
    return "\n".join(lines)


def graph_results(res: GraphReplayResult, graph: ExecGraph, **run: Any) -> dict[str, Any]:
    """results.json of a graph replay: deterministic (no wall-clock figure)."""
    data = {"schema": schema.EGRAPH_REPLAY, **res.to_dict()}
    data["run"] = {**run, "world": graph.world, "programs": len(graph.programs), "meta": graph.meta}
    recorded = graph.recorded_step_times()
    if recorded:
        data["recorded_step_times_ns"] = recorded
    return data
