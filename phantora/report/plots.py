"""Report plots (matplotlib, Agg backend), each written as PNG and SVG with labelled axes and units.

- `fct_cdf`: flow completion time CDF, one line per run (over all flows, or over the network's);
- `queue_depth`: queue depth over time at each run's hottest (switch, port);
- `pfc_timeline`: paused intervals per port, one panel per run;
- `step_timeline`: per-rank compute and comm spans of a live run's trace;
- `metric_vs_param`: a sweep metric (iteration time, makespan, PFC paused time) against a parameter such as CC.

A chart with nothing to show (every run at 0, or no pause anywhere) is a card that says so, not an empty
axis. Series that coincide keep their own line style and marker, and the legend says "same as" the series
they hide under. Dense bar lanes (step and PFC timelines) are rasterised inside the SVG, so a file stays
small. `plot_style("paper")` sizes every figure for one column of a paper (3.5 in wide, 8 pt text).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from phantora.report.fabric import hottest_port, pause_intervals
from phantora.report.flow_kinds import network_flows
from phantora.results.read import RunData

plt.rcParams["svg.hashsalt"] = "phantora"  # stable SVG ids: same input, same file
plt.rcParams["svg.fonttype"] = "none"  # text stays text (searchable, smaller)
FORMATS = ("png", "svg")
RASTER_BARS = 2000  # past this many bars in a figure, its bar lanes are rasterised inside the SVG
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "x")

# --plot-style: matplotlib rc settings, and the width every figure is scaled to (None: as drawn)
PLOT_STYLES: dict[str, tuple[dict[str, Any], float | None]] = {
    "default": ({}, None),
    "paper": (
        {
            "font.size": 8,
            "axes.titlesize": 8,
            "axes.labelsize": 8,
            "legend.fontsize": 7,
            "xtick.labelsize": 7,
            "ytick.labelsize": 7,
            "lines.linewidth": 1.0,
            "lines.markersize": 3,
            "savefig.dpi": 300,
        },
        3.5,  # one column of a two-column paper, in inches
    ),
}
_width: list[float | None] = [None]  # the active style's figure width


@contextlib.contextmanager
def plot_style(name: str) -> Iterator[None]:
    """Draw the plots made inside with the style `name` (PLOT_STYLES), e.g. "paper": one column wide."""
    rc, width = PLOT_STYLES[name]
    previous = _width[0]
    _width[0] = width
    try:
        with plt.style.context(rc):
            yield
    finally:
        _width[0] = previous


def figsize(width: float, height: float) -> tuple[float, float]:
    """A figure size in inches, scaled (aspect kept, height at least 2 in) to the active style's width."""
    target = _width[0]
    if target is None:
        return width, height
    return target, max(2.0, height * target / width)


def time_scale(max_ns: float) -> tuple[float, str]:
    """Divisor and unit name that keep a time axis readable."""
    if max_ns >= 1e7:
        return 1e6, "ms"
    if max_ns >= 1e4:
        return 1e3, "µs"
    return 1.0, "ns"


def save(fig: Figure, base: Path) -> list[Path]:
    """Write `base`.png and `base`.svg and close the figure."""
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in FORMATS:
        p = base.with_suffix(f".{ext}")
        meta = {"Date": None} if ext == "svg" else {}
        fig.savefig(p, dpi=plt.rcParams["savefig.dpi"] if _width[0] else 120, metadata=meta)
        paths.append(p)
    plt.close(fig)
    return paths


def nothing_to_show(base: Path, title: str, text: str) -> list[Path]:
    """A small card with `title` and `text` (why the chart is empty) in place of an empty axis."""
    fig, ax = plt.subplots(figsize=figsize(6, 2), layout="constrained")
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.3")
    return save(fig, base)


def same_as(labels: Sequence[str], series: Sequence[Sequence[np.ndarray]]) -> list[str]:
    """Each label, with " (same as X)" when its series (a tuple of arrays) equals an earlier one's, X's: a
    line drawn exactly over another would otherwise hide it."""
    out = []
    for i, (label, arrays) in enumerate(zip(labels, series, strict=True)):
        twin = next(
            (
                labels[j]
                for j in range(i)
                if len(series[j]) == len(arrays)
                and all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(series[j], arrays, strict=True))
            ),
            None,
        )
        out.append(f"{label} (same as {twin})" if twin is not None else label)
    return out


