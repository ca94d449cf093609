"""Error of a model against measured rows: per-class count, median and p90 relative error."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phantora.perfmodel.curves import Curves, columns, predict_columns, roofline_ns
from phantora.perfmodel.features import compute_features
from phantora.perfmodel.fit import peak_of
from phantora.perfmodel.gpus import GpuSpec, get_gpu
from phantora.perfmodel.table import MeasuredRow


@dataclass(frozen=True)
class Prediction:
    """One row's measured and predicted ns."""

    op_class: str
    label: str
    source: str
    measured: int
    predicted: int

    @property
    def rel_error(self) -> float:
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else float("inf")
        return abs(self.predicted - self.measured) / self.measured


@dataclass(frozen=True)
class ClassError:
    op_class: str
    count: int
    median: float
    p90: float


def predict_rows(
    rows: list[MeasuredRow], gpu: str | GpuSpec, curves: Curves | None, *, launch_ns: int = 0
) -> list[Prediction]:
    """Predictions of the curves for `rows` (never a table lookup). `curves=None` is the untuned roofline;
    with `launch_ns` it is the runtime's `--compute-model roofline` (its only floor is the launch overhead,
    added to every row that runs a kernel)."""
    gpu = get_gpu(gpu)
    feats = [compute_features(r.call, aliased=r.aliased) for r in rows]
    peaks = [peak_of(f, gpu) for f in feats]
    if curves is None:
        times = [
            roofline_ns(f, gpu, p) + launch_ns if f.op_class != "noop" else 0 for f, p in zip(feats, peaks, strict=True)
        ]
    else:
        raw = predict_columns(columns(feats, peaks), curves.params, curves.op_mult, gpu, np) if feats else []
        times = [0 if f.op_class == "noop" else max(0, int(round(float(t)))) for f, t in zip(feats, raw, strict=True)]
    return [Prediction(f.op_class, r.label, r.source, r.nanos, t) for r, f, t in zip(rows, feats, times, strict=True)]


def class_errors(preds: list[Prediction], *, include_noop: bool = False) -> list[ClassError]:
    """Per-class (sorted by name) then 'overall' error rows; no-op rows are left out of 'overall'."""
    by_class: dict[str, list[float]] = {}
    for p in preds:
        by_class.setdefault(p.op_class, []).append(p.rel_error)
    out = [_summary(c, errs) for c, errs in sorted(by_class.items())]
    overall = [p.rel_error for p in preds if include_noop or p.op_class != "noop"]
    out.append(_summary("overall", overall))
    return out


def _summary(name: str, errs: list[float]) -> ClassError:
    if not errs:
        return ClassError(name, 0, float("nan"), float("nan"))
    a = np.asarray(errs, dtype=np.float64)
    return ClassError(name, len(a), float(np.median(a)), float(np.percentile(a, 90)))


def format_errors(
    rows: list[ClassError],
    baseline: list[ClassError] | None = None,
    *more: tuple[str, list[ClassError]],
) -> str:
    """A markdown table of per-class errors, with the median and p90 of each baseline if given
    (`baseline` is titled 'roofline'; `more` are (title, errors) pairs)."""
    bases = ([("roofline", baseline)] if baseline else []) + list(more)
    by_title = [(title, {r.op_class: r for r in errs}) for title, errs in bases]
    head = "| class | rows | median rel. error | p90 rel. error |"
    rule = "|---|---:|---:|---:|"
    for title, _ in by_title:
        head += f" {title} median | {title} p90 |"
        rule += "---:|---:|"
    lines = [head, rule]
    for r in rows:
        line = f"| {r.op_class} | {r.count} | {_pct(r.median)} | {_pct(r.p90)} |"
        for _, base in by_title:
            b = base.get(r.op_class)
            line += f" {_pct(b.median)} | {_pct(b.p90)} |" if b else " - | - |"
        lines.append(line)
    return "\n".join(lines)


def _pct(x: float) -> str:
    if x != x:
        return "-"
    return "inf" if x == float("inf") else f"{100 * x:.1f}%"


def write_predictions(path: str | Path, preds: list[Prediction]) -> None:
    """Per-row predictions as CSV: class, op label, source file:line, measured, predicted, relative error."""
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["class", "op", "source", "measured_ns", "predicted_ns", "rel_error"])
        for p in preds:
            w.writerow([p.op_class, p.label, p.source, p.measured, p.predicted, f"{p.rel_error:.4f}"])
