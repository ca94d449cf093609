"""Compare run directories: one metric per row, one column per run, and each run's difference from the first in %.

Percentiles are numpy's default (linear interpolation). Slowdown = FCT / standalone FCT over flows with
bytes and a known standalone FCT. The "(network flows)" rows take only the flows that left through the NICs
(flows.csv `nvlink` 0), shown when a run has both those and flows on NVLink alone. PFC paused time is the time
between a port's pause and its resume (summed over priorities; a pause still open at the end of the run closes
there). Queue depth is the sum
over priorities of a (switch, port) egress queue at each sampling instant; p99 is taken at the hottest
port (the one with the largest depth).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from phantora.errors import InputError
from phantora.report.fabric import hottest_port, pause_intervals
from phantora.report.flow_kinds import network_flows
from phantora.report.spread import spread
from phantora.results import schema as S
from phantora.results.read import Flows, RunData, add_fabric_ports, load_run, read_document, read_results
from phantora.results.run_dir import RunDir
from phantora.units import plural

Value = int | float | None

# Scalar metrics of one run: key -> (label, unit, section).
SUMMARY: dict[str, tuple[str, str, str]] = {
    "time_ns": ("iteration time / makespan", "ns", "time"),
    "fct_p50_ns": ("FCT p50", "ns", "flows"),
    "fct_p99_ns": ("FCT p99", "ns", "flows"),
    "fct_max_ns": ("FCT max", "ns", "flows"),
    "slowdown_p50": ("slowdown p50 (FCT / standalone)", "ratio", "flows"),
    "slowdown_p99": ("slowdown p99", "ratio", "flows"),
    "slowdown_max": ("slowdown max", "ratio", "flows"),
    "net_flows": ("flows through the network", "count", "flows"),
    "nvlink_flows": ("flows on NVLink alone", "count", "flows"),
    "net_fct_p50_ns": ("FCT p50 (network flows)", "ns", "flows"),
    "net_fct_p99_ns": ("FCT p99 (network flows)", "ns", "flows"),
    "net_fct_max_ns": ("FCT max (network flows)", "ns", "flows"),
    "net_slowdown_p50": ("slowdown p50 (network flows)", "ratio", "flows"),
    "net_slowdown_p99": ("slowdown p99 (network flows)", "ratio", "flows"),
    "pfc_pauses": ("PFC pause frames", "count", "pfc"),
    "pfc_paused_ns": ("PFC paused time (all ports)", "ns", "pfc"),
    "queue_max_bytes": ("queue depth max", "bytes", "queues"),
    "queue_p99_bytes": ("queue depth p99 (hottest port)", "bytes", "queues"),
    "ecn_marks": ("ECN marks", "count", "ecn"),
    "cnps": ("CNPs", "count", "ecn"),
    "drops": ("drops", "count", "ecn"),
    "util_mean": ("link utilisation mean", "fraction", "links"),
    "util_max": ("link utilisation max", "fraction", "links"),
    "switch_link_spread": ("switch-link bytes max / min", "ratio", "links"),
    "switch_links_idle": ("switch links idle", "count", "links"),
    "queue_pairs": ("queue pairs opened", "count", "transport"),
    "retx_packets": ("retransmitted packets", "count", "transport"),
    "retx_bytes": ("retransmitted bytes", "bytes", "transport"),
    "ooo_packets": ("packets out of order at receivers", "count", "transport"),
    "reorder_max_bytes": ("reordering depth max", "bytes", "transport"),
    "trimmed_bytes": ("DLCP trimmed (lost) bytes", "bytes", "transport"),
}
# Per traffic class rows ("class:WHAT:P"): WHAT -> (label, unit); bytes from flows.csv, the rest from the engine.
CLASS_ROWS: dict[str, tuple[str, str]] = {
    "bytes": ("flow bytes", "bytes"),
    "drops": ("drops", "count"),
    "trimmed": ("DLCP trimmed (lost) bytes", "bytes"),
}
_CLASS_STATS = {"drops": "drops_class", "trimmed": "trimmed_bytes_class"}  # engine stat prefix per class row


# ----- per-run figures --------------------------------------------------------------------------------


# The rows over the flows through the network (flows.csv `nvlink` 0), shown where a run has NVLink flows too.
NET_KEYS: tuple[str, ...] = ("net_flows", "nvlink_flows", "net_fct_p50_ns", "net_fct_p99_ns", "net_fct_max_ns")
NET_KEYS += ("net_slowdown_p50", "net_slowdown_p99")


def fct_stats(flows: Flows | None) -> dict[str, Value]:
    """FCT p50/p99/max (ns) and slowdown p50/p99/max over flows that carry bytes; where flows.csv says which flows
    stayed on NVLink, the counts of both kinds and the same figures (max slowdown aside) over the network's."""
    out: dict[str, Value] = dict.fromkeys(("fct_p50_ns", "fct_p99_ns", "fct_max_ns"))
    out.update(dict.fromkeys(("slowdown_p50", "slowdown_p99", "slowdown_max")))
    out.update(dict.fromkeys(NET_KEYS))
    if flows is None:
        return out
    real = flows.size > 0
    out.update(_percentiles(flows, real, ""))
    net = network_flows(flows)
    if net is not None:
        out["net_flows"], out["nvlink_flows"] = int(net.sum()), int((real & (flows.nvlink == 1)).sum())
        out.update({k: v for k, v in _percentiles(flows, net, "net_").items() if k in NET_KEYS})
    return out


