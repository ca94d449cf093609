"""What a scenario did to a run (docs/scenarios.md "Results"): the events applied, rerouted and lost bytes,
step (or op) times before, during and after each event, FCT slowdown by flow-size bucket for the background
traffic and the ML job apart, and the plot of step time against simulated time with the events marked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from phantora.netsim.base import Completion
from phantora.netsim.fault_plan import event_window
from phantora.netsim.faults import FaultyFlowSimulator
from phantora.netsim.packet_faults import FaultyNs3Simulator, scenario_engine
from phantora.netsim.scenario import Scenario
from phantora.netsim.standalone import Alone, StandaloneFct, alone_of
from phantora.topology.model import Topology

# Flow-size buckets of the slowdown table (bytes, upper bound exclusive), as the HPCC and DCQCN papers group them
BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (0, 10_000, "<10KB"),
    (10_000, 100_000, "10KB-100KB"),
    (100_000, 1_000_000, "100KB-1MB"),
    (1_000_000, 10_000_000, "1MB-10MB"),
    (10_000_000, None, ">=10MB"),
)


def fct_slowdown_buckets(rows: Iterable[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """(size, fct_ns, standalone_ns) rows -> per size bucket: flows, median, p95, p99 and mean slowdown."""
    by: dict[str, list[float]] = {label: [] for _, _, label in BUCKETS}
    for size, fct, ideal in rows:
        if ideal <= 0:
            continue
        label = next(lab for lo, hi, lab in BUCKETS if size >= lo and (hi is None or size < hi))
        by[label].append(fct / ideal)
    out = []
    for lo, hi, label in BUCKETS:
        v = np.sort(np.asarray(by[label]))
        row: dict[str, Any] = {"bucket": label, "min_bytes": lo, "max_bytes": hi, "flows": int(v.size)}
        if v.size:
            row.update(
                median=round(float(np.percentile(v, 50)), 4),
                p95=round(float(np.percentile(v, 95)), 4),
                p99=round(float(np.percentile(v, 99)), 4),
                mean=round(float(v.mean()), 4),
            )
        out.append(row)
    return out


def completion_rows(
    topo: Topology, done: Iterable[Completion], alone: Mapping[int, Alone] | None = None
) -> list[tuple[int, int, int]]:
    """(size, fct, fluid standalone fct) of completed flows with bytes, each on the path of its own ECMP key at its
    own rate cap (`alone`: flow id -> `Alone`; absent: keyed by its id, no cap, as background traffic is)."""
    fluid = StandaloneFct(topo)
    alone = alone or {}
    return [
        (c.size, c.end_ns - c.start_ns, fluid(c.src, c.dst, c.size, *alone_of(alone, c.flow_id)))
        for c in done
        if c.size and c.src != c.dst
    ]


def phases(spans: Sequence[tuple[int, int]], start: int, end: int | None) -> dict[str, dict[str, float]]:
    """Spans (start, end) of steps or ops split into before / during / after the window [start, end):
    count and mean duration (ns) of each group."""
    groups: dict[str, list[int]] = {"before": [], "during": [], "after": []}
    for a, b in spans:
        if b <= start:
            groups["before"].append(b - a)
        elif end is not None and a >= end:
            groups["after"].append(b - a)
        else:
            groups["during"].append(b - a)
    return {k: {"count": len(v), "mean_ns": round(sum(v) / len(v), 1) if v else 0.0} for k, v in groups.items()}


def applied_rows(engine: FaultyFlowSimulator | FaultyNs3Simulator, topo: Topology) -> list[dict[str, Any]]:
    """The link actions the engine applied so far, links by name (results.json's `applied`)."""
    names = topo.nodes
    if isinstance(engine, FaultyNs3Simulator):
        events = engine.applied_so_far()  # with the fabric's own count of what each re-convergence moved
    else:
        events = [e for e in engine.applied if e.t_ns <= engine.now()]
    return [
        {
            "t_ns": e.t_ns,
            "op": e.op,
            "event": e.label,
            "links": [f"{names[topo.links[x].a].name}-{names[topo.links[x].b].name}" for x in e.links],
            "stalled_flows": e.stalled,
            "moved_flows": e.moved,
            **({"moved_bytes": e.moved_bytes} if e.op == "reroute" else {}),
        }
        for e in events
    ]


def engine_outcome(engine: object) -> dict[str, Any] | None:
    """What a scenario's engine did, as plain data (for the wire and results.json): the link actions applied so far,
    the background traffic done and its FCT slowdown by size bucket (background flows carry no rate cap);
    None for an engine without a scenario."""
    eng = scenario_engine(engine)
    if eng is None:
        return None
    topo, bg = eng.base_topology, eng.background_done
    return {
        "applied": applied_rows(eng, topo),
        "background": {"flows": len(bg), "bytes": sum(c.size for c in bg)},
        "fct_slowdown_background": fct_slowdown_buckets(completion_rows(topo, bg)),
    }


def event_windows(sc: Scenario, step_starts: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """Each event with its window [start, end) (end None: to the end of the run): at its simulated time, or at
    the start of its step (`step_starts`: step -> ns; an event whose step never started is left out)."""
    out = []
    for ev in sc.events:
        at = ev.at_ns if ev.at_step is None else (step_starts or {}).get(ev.at_step)
        if at is None:
            continue
        start, end = event_window(ev, at)
        out.append({"event": ev.label, "kind": ev.kind, "start_ns": start, "end_ns": end})
    return out


def scenario_results(
    sc: Scenario,
    topo: Topology,
    engine: Any,
    spans: Sequence[tuple[int, int]] = (),
    ml_done: Iterable[Completion] = (),
    span_name: str = "steps",
    step_starts: Mapping[int, int] | None = None,
    alone: Mapping[int, Alone] | None = None,
) -> dict[str, Any]:
    """results.json's "scenario" section: events applied, bytes rerouted and lost, `spans` (steps or ops) before,
    during and after each event, and FCT slowdown by size bucket (background and ML apart; `alone`: the ML flows'
    ECMP keys and rate caps, `completion_rows`)."""
    out: dict[str, Any] = {"name": sc.name, "source": sc.source, "seed": sc.seed}
    out["reconvergence_ns"] = sc.reconvergence_ns
    windows = event_windows(sc, step_starts)
    for w in windows:
        w[span_name] = phases(spans, w["start_ns"], w["end_ns"])
    out["events"] = windows
    done = engine_outcome(engine)
    engine = scenario_engine(engine)
    if engine is not None and done is not None:
        out["applied"] = applied_rows(engine, topo)
        st = engine.stats()
        for key in ("rerouted_bytes", "rerouted_flows", "lost_bytes", "stalls", "no_route_flows", "lost_packets",
                    "retx_bytes", "nic_failovers"):  # fmt: skip
            if key in st:
                out[key] = st[key]
        if isinstance(engine, FaultyNs3Simulator):
            out["engine"] = "ns3"
        out["background"] = done["background"]
        out["fct_slowdown_background"] = done["fct_slowdown_background"]
    out["fct_slowdown_ml"] = fct_slowdown_buckets(completion_rows(topo, ml_done, alone))
    return out


def format_scenario(res: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    lines = [f"scenario {res['name']}: {len(res.get('applied', []))} link actions applied"]
    if "lost_packets" in res:  # ns-3: packets lost on the wire and resent by the transport
        lines.append(
            f"  packets lost on failed or lossy links {res.get('lost_packets', 0):,} ({res['lost_bytes']:,} payload "
            f"bytes), retransmitted {res.get('retx_bytes', 0):,} bytes"
            + (
                f"; rerouted {res['rerouted_flows']} flows ({res['rerouted_bytes']:,} bytes)"
                if "rerouted_bytes" in res
                else ""
            )
        )
        if res.get("stalls") or res.get("nic_failovers"):
            lines.append(
                f"  {res.get('stalls', 0)} stalls (on a failed link until re-convergence, or with no route), "
                f"{res.get('nic_failovers', 0)} queue pairs failed over to another NIC port"
            )
    elif "stalls" in res:  # the flow engine's counters
        lines.append(
            f"  rerouted {res['rerouted_flows']} flows ({res['rerouted_bytes']:,} bytes), "
            f"lost {res['lost_bytes']:,} bytes, {res['stalls']} stalls"
        )
    if res.get("no_route_flows"):
        lines.append(
            f"  {res['no_route_flows']} flows stalled with no route left (a NIC down on a one-NIC endpoint, or a "
            "cut fabric) until a link came back"
        )
    for key, what in (("fct_slowdown_background", "background"), ("fct_slowdown_ml", "ML job")):
        rows = [r for r in res.get(key, []) if r["flows"]]
        if rows:
            cells = ", ".join(f"{r['bucket']} {r['median']:.2f}/{r['p99']:.2f} ({r['flows']})" for r in rows)
            lines.append(f"  FCT slowdown median/p99 ({what}): {cells}")
    return "\n".join(lines)
