"""A live run's scenario (`phantora run --scenario`): results.json's section and the trace's instant events.

The coordinator's outcome brings the link actions its engine applied, the steps the ranks started and the FCT
slowdown by flow-size bucket of the background traffic and of the job's own flows, apart (`scenario` of the
outcome, also when the engine runs in a network server); each rank's results bring its slow-GPU windows and the
compute time they added; the merged steps give step times before, during and after each event. Every event also
goes into trace.json as a global instant event (Perfetto draws a line across every rank), with a span per slow-GPU
window on the slowed rank's compute track.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from phantora.netsim.fault_plan import timed_actions
from phantora.netsim.scenario import Scenario
from phantora.results.scenario import scenario_results
from phantora.topology.model import Topology

SCENARIO_PID = -1  # the trace's process row of scenario events (below the ranks)


def step_starts(steps: Sequence[Mapping[str, Any]], told: Mapping[int, int] | None = None) -> dict[int, int]:
    """step -> ns it started: as the coordinator saw it (`told`, the first rank), else the merged steps' (the
    end of the step before, its slowest rank's)."""
    out: dict[int, int] = {}
    for i, row in enumerate(steps):
        out[i] = int(row["end_ns"]) - int(row["time_ns"])
        out[i + 1] = int(row["end_ns"])
    out.update(told or {})
    return out


def out_end(spans: Sequence[tuple[int, int]]) -> int:
    return max((b for _, b in spans), default=0)


def planned_rows(sc: Scenario, topo: Topology, end_ns: int) -> list[dict[str, Any]]:
    """The link actions of the scenario's timed events up to `end_ns`, as `applied` lists them: what an engine in
    a network server applied (the coordinator does not see it; the schedule is fixed in advance)."""
    names = topo.nodes
    rows = []
    for a in timed_actions(sc, topo):
        acts = [(a.t_ns, a.op)]
        if a.op in ("down", "up"):
            acts.append((a.t_ns + sc.reconvergence_ns, "reroute"))
        for t, op in acts:
            if t <= end_ns:
                links = [f"{names[topo.links[x].a].name}-{names[topo.links[x].b].name}" for x in a.links]
                row = {"t_ns": t, "op": op, "event": a.label, "links": links}
                rows.append({**row, "stalled_flows": 0, "moved_flows": 0})
    return sorted(rows, key=lambda r: r["t_ns"])


def live_section(
    sc: Scenario,
    topo: Topology,
    outcome: Mapping[str, Any],
    ranks: Mapping[int, Mapping[str, Any]],
    steps: Sequence[Mapping[str, Any]],
    engine_stats: Mapping[str, Any],
) -> dict[str, Any]:
    """results.json's "scenario" of a live run (see the module docstring)."""
    told = {int(k): int(v) for k, v in (outcome.get("steps_started") or {}).items()}
    starts = step_starts(steps, told)
    spans = [(int(r["end_ns"]) - int(r["time_ns"]), int(r["end_ns"])) for r in steps]
    out = scenario_results(sc, topo, None, spans, (), "steps", starts)
    out["applied"] = list(outcome.get("applied") or planned_rows(sc, topo, out_end(spans)))
    for key in ("rerouted_bytes", "rerouted_flows", "lost_bytes", "lost_packets", "stalls", "no_route_flows",
                "retx_bytes", "nic_failovers"):  # fmt: skip
        if key in engine_stats:
            out[key] = engine_stats[key]
    if "background_flows_done" in engine_stats:
        out["background"] = {"flows": engine_stats["background_flows_done"]}
    for key in ("background", "fct_slowdown_background", "fct_slowdown_ml"):  # the coordinator's, when it had them
        if key in outcome:
            out[key] = outcome[key]
    if "fct_slowdown_ml" not in outcome:  # no per-flow records (no --out, or too many flows): no table, say why
        del out["fct_slowdown_ml"]
        out["fct_note"] = "no FCT slowdown of the job's flows: the run kept no per-flow records (run with --out)"
    slow = []
    for rank in sorted(ranks):
        part = ranks[rank].get("scenario") or {}
        for w in part.get("gpu_slow", []):
            slow.append({"rank": rank, **w})
        if part.get("slowed_ns"):
            out.setdefault("slowed_ns", {})[str(rank)] = part["slowed_ns"]
    out["gpu_slow"] = slow
    out["steps_started"] = {str(k): v for k, v in sorted(told.items())}
    out["end_ns"] = out_end(spans)  # the last step's end: open windows are drawn to it
    return out


def trace_events(section: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Chrome trace events of a scenario section: a global instant per link action, a span per slow-GPU window
    (on the slowed rank's compute track) and a process row naming them."""
    ev: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": SCENARIO_PID, "args": {"name": f"scenario {section['name']}"}},
        {"name": "process_sort_index", "ph": "M", "pid": SCENARIO_PID, "args": {"sort_index": -1}},
    ]
    for a in section.get("applied", []):
        ev.append(
            {
                "name": f"{a['op']} {', '.join(a['links'])}",
                "cat": "scenario",
                "ph": "i",
                "s": "g",
                "ts": a["t_ns"] / 1000,
                "pid": SCENARIO_PID,
                "tid": 0,
                "args": {"event": a["event"], "op": a["op"], "links": a["links"]},
            }
        )
    end = int(section.get("end_ns", 0))
    for w in section.get("gpu_slow", []):
        stop = w["end_ns"] if w["end_ns"] is not None else max(end, w["start_ns"])
        ev.append(
            {
                "name": f"gpu_slow x{w['factor']:g}",
                "cat": "scenario",
                "ph": "X",
                "ts": w["start_ns"] / 1000,
                "dur": (stop - w["start_ns"]) / 1000,
                "pid": SCENARIO_PID,
                "tid": 1 + int(w["rank"]),
                "args": {"event": w["event"], "rank": w["rank"], "factor": w["factor"]},
            }
        )
        ev.append(
            {
                "name": f"{w['event']} starts (rank {w['rank']} x{w['factor']:g})",
                "cat": "scenario",
                "ph": "i",
                "s": "g",
                "ts": w["start_ns"] / 1000,
                "pid": SCENARIO_PID,
                "tid": 0,
                "args": {"event": w["event"], "rank": w["rank"], "factor": w["factor"]},
            }
        )
    return ev