def shown(keys: Sequence[str], mixed: bool) -> list[str]:
    """`keys` without the network-flow ones (NET_KEYS) unless `mixed`: some run has both kinds of flows
    (`both_kinds`); a run of network flows alone would only repeat its all-flow figures in them."""
    return [k for k in keys if mixed or k not in NET_KEYS]


def _percentiles(flows: Flows, chosen: np.ndarray, prefix: str) -> dict[str, Value]:
    """FCT and slowdown p50/p99/max over the `chosen` flows (slowdowns over those with a standalone FCT), keyed
    with `prefix`; none for an empty choice."""
    out: dict[str, Value] = {}
    fct = flows.fct_ns[chosen]
    if fct.size:
        out[f"{prefix}fct_p50_ns"] = float(np.percentile(fct, 50))
        out[f"{prefix}fct_p99_ns"] = float(np.percentile(fct, 99))
        out[f"{prefix}fct_max_ns"] = int(fct.max())
    known = chosen & (flows.standalone_ns > 0)
    if known.any():
        slow = flows.fct_ns[known] / flows.standalone_ns[known]
        out[f"{prefix}slowdown_p50"] = float(np.percentile(slow, 50))
        out[f"{prefix}slowdown_p99"] = float(np.percentile(slow, 99))
        out[f"{prefix}slowdown_max"] = float(slow.max())
    return out


def both_kinds(values: dict[str, Value]) -> bool:
    """Does a run's `fct_stats` count flows on NVLink alone and flows through the network?"""
    return bool(values.get("net_flows")) and bool(values.get("nvlink_flows"))


def engine_warnings(run: RunData) -> list[str]:
    """The packet engine's warnings on what the run ran by (engine.json "warnings": a switch without a shared
    buffer, ...); empty for a run without them."""
    return warnings_in(run.path)


def warnings_in(path: Path) -> list[str]:
    """`engine_warnings` of the run directory `path`."""
    warnings = (read_document(path, S.ENGINE_JSON) or {}).get("warnings")
    return [str(w) for w in warnings] if isinstance(warnings, list) else []


def line_rate_slowdowns(run: RunData) -> bool:
    """Are the run's slowdowns against the line rate, not its flows' own rate caps? A flows.csv written before
    2026-12-02 (or a netsim's fct.csv) has no `rate_cap_bps`: its standalone FCTs ignored the caps NCCL's flows carry
    (docs/results.md), so its slowdowns do not compare with a newer run's."""
    f = run.flows
    return f is not None and bool((f.standalone_ns > 0).any()) and bool((f.cap_bps < 0).all())


def pfc_per_port(run: RunData) -> dict[str, tuple[int | None, int]] | None:
    """Port label -> (pause frames, paused ns), from pfc.csv, else from links.csv paused_ns (count unknown)."""
    if run.pfc is not None:
        counts: dict[tuple[int, int], int] = {}
        for _t, node, port, _prio, pause in run.pfc:
            if pause:
                counts[(int(node), int(port))] = counts.get((int(node), int(port)), 0) + 1
        spans = pause_intervals(run.pfc, run.end_ns)
        keys = sorted(set(counts) | set(spans))
        return {run.port_label(k): (counts.get(k, 0), sum(b - a for a, b in spans.get(k, []))) for k in keys}
    if run.links is not None and any(row.paused_ns is not None for row in run.links):
        return {row.name: (None, row.paused_ns or 0) for row in run.links if row.paused_ns}
    return None