def line_style(i: int) -> dict[str, Any]:
    """The i-th series' line style and marker (colour comes from the colour cycle): coinciding series stay
    apart by their dashes, and by markers placed at other points along the line (a tenth of it apart)."""
    start = (0.033 * i) % 0.1
    return {"ls": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)], "markevery": (start, 0.1)}


def spans_decades(values: np.ndarray, decades: float = 2.0) -> bool:
    """True when the positive `values` span at least `decades` powers of ten (then a log axis shows them all)."""
    pos = values[values > 0]
    return bool(pos.size) and float(pos.max()) >= float(pos.min()) * 10**decades


def fct_cdf(runs: Sequence[RunData], base: Path, *, network: bool = False) -> list[Path]:
    """CDF of flow completion times (flows with bytes), one step line per run that has flows; a log x axis
    when the FCTs span two decades or more (a linear one would crush the short flows against the origin).
    With `network`, over the flows through the network alone (`network_flows`; a run whose flows.csv does not
    say which flows stayed on NVLink is left out)."""
    chosen = []
    for r in runs:
        if r.flows is None:
            continue
        mask = network_flows(r.flows) if network else r.flows.size > 0
        if mask is not None and mask.any():
            chosen.append((r, r.flows.fct_ns[mask]))
    if not chosen:
        return []
    have = [r for r, _ in chosen]
    every = np.concatenate([fct for _, fct in chosen])
    log = spans_decades(every)
    div, unit = time_scale(float(every.max()))
    fig, ax = plt.subplots(figsize=figsize(7, 4.5), layout="constrained")
    curves = []
    for _, picked in chosen:
        fct = np.sort(picked) / div
        if log:
            fct = fct[fct > 0]
        curves.append(fct)
    labels = same_as([r.label for r in have], [(c,) for c in curves])
    for i, (fct, label) in enumerate(zip(curves, labels, strict=True)):
        y = np.arange(1, len(fct) + 1) / len(fct)
        ax.step(np.concatenate(([fct[0]], fct)), np.concatenate(([0.0], y)), where="post", label=label,
                **line_style(i))  # fmt: skip
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(f"flow completion time ({unit}{', log scale' if log else ''})")
    ax.set_ylabel("fraction of flows (CDF)")
    ax.set_ylim(0, 1.02)
    ax.set_title("FCT CDF" + (" (network flows)" if network else ""))
    ax.grid(alpha=0.3, which="both" if log else "major")
    ax.legend(fontsize="small")
    return save(fig, base)


def queue_depth(runs: Sequence[RunData], base: Path) -> list[Path]:
    """Queue depth over time at the hottest port of each run that sampled queues."""
    hot = [(r, h) for r in runs if (h := hottest_port(r.queues)) is not None]
    if not hot:
        return []
    div, unit = time_scale(max(float(h[1].max()) for _, h in hot))
    fig, ax = plt.subplots(figsize=figsize(7, 4.5), layout="constrained")
    labels = same_as([f"{r.label}: {r.port_label(h[0])}" for r, h in hot], [(h[1], h[2]) for _, h in hot])
    for i, ((_r, (_key, times, depth)), label) in enumerate(zip(hot, labels, strict=True)):
        ax.step(times / div, depth / 1e3, where="post", label=label, **line_style(i))
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_ylabel("queue depth (KB)")
    ax.set_title("Queue depth at the hottest port")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, base)


