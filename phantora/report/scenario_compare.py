"""`phantora compare` of a faulty run beside a clean one (issue 36): what the fault cost and who absorbed it.

For every run after the first whose results.json has a scenario section: its events and the bytes lost and
rerouted; its cost against the first run (iteration time or makespan, and per step where both have steps);
and the collectives that absorbed it, the largest increases of their time first, with each one's share of
the total increase.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from phantora.results.read import RunData, read_results

TOP = 5  # collectives listed per faulty run


def step_times(run: RunData) -> list[int] | None:
    """Per-step times (ns): steps.jsonl of a live run, else a replayed graph's step_times_ns; None without."""
    if run.step_times_ns is not None:
        return run.step_times_ns
    res = read_results(run.path) or {}
    steps = res.get("step_times_ns")
    return [int(t) for t in steps] if isinstance(steps, list) and steps else None


def absorbed(base: dict[str, int] | None, run: dict[str, int] | None, top: int = TOP) -> list[dict[str, Any]]:
    """The collectives (by name, in both runs) whose time grew most: name, base and run ns, increase, share."""
    if not base or not run:
        return []
    grown = {k: run[k] - base[k] for k in run if k in base and run[k] > base[k]}
    total = sum(grown.values())
    ranked = sorted(grown.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [
        {"name": k, "base_ns": base[k], "ns": run[k], "increase_ns": d, "share": round(d / total, 4)} for k, d in ranked
    ]


def fault_costs(runs: Sequence[RunData]) -> list[dict[str, Any]]:
    """One entry per faulty run after the first (see the module docstring); [] if none has a scenario."""
    if len(runs) < 2:
        return []
    base = runs[0]
    base_steps = step_times(base)
    out = []
    for run in runs[1:]:
        sc = (read_results(run.path) or {}).get("scenario")
        if not isinstance(sc, dict):
            continue
        entry: dict[str, Any] = {"run": run.label, "scenario": sc.get("name"), "baseline": base.label}
        entry["events"] = [{k: e.get(k) for k in ("event", "kind", "start_ns", "end_ns")} for e in sc.get("events", [])]
        for key in ("lost_bytes", "rerouted_bytes", "rerouted_flows", "stalls", "retx_bytes"):
            if key in sc:
                entry[key] = sc[key]
        if run.time_ns is not None and base.time_ns is not None:
            entry["time_kind"] = run.time_kind
            entry["time_cost_ns"] = run.time_ns - base.time_ns
        steps = step_times(run)
        if steps and base_steps:
            deltas = [a - b for a, b in zip(steps, base_steps, strict=False)]
            entry["step_cost_ns"] = deltas
            entry["total_step_cost_ns"] = sum(deltas)
        entry["absorbed_by"] = absorbed(base.collectives, run.collectives)
        out.append(entry)
    return out


def _window(e: dict[str, Any]) -> str:
    end = "" if e["end_ns"] is None else f" to {e['end_ns'] / 1e3:.1f}"
    return f"{e['event']} from {e['start_ns'] / 1e3:.1f}{end} µs"


def format_costs(costs: Sequence[dict[str, Any]]) -> list[str]:
    """Lines for the terminal (and, as a list, the markdown report)."""
    lines: list[str] = []
    for c in costs:
        lines.append(f"fault cost of {c['run']} (scenario {c['scenario']}) against {c['baseline']}:")
        evs = ", ".join(_window(e) for e in c["events"])
        lines.append(f"  events: {evs or '-'}")
        if "time_cost_ns" in c:
            what = "iteration time" if c.get("time_kind") == "iteration" else "makespan"
            lines.append(f"  {what}: {c['time_cost_ns'] / 1e3:+.2f} µs")
        if "step_cost_ns" in c:
            per = ", ".join(f"{d / 1e3:+.1f}" for d in c["step_cost_ns"])
            lines.append(f"  per step (µs): {per}; total {c['total_step_cost_ns'] / 1e3:+.1f} µs")
        if "lost_bytes" in c:
            extra = f", rerouted {c['rerouted_bytes']:,} bytes" if "rerouted_bytes" in c else ""
            lines.append(f"  lost {c['lost_bytes']:,} bytes{extra}")
        if c["absorbed_by"]:
            lines.append("  absorbed by (largest increase first):")
            for a in c["absorbed_by"]:
                lines.append(
                    f"    {a['name'][:36]:<36} {a['base_ns'] / 1e3:10.2f} -> {a['ns'] / 1e3:10.2f} µs "
                    f"({a['increase_ns'] / 1e3:+.2f}, {a['share'] * 100:.0f}% of the increase)"
                )
    return lines