def summarise(run: RunData) -> dict[str, Value]:
    """The scalar metrics of SUMMARY for one run (None where not measured)."""
    out: dict[str, Value] = {"time_ns": run.time_ns}
    out.update(fct_stats(run.flows))
    engine = run.engine or {}
    ports = pfc_per_port(run)
    out["pfc_pauses"] = sum(c or 0 for c, _ in ports.values()) if run.pfc is not None and ports is not None else None
    if out["pfc_pauses"] is None and isinstance(engine.get("pfc_pause"), (int, float)):
        out["pfc_pauses"] = int(engine["pfc_pause"])
    out["pfc_paused_ns"] = sum(ns for _, ns in ports.values()) if ports is not None else None
    hot = hottest_port(run.queues)
    link_max = [r.max_queue_bytes for r in run.links or [] if r.max_queue_bytes is not None]
    qmax = [int(hot[2].max())] if hot else []
    out["queue_max_bytes"] = max(qmax + link_max) if qmax or link_max else None
    out["queue_p99_bytes"] = float(np.percentile(hot[2], 99)) if hot else None
    for key, stat in (("ecn_marks", "ecn_marks"), ("cnps", "cnps"), ("drops", "drops")):
        value = engine.get(stat)
        out[key] = int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if out["ecn_marks"] is None and run.links and any(r.ecn_marks is not None for r in run.links):
        out["ecn_marks"] = sum(r.ecn_marks or 0 for r in run.links)
    counters = ("queue_pairs", "retx_packets", "retx_bytes", "ooo_packets", "reorder_max_bytes", "trimmed_bytes")
    for key in (*counters, "switch_links_idle"):
        value = engine.get(key)
        out[key] = int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    hi, lo = engine.get("switch_link_bytes_max"), engine.get("switch_link_bytes_min")
    ok = isinstance(hi, (int, float)) and isinstance(lo, (int, float)) and lo > 0
    out["switch_link_spread"] = float(hi) / float(lo) if ok else None  # type: ignore[arg-type]
    out.update(class_figures(run))
    utils = [r.utilisation for r in run.links or []]
    out["util_mean"] = float(np.mean(utils)) if utils else None
    out["util_max"] = float(max(utils)) if utils else None
    return out


def class_figures(run: RunData) -> dict[str, Value]:
    """Per traffic class: flow bytes (flows.csv's priority column) and the engine's drops and trimmed bytes."""
    out: dict[str, Value] = {}
    flows = run.flows
    if flows is not None and flows.priority.size and (flows.priority >= 0).any():
        for prio in sorted({int(p) for p in flows.priority if p >= 0}):
            out[f"class:bytes:{prio}"] = int(flows.size[flows.priority == prio].sum())
    for what, prefix in _CLASS_STATS.items():
        for key, value in sorted((run.engine or {}).items()):
            if key.startswith(prefix) and key[len(prefix) :].isdigit() and isinstance(value, (int, float)):
                out[f"class:{what}:{key[len(prefix) :]}"] = int(value)
    return out


def figures(run: RunData) -> tuple[dict[str, Value], dict[str, dict[str, float] | None]]:
    """The SUMMARY metrics and per-collective times ("op:NAME") of a run; for a seed group, their mean over the
    seeds, and each one's spread (empty for a single run)."""
    if not run.members:
        out = summarise(run)
        out.update({f"op:{k}": v for k, v in (run.collectives or {}).items()})
        return out, {}
    per = [figures(m)[0] for m in run.members]
    keys = list(dict.fromkeys(k for p in per for k in p))
    spreads = {k: spread([p.get(k) for p in per]) for k in keys}
    return {k: (s["mean"] if s else None) for k, s in spreads.items()}, spreads