def pfc_timeline(runs: Sequence[RunData], base: Path, max_ports: int = 16) -> list[Path]:
    """Paused intervals per port (one lane each, the most paused first, at most `max_ports`), one panel per run
    that paused; runs whose pfc.csv has no pause are named in the title instead of getting an empty panel."""
    have = [r for r in runs if r.pfc is not None]
    spans = {r.label: pause_intervals(r.pfc, r.end_ns) for r in have if r.pfc is not None}
    paused = [r for r in have if spans[r.label]]
    if not paused:
        return nothing_to_show(base, "PFC pause timeline", "no PFC pauses in any run") if have else []
    ends = [b for r in paused for lst in spans[r.label].values() for _, b in lst] + [r.end_ns or 0 for r in paused]
    div, unit = time_scale(max(ends + [1]))
    heights = [min(max_ports, len(spans[r.label])) for r in paused]
    fig, axes = plt.subplots(
        len(paused),
        1,
        figsize=figsize(8, 1.4 + 0.3 * sum(heights) + 0.6 * len(paused)),
        sharex=True,
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": [h + 1 for h in heights]},
    )
    dense = sum(len(lst) for r in paused for lst in spans[r.label].values()) > RASTER_BARS
    for ax, r in zip(axes[:, 0], paused, strict=True):
        mine = spans[r.label]
        ports = sorted(mine.items(), key=lambda kv: (-sum(b - a for a, b in kv[1]), kv[0]))[:max_ports]
        for lane, (_key, lst) in enumerate(ports):
            bars = [(a / div, max(b - a, 1) / div) for a, b in lst]
            ax.broken_barh(bars, (lane - 0.4, 0.8), color="tab:red", rasterized=dense)
        ax.set_yticks(range(len(ports)), [r.port_label(k) for k, _ in ports], fontsize="x-small")
        ax.set_ylim(-0.6, len(ports) - 0.4)
        ax.invert_yaxis()
        total = sum(b - a for lst in mine.values() for a, b in lst)
        shown = f"{len(ports)} of {len(mine)} paused ports (most paused first)" if len(ports) < len(mine) else (
            f"{len(mine)} paused port{'s' if len(mine) > 1 else ''}")  # fmt: skip
        ax.set_title(f"{r.label}: {shown}, {total / div:.1f} {unit} paused in all", fontsize="small")
        ax.set_ylabel("paused port")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(f"simulated time ({unit})")
    calm = [r.label for r in have if not spans[r.label]]
    fig.suptitle("PFC pause timeline" + (f" (no pauses in {', '.join(calm)})" if calm else ""))
    return save(fig, base)


def step_timeline(run: RunData, base: Path, max_ranks: int = 32) -> list[Path]:
    """Per-rank compute and comm spans of a live run (from its Chrome trace), step boundaries as lines."""
    if not run.spans:
        return []
    ranks = sorted({s.rank for s in run.spans})[:max_ranks]
    div, unit = time_scale(max(s.end_ns for s in run.spans))
    fig, ax = plt.subplots(figsize=figsize(9, 1.2 + 0.4 * len(ranks)), layout="constrained")
    colours = {"compute": "tab:blue", "comm": "tab:orange"}
    dense = sum(1 for s in run.spans if s.rank in ranks and s.lane in colours) > RASTER_BARS
    for row, rank in enumerate(ranks):
        for lane, offset in (("compute", -0.2), ("comm", 0.2)):
            mine = [s for s in run.spans if s.rank == rank and s.lane == lane]
            bars = [(s.start_ns / div, max(s.end_ns - s.start_ns, 1) / div) for s in mine]
            if bars:
                ax.broken_barh(bars, (row + offset - 0.18, 0.36), color=colours[lane],
                               label=lane if row == 0 else None, rasterized=dense)  # fmt: skip
    for s in run.spans:
        if s.lane == "step" and s.rank == ranks[0]:
            ax.axvline(s.end_ns / div, color="grey", lw=0.6, ls="--")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_ylabel("rank")
    ax.set_title(f"{run.label}: per-rank step timeline (compute vs comm)")
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return save(fig, base)


