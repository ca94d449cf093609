"""The scenario plot of a run: step (or op) time against simulated time, the scenario's events shaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phantora.report.plots import plt, save, time_scale
from phantora.results import schema as S
from phantora.results.read import read_steps
from phantora.results.run_dir import RunDir


def plot_scenario_steps(out: Path, section: dict[str, Any]) -> list[Path]:
    """scenario_steps.png/.svg of a live run in `out` (its steps.jsonl; nothing without steps)."""
    rd = RunDir(out)
    steps = read_steps(out)
    if not steps:
        return []
    spans = [(int(r["end_ns"]) - int(r["time_ns"]), int(r["end_ns"])) for r in steps]
    return plot_step_times(spans, section, rd.file(S.SCENARIO_STEPS_PNG).with_suffix(""), ylabel="step time")


def plot_step_times(
    spans: Sequence[tuple[int, int]], res: dict[str, Any], base: Path, ylabel: str = "step time"
) -> list[Path]:
    """Step (or op) time against simulated time, each event's window shaded and labelled (PNG and SVG)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    ends = [b for _, b in spans] or [1]
    div, unit = time_scale(max(ends))
    ydiv, yunit = time_scale(max((b - a for a, b in spans), default=1))
    if spans:
        ax.plot([b / div for _, b in spans], [(b - a) / ydiv for a, b in spans], marker="o", ms=3, lw=1)
    top = max(ends) / div
    for i, w in enumerate(res.get("events", [])):
        a = w["start_ns"] / div
        b = top if w["end_ns"] is None else w["end_ns"] / div
        color = f"C{(i % 8) + 1}"
        ax.axvspan(a, max(b, a + top * 1e-3), color=color, alpha=0.15)
        ax.axvline(a, color=color, lw=1)
        ax.text(
            a, 1.0, f" {w['event']}", color=color, rotation=90, va="top", fontsize=7, transform=ax.get_xaxis_transform()
        )
    ax.set_xlabel(f"simulated time at the end of the {ylabel.split()[0]} ({unit})")
    ax.set_ylabel(f"{ylabel} ({yunit})")
    ax.set_title(f"scenario {res.get('name', '')}: {ylabel} against simulated time")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, base)