# Options that say where and how verbosely a run was made, not what it simulated; network and cc are columns of
# their own, and the packet options (cc, set, config, queue sampling) are compared as the PacketConfig they made.
_NOT_SETTINGS = {"out_dir", "overwrite", "command", "progress", "quiet", "timeout_s", "timeout", "record", "env"}
_NOT_SETTINGS |= {"python", "wrapper", "save_graph", "export_chakra", "fork_server", "seeds", "network", "cc"}
_PACKET_OPTIONS = {"set", "packet_set", "config", "queue_sample_ns"}
_FLOW_FIELDS = ("payload_bytes", "header_bytes", "ecmp_hash", "lb")  # the packet fields the flow network uses


def run_settings(run: RunData) -> dict[str, str]:
    """What a run simulated, flat: its options (config.json) and, for the packet network, every PacketConfig
    field with its default filled in (CC parameters as cc.NAME); `--set` items of a flow-network run as set.NAME."""
    config = run.config or {}
    out: dict[str, str] = {}
    options = dict(config.get("options") or {})
    engine = options.pop("engine", None)  # a run's EngineSpec (launcher.config_options): its window and scenario
    if isinstance(engine, dict):
        options.update({k: engine.get(k) for k in ("window_ns", "scenario")})
        options["seed"] = _dict_of(engine.get("packet")).get("seed")
    for key, value in options.items():
        if key not in _NOT_SETTINGS and key not in _PACKET_OPTIONS:
            out[key] = _text(value)
    if isinstance(config.get("topology"), dict):
        out["topology"] = str(config["topology"].get("name"))
    fields = (config.get("packet") or {}).get("fields")
    if fields is None and isinstance(engine, dict):  # the flow network: the fields it honours, from its spec
        fields = engine.get("packet")
    if isinstance(fields, dict):
        for key, value in fields.items():
            if key == "cc" or (run.network == "flow" and key not in _FLOW_FIELDS):
                continue
            if key == "cc_attrs" and isinstance(value, dict):
                out.update({f"cc.{k}": _text(v) for k, v in value.items()})
            else:
                out[key] = "default" if value is None else _text(value)
    else:
        opts = config.get("options") or {}
        for item in opts.get("set") or opts.get("packet_set") or []:
            name, _, value = str(item).partition("=")
            out[f"set.{name.strip()}"] = value.strip()
    if run.members:  # a seed group: what its seeds share, and which seeds
        each = [run_settings(m) for m in run.members]
        out = {k: v for k, v in each[0].items() if all(e.get(k) == v for e in each)}
        out["seed"] = ",".join(str(e.get("seed", "?")) for e in each)
    return out


def _dict_of(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "-" if value is None else str(value)


def differing_settings(runs: Sequence[RunData]) -> list[str]:
    """The settings whose value differs between runs that record it (a setting only some runs have, such as the
    packet fields of a flow-network run, differs only if those runs disagree)."""
    each = [run_settings(r) for r in runs]
    keys = list(dict.fromkeys(k for s in each for k in s))
    return [k for k in keys if len({s[k] for s in each if k in s}) > 1]


# ----- the comparison ---------------------------------------------------------------------------------


def diff_pct(value: Value, base: Value) -> float | None:
    """(value - base) / base in %; None if either is missing or base is 0 while value is not."""
    if value is None or base is None:
        return None
    if base == 0:
        return 0.0 if value == 0 else None
    return (value - base) / base * 100.0


@dataclass
class Metric:
    """One row of the comparison."""

    key: str
    label: str
    unit: str
    section: str
    values: list[Value]  # a seed group's mean
    diff_pct: list[float | None] = field(default_factory=list)
    spread: list[dict[str, float] | None] = field(default_factory=list)  # per run: n, mean, std, min, max (groups)

    def spreads(self) -> list[dict[str, float] | None]:
        """`spread`, or no spread for every run where the builder set none (a comparison of jobs)."""
        return self.spread or [None] * len(self.values)


@dataclass
class Comparison:
    """Scalar metrics and per-link tables of several runs; the first run is the baseline."""

    runs: list[dict[str, Any]]
    metrics: list[Metric]
    per_link: dict[str, dict[str, list[Value]]]  # table -> link -> values per run
    fault_costs: list[dict[str, Any]] = field(default_factory=list)  # faulty runs vs the first (scenario_compare)

    def metric(self, key: str) -> Metric:
        for m in self.metrics:
            if m.key == key:
                return m
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "phantora.compare/1",
            "runs": self.runs,
            "metrics": [asdict(m) for m in self.metrics],
            "per_link": self.per_link,
            **({"fault_costs": self.fault_costs} if self.fault_costs else {}),
        }