def metric_vs_param(
    rows: Sequence[Mapping[str, Any]],
    param: str,
    metric: str,
    base: Path,
    *,
    ylabel: str,
    series: Sequence[str] = (),
    scale: float = 1.0,
    empty: str | None = None,
) -> list[Path]:
    """Bars of `metric` (divided by `scale`) for each value of `param`, grouped by the `series` columns.

    Rows with a missing metric are left out; the x categories keep their first-seen order. Rows that carry
    `<metric>_min` and `<metric>_max` (the mean over seeds and its range) get error bars from min to max.
    When every value is 0, a card says so (`empty`, e.g. "no PFC pauses in any run") instead of bars of 0.
    """
    good = [r for r in rows if r.get(metric) is not None and r.get(param) is not None]
    if not good:
        return []
    if all(float(r[metric]) == 0 and not r.get(f"{metric}_max") for r in good):
        title = f"{ylabel.split(' (')[0]} vs {param}"
        return nothing_to_show(base, title, empty or f"{ylabel.split(' (')[0]}: 0 in every run")
    cats: list[str] = []
    groups: dict[str, dict[str, float]] = {}
    ranges: dict[str, dict[str, tuple[float, float]]] = {}
    for r in good:
        x = str(r[param])
        if x not in cats:
            cats.append(x)
        name = ", ".join(f"{k}={r.get(k)}" for k in series) or metric
        groups.setdefault(name, {})[x] = float(r[metric]) / scale
        lo, hi = r.get(f"{metric}_min"), r.get(f"{metric}_max")
        if lo is not None and hi is not None:
            ranges.setdefault(name, {})[x] = (float(lo) / scale, float(hi) / scale)
    fig, ax = plt.subplots(
        figsize=figsize(max(5, 1.2 * len(cats) * max(1, len(groups)) ** 0.5 + 2), 4.5), layout="constrained"
    )
    width = 0.8 / len(groups)
    for i, (name, vals) in enumerate(groups.items()):
        xs = [j + (i - (len(groups) - 1) / 2) * width for j, c in enumerate(cats) if c in vals]
        ys = [vals[c] for c in cats if c in vals]
        span = ranges.get(name, {})
        err = None
        if span:
            lo = [vals[c] - span.get(c, (vals[c], vals[c]))[0] for c in cats if c in vals]
            hi = [span.get(c, (vals[c], vals[c]))[1] - vals[c] for c in cats if c in vals]
            err = np.array([lo, hi])
        ax.bar(xs, ys, width, label=name, yerr=err, capsize=4 if err is not None else 0)
    ax.set_xticks(range(len(cats)), cats)
    ax.set_xlabel(param)
    ax.set_ylabel(ylabel)
    title = f"{ylabel.split(' (')[0]} vs {param}"
    ax.set_title(title + (" (mean over seeds, bars: min-max)" if ranges else ""))
    ax.grid(axis="y", alpha=0.3)
    if len(groups) > 1 or series:
        ax.legend(fontsize="small")
    return save(fig, base)


def compare_plots(runs: Sequence[RunData], out: Path, spread_rows: Sequence[Mapping[str, Any]] = ()) -> list[Path]:
    """Every plot that the runs have data for: FCT CDF, queue depth, PFC timeline, one step timeline per run,
    and with seed groups (`spread_rows`: run, time_ns, fct_p99_ns and, where shown, net_fct_p99_ns, each with its
    _min and _max) the time and FCT p99 of each run (over all flows, and over the network flows) with its range over
    the seeds."""
    paths = fct_cdf(runs, out / "fct_cdf")
    if spread_rows:
        paths += metric_vs_param(spread_rows, "run", "time_ns", out / "time_by_run", ylabel="time (µs)", scale=1e3)
        paths += metric_vs_param(
            spread_rows, "run", "fct_p99_ns", out / "fct_p99_by_run", ylabel="FCT p99 (µs)", scale=1e3
        )
        if "net_fct_p99_ns" in spread_rows[0]:
            paths += metric_vs_param(
                spread_rows,
                "run",
                "net_fct_p99_ns",
                out / "net_fct_p99_by_run",
                ylabel="FCT p99, network flows (µs)",
                scale=1e3,
            )
    paths += queue_depth(runs, out / "queue_depth")
    paths += pfc_timeline(runs, out / "pfc_timeline")
    for i, r in enumerate(runs):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in r.label)
        paths += step_timeline(r, out / f"step_timeline_{i}_{safe}")
    return paths