def unique_labels(paths: Sequence[Path]) -> list[str]:
    """Directory names, made unique with their parents where two runs share a name."""
    labels = [p.name or str(p) for p in paths]
    for i, p in enumerate(paths):
        if labels.count(labels[i]) > 1:
            labels[i] = "/".join(p.resolve().parts[-2:])
    return labels


def compare_runs(runs: Sequence[RunData]) -> Comparison:
    """Build the comparison of `runs` (at least one; a seed group counts by its mean and spread)."""
    if not runs:
        raise InputError("nothing to compare: give at least one run directory", field="runs")
    figs = [figures(r) for r in runs]
    metrics: list[Metric] = []
    mixed = any(both_kinds(f[0]) for f in figs)  # the network rows only where some run has NVLink flows too
    for key in shown(list(SUMMARY), mixed):
        label, unit, section = SUMMARY[key]
        if key == "time_ns":
            kinds = {r.time_kind for r in runs if r.time_ns is not None}
            label = "iteration time" if kinds == {"iteration"} else "makespan" if kinds <= {"makespan"} else label
        metrics.append(Metric(key, label, unit, section, [f[0].get(key) for f in figs]))
    names: list[str] = []
    for f, _ in figs:
        names.extend(k[3:] for k in f if k.startswith("op:") and k[3:] not in names)
    for n in names:
        metrics.insert(
            1 + names.index(n), Metric(f"op:{n}", n, "ns", "collectives", [f[0].get(f"op:{n}") for f in figs])
        )
    classes = sorted(
        {k for f, _ in figs for k in f if k.startswith("class:")},
        key=lambda k: (list(CLASS_ROWS).index(k.split(":")[1]), int(k.split(":")[2])),
    )
    for k in classes:
        _, what, prio = k.split(":")
        label, unit = CLASS_ROWS[what]
        metrics.append(Metric(k, f"{label}, class {prio}", unit, "classes", [f[0].get(k) for f in figs]))
    for m in metrics:
        m.diff_pct = [diff_pct(v, m.values[0]) for v in m.values]
        m.spread = [f[1].get(m.key) for f in figs]
    per_link: dict[str, dict[str, list[Value]]] = {"pfc_pauses": {}, "pfc_paused_ns": {}, "utilisation": {}}
    for i, r in enumerate(runs):
        for name, (count, paused) in (pfc_per_port(r) or {}).items():
            per_link["pfc_pauses"].setdefault(name, [None] * len(runs))[i] = count
            per_link["pfc_paused_ns"].setdefault(name, [None] * len(runs))[i] = paused
        for row in r.links or []:
            per_link["utilisation"].setdefault(row.name, [None] * len(runs))[i] = row.utilisation
    differ = differing_settings(runs)
    info = []
    for r in runs:
        mine = run_settings(r)
        info.append(
            {
                "label": r.label,
                "path": str(r.path),
                "kind": r.kind,
                "network": r.network,
                "cc": r.cc,
                "time_kind": r.time_kind,
                "status": _status(r),
                "partial": r.partial,
                "line_rate_slowdowns": line_rate_slowdowns(r),
                "warnings": engine_warnings(r),
                "steps": r.steps,
                "seeds": len(r.members) if r.members else None,
                "settings": {k: mine.get(k, "-") for k in differ},
                "files": sorted(r.files),
            }
        )
    from phantora.report.scenario_compare import fault_costs

    links = {k: dict(sorted(v.items())) for k, v in per_link.items()}
    return Comparison(info, metrics, links, fault_costs(runs))


def _status(run: RunData) -> str:
    """complete, or partial with the reason and the steps it kept; "-" for a run without status.json."""
    if run.members:
        bad = [m.label for m in run.members if m.partial]
        if bad:
            return f"partial: {', '.join(bad)} did not complete"
        if run.partial:
            return f"partial ({run.status} after {len(run.members)} seeds)"
        return f"complete ({len(run.members)} seeds)"
    if run.status is None:
        return "-"
    if not run.partial:
        return run.status
    kept = f", {plural(run.steps, 'step')} kept" if run.steps is not None else ""
    why = f": {run.status_reason}" if run.status_reason else ""
    return f"partial ({run.status}{why}{kept})"


def load_and_compare(
    paths: Sequence[str | Path], labels: Sequence[str] | None = None
) -> tuple[list[RunData], Comparison]:
    """Load each directory and compare them."""
    ps = [Path(p) for p in paths]
    if labels is not None and len(labels) != len(ps):
        raise InputError(f"{len(labels)} labels for {len(ps)} runs", field="--labels")
    names = list(labels) if labels is not None else unique_labels(ps)
    runs = [load_run(p, n) for p, n in zip(ps, names, strict=True)]
    return runs, compare_runs(runs)


# ----- text, markdown and JSON ------------------------------------------------------------------------

_DISPLAY = {"ns": ("µs", 1e-3, 2), "bytes": ("KB", 1e-3, 1), "ratio": ("x", 1, 3), "fraction": ("%", 100, 2)}


def fmt_value(value: Value, unit: str) -> str:
    """A value in display units ("-" when not measured)."""
    if value is None:
        return "-"
    if unit in _DISPLAY:
        _, scale, digits = _DISPLAY[unit]
        return f"{value * scale:.{digits}f}"
    return f"{int(value)}" if float(value).is_integer() else f"{value:.3f}"


def fmt_diff(d: float | None, value: Value, base: Value) -> str:
    """The % difference; "-" when either value is not measured, "n/a" when the baseline is 0 and value is not."""
    if d is None:
        return "-" if value is None or base is None else "n/a"
    return f"{d:+.1f}%"


def display_unit(unit: str) -> str:
    return _DISPLAY[unit][0] if unit in _DISPLAY else unit


def fmt_spread(s: dict[str, float] | None, unit: str, *, full: bool = False) -> str:
    """A seed group's spread after its mean: " ±std" (display units), with " [min-max]" when `full`."""
    if s is None:
        return ""
    text = f" ±{fmt_value(s['std'], unit if unit in _DISPLAY else 'ratio')}"
    return text + (f" [{fmt_value(s['min'], unit)}-{fmt_value(s['max'], unit)}]" if full else "")


def run_title(info: dict[str, Any]) -> str:
    """A run's column title: its label, "(N seeds)" for a seed group, "(partial)" if it did not complete."""
    title = info["label"]
    if info.get("seeds"):
        title += f" ({info['seeds']} seeds)"
    return title + (" (partial)" if info.get("partial") else "")


def _rows(cmp: Comparison, full: bool = False) -> tuple[list[str], list[list[str]]]:
    labels = [run_title(r) for r in cmp.runs]
    head = ["metric", "unit", labels[0]]
    for lab in labels[1:]:
        head += [lab, "diff"]
    rows = []
    for m in cmp.metrics:
        name = m.label if m.section != "collectives" else f"op {m.label}"
        cells = [
            fmt_value(v, m.unit) + fmt_spread(s, m.unit, full=full) for v, s in zip(m.values, m.spreads(), strict=True)
        ]
        row = [name, display_unit(m.unit), cells[0]]
        for v, d, cell in zip(m.values[1:], m.diff_pct[1:], cells[1:], strict=True):
            row += [cell, fmt_diff(d, v, m.values[0])]
        rows.append(row)
    return head, rows


OLD_SLOWDOWNS = "its slowdowns take no flow's rate cap (flows.csv written before 2026-12-02: rerun it to compare them)"
WIRE_BYTES = (
    "link utilisation counts every byte on the wire in a packet run (headers, ACKs, PFC frames) and the payload "
    "alone in a flow run, so on the same traffic a packet run's reads higher (docs/results.md, links.csv)"
)


def wire_note(cmp: Comparison) -> str | None:
    """`WIRE_BYTES` when the runs with link utilisation include both a flow run and a packet run."""
    with_links = {
        r["network"]
        for i, r in enumerate(cmp.runs)
        if any(v[i] is not None for v in (cmp.per_link.get("utilisation") or {}).values())
    }
    return WIRE_BYTES if "flow" in with_links and len(with_links - {"flow", None}) > 0 else None


def format_runs(cmp: Comparison) -> list[str]:
    """One line per run: kind, network, CC, status and the settings that differ between the runs."""
    lines = []
    for r in cmp.runs:
        settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items())
        lines.append(
            f"  {run_title(r)}: {r['kind']}, network {r['network'] or '-'}, cc {r['cc'] or '-'}, {r['status']}"
            + (f"; {settings}" if settings else "")
            + ("; " + OLD_SLOWDOWNS if r.get("line_rate_slowdowns") else "")
        )
        lines += [f"    warning: {w}" for w in r.get("warnings") or []]
    return lines


def format_table(cmp: Comparison, top_links: int = 8) -> str:
    """The printed table: metrics, then the links with the most PFC paused time and utilisation."""
    head, rows = _rows(cmp)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    widths[0] = min(widths[0], 40)

    def line(cells: list[str]) -> str:
        first = cells[0][: widths[0]].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    out = ["runs:", *format_runs(cmp), ""]
    out += [line(head), "-" * len(line(head))]
    out += [line(r) for r in rows]
    if any(r.get("seeds") for r in cmp.runs):
        out.append("(a seed group: the mean over its seeds ±the standard deviation; min and max in compare.json)")
    if wire_note(cmp):
        out.append(f"({wire_note(cmp)})")
    for table, unit, title in (
        ("pfc_paused_ns", "ns", "PFC paused time per port (µs)"),
        ("utilisation", "fraction", "link utilisation (%)"),
    ):
        links = cmp.per_link.get(table) or {}
        if not links:
            continue
        ranked = sorted(links.items(), key=lambda kv: (-max(v or 0 for v in kv[1]), kv[0]))[:top_links]
        out.append("")
        out.append(f"{title}, top {len(ranked)} of {len(links)}:")
        for name, values in ranked:
            out.append(f"  {name[:38]:<38} " + "  ".join(f"{fmt_value(v, unit):>10}" for v in values))
    if cmp.fault_costs:
        from phantora.report.scenario_compare import format_costs

        out += ["", *format_costs(cmp.fault_costs)]
    return "\n".join(out)


def to_markdown(cmp: Comparison, plots: Sequence[Path] = ()) -> str:
    """The report: runs (with the settings that differ), the metric table, per-link tables and the plots."""
    labels = [run_title(r) for r in cmp.runs]
    differ = list(cmp.runs[0]["settings"]) if cmp.runs else []
    head = ["run", "kind", "network", "cc", "status", *differ, "path", "files"]
    lines = ["# phantora compare", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in cmp.runs:
        files = ", ".join(r["files"]) or "-"
        cells = [run_title(r), r["kind"], r["network"] or "-", r["cc"] or "-", r["status"]]
        cells += [r["settings"][k] for k in differ] + [f"`{r['path']}`", files]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Differences are relative to the first run, `{labels[0]}`. `-` means not measured."]
    if differ:
        lines.append("The settings columns are those that differ between the runs (their config.json).")
    if any(r.get("seeds") for r in cmp.runs):
        lines.append("A seed group shows the mean over its seeds, ±the standard deviation (n - 1), [min-max].")
        lines.append("Its per-link tables, queue and PFC plots are its first seed's; its FCT CDF pools all seeds.")
    if any(r.get("partial") for r in cmp.runs):
        lines.append("A partial run did not complete: its figures are those of what it finished.")
    old = [r["label"] for r in cmp.runs if r.get("line_rate_slowdowns")]
    if old:
        lines.append(f"{', '.join(old)}: {OLD_SLOWDOWNS}.")
    if wire_note(cmp):
        lines.append(f"{wire_note(cmp)}.")
    lines += [f"{r['label']}: warning: {w}" for r in cmp.runs for w in r.get("warnings") or []]
    lines.append("")
    head, rows = _rows(cmp, full=True)
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    for table, unit, title in (
        ("pfc_pauses", "count", "PFC pause frames per port"),
        ("pfc_paused_ns", "ns", "PFC paused time per port (µs)"),
        ("utilisation", "fraction", "Link utilisation (%)"),
    ):
        links = cmp.per_link.get(table) or {}
        if not links:
            continue
        lines += ["", f"## {title}", "", "| link | " + " | ".join(labels) + " |", "|" + "---|" * (1 + len(labels))]
        for name, values in links.items():
            lines.append(f"| {name} | " + " | ".join(fmt_value(v, unit) for v in values) + " |")
    if cmp.fault_costs:
        from phantora.report.scenario_compare import format_costs

        lines += ["", "## Fault cost", "", "```", *format_costs(cmp.fault_costs), "```"]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}]({p.name})" for p in plots if p.suffix == ".png"]
    return "\n".join(lines) + "\n"


def spread_rows(
    cmp: Comparison, keys: Sequence[str] = ("time_ns", "fct_p99_ns", "net_fct_p99_ns")
) -> list[dict[str, Any]]:
    """With a seed group among the runs: one row per run with each metric's mean, min and max (a single run's
    value for all three), for bar plots with ranges; empty without seed groups. A key the comparison does not
    show (the network-flow ones where no run has both kinds of flows: `shown`) is left out."""
    if not any(r.get("seeds") for r in cmp.runs):
        return []
    rows: list[dict[str, Any]] = [{"run": run_title(r)} for r in cmp.runs]
    present = {m.key for m in cmp.metrics}
    for key in (k for k in keys if k in present):
        m = cmp.metric(key)
        for row, v, s in zip(rows, m.values, m.spreads(), strict=True):
            row[key] = v
            row[f"{key}_min"] = s["min"] if s else v
            row[f"{key}_max"] = s["max"] if s else v
    return rows


def write_report(out: Path, runs: Sequence[RunData], cmp: Comparison, plots: bool = True) -> list[Path]:
    """Write compare.md, compare.json and the plots into `out`; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if plots:
        from phantora.report.plots import compare_plots

        written += compare_plots(runs, out, spread_rows(cmp))
    md, js = out / "compare.md", out / "compare.json"
    md.write_text(to_markdown(cmp, written))
    js.write_text(json.dumps(cmp.to_json(), indent=2, sort_keys=True) + "\n")
    return [md, js, *written]


# ----- a run of several jobs: each job alone vs shared ------------------------------------------------------------
JOB_METRICS: dict[str, tuple[str, str]] = {
    "bytes": ("bytes sent (all links)", "bytes"),
    "pauses_suffered": ("PFC pauses suffered", "count"),
    "paused_ns_suffered": ("PFC paused time suffered", "ns"),
    "pauses_caused": ("PFC pauses caused", "count"),
}


def jobs_run(path: Path) -> dict[str, Any] | None:
    """The results.json of a multi-job run directory (`phantora run --jobs`), or None if it is not one."""
    doc = read_results(path)
    return doc if doc is not None and str(doc.get("schema", "")).startswith(S.JOBS.partition("/")[0]) else None


def compare_jobs(path: Path) -> list[tuple[str, list[RunData], Comparison]]:
    """For each job of a multi-job run: its run alone vs shared (alone/<job>/jobs/<job> and jobs/<job>), with
    the job's fabric figures (bytes, PFC pauses suffered and caused) from each run's results.json."""
    root = Path(path)
    shared_doc = jobs_run(root)
    if shared_doc is None:
        raise InputError("not a run of several jobs (phantora run --jobs)", file=str(root))
    out = []
    for row in shared_doc["jobs"]:
        name = row["name"]
        alone_root = RunDir(root).alone(name)
        if not alone_root.job(name).root.is_dir():
            raise InputError(f"job '{name}' has no run alone: run with --alone to compare alone vs shared",
                             file=str(root))  # fmt: skip
        runs = [
            load_run(alone_root.job(name).root, f"{name} alone"),
            load_run(RunDir(root).job(name).root, f"{name} shared"),
        ]
        for run, fabric in zip(runs, (alone_root.root, root), strict=True):
            add_fabric_ports(run, fabric)
        cmp = compare_runs(runs)
        figures = [((jobs_run(alone_root.root) or {}).get("fabric") or {}).get("jobs", {}).get(name, {}),
                   (shared_doc.get("fabric") or {}).get("jobs", {}).get(name, {})]  # fmt: skip
        extra = []
        for key, (label, unit) in JOB_METRICS.items():
            values: list[Value] = [f.get(key) for f in figures]
            if any(v is not None for v in values):
                extra.append(Metric(f"job:{key}", label, unit, "job", values, [diff_pct(v, values[0]) for v in values]))
        cmp.metrics[1:1] = extra
        out.append((name, runs, cmp))
    return out
