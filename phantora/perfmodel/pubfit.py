"""The public per-GPU fit: kernel efficiencies of each GPU die from public measurements (`public.py`).

The shipped L40S curves (`default_curves.json`, fitted on 594 perfdb rows) give the shapes: how a
GEMM's efficiency saturates with m, n, k and the work per SM, the softmax cost per (query, key) pair,
the L2 and launch floors. The public rows of a die (every variant of the die: A100 40 GB, 80 GB and
PCIe are one GA100) set its levels, a few multiplicative knobs on those curves, each fitted only
where rows inform it:

    gemm        gemm.eff_max                      GEMM rows
    gemm_fp8    gemm.fp8_eff                      fp8 GEMM rows (fp8 relative to 16-bit at the same shape)
    attn        attention.eff_fwd and .eff_bwd    attention rows (both efficiencies by one factor)
    attn_fwd    attention.eff_fwd                 forward-only rows (then forward and backward split)
    attn_bwd    attention.eff_bwd                 backward-only rows
    attn_pair   attention.pair_cyc                attention rows (softmax work per (query, key) pair)
    attn_row    attention.row_cyc                 attention rows (per query row and head-dim element: Q in, O out)
    attn_diag   attention.diag_cyc                causal attention rows (the diagonal tiles computed whole)
    dram.CLASS  CLASS.e_dram                      STREAM rows of that memory-bound class (copy, elementwise)

row_cyc and diag_cyc are absent from the L40S curves (its four attention rows cannot fit them); they start
from the a-priori values of START.

Forward + backward rows alone cannot tell the two apart, so the forward:backward ratio stays the L40S's
unless forward-only (or backward-only) rows exist.

FlashAttention-3's rows (kind `fa3_fwd`) are fitted on their own, as a second fit of the die ("GH100/fa3"):
the attention knobs attn_fwd, attn_pair, attn_row and attn_diag over the die's fitted curves (pulled towards
them, not the L40S's), never the backward's efficiency (no FA3 backward rows). It times only the forward calls
marked `kernel="fa3"` (`fa3_curves`); the die's own fit, FlashAttention-2 class, times every other flash call.

The op classes a die has rows for are timed by this fit ("public" tier); its other classes keep the
L40S curves ("l40s" tier). Each row is predicted on its own GPU's peaks (SMs, clocks, bandwidth), so a
die's efficiencies carry to its variants through their peaks. The fit minimises the mean Huber loss
of log(predicted / measured) plus a weak pull of each knob towards 1 (its starting value), with torch's
L-BFGS in float64: deterministic. `phantora calibrate --public` reports the leave-one-out error of
every row (the row predicted by a fit on the die's other rows) and writes `public_curves.json`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from phantora.errors import InputError
from phantora.perfmodel.curves import Curves, columns, predict_columns
from phantora.perfmodel.features import compute_features
from phantora.perfmodel.fit import minimise, peak_of
from phantora.perfmodel.gpus import GpuSpec, get_gpu
from phantora.perfmodel.public import FA3, PublicPoint, default_path

PUBLIC_CURVES = "public_curves.json"
FORMAT = "phantora-public-curves"
VERSION = 1
PRIOR = 0.01  # pull of each log-knob towards 0 (the L40S value), in rows' worth of loss
HUBER_DELTA = 0.3
KNOBS: dict[str, tuple[tuple[str, str], ...]] = {  # knob -> the parameters it multiplies
    "gemm": (("gemm", "eff_max"),),
    "gemm_fp8": (("gemm", "fp8_eff"),),
    "attn": (("attention", "eff_fwd"), ("attention", "eff_bwd")),
    "attn_fwd": (("attention", "eff_fwd"),),
    "attn_bwd": (("attention", "eff_bwd"),),
    "attn_pair": (("attention", "pair_cyc"),),
    "attn_row": (("attention", "row_cyc"),),
    "attn_diag": (("attention", "diag_cyc"),),
    "dram.copy": (("copy", "e_dram"),),
    "dram.elementwise": (("elementwise", "e_dram"),),
}
# Starting values of parameters the L40S curves lack (cycles per query row and head-dim element, per SM):
# a causal kernel computes its diagonal tiles whole, about 64 more (query, key) pairs per row for 128-wide
# tiles, at 4 FLOP per pair and head-dim element and ~1000 dense FLOP per SM per clock reached: ~0.25; reading
# Q and writing O, ~4 bytes per row and head-dim element at ~13 bytes per SM per clock: ~0.3.
START = {("attention", "diag_cyc"): 0.25, ("attention", "row_cyc"): 0.3}
TIERS = ("measured", "public", "l40s", "curves", "roofline", "estimate")  # who timed a kernel (docs/validation.md)


def knobs_of(point: PublicPoint) -> set[str]:
    """The knobs a point's time depends on."""
    out: set[str] = set()
    classes = set(point.op_classes)
    for call in point.calls:
        f = compute_features(call)
        if f.op_class == "gemm":
            out |= {"gemm", "gemm_fp8"} if f.dtype.startswith("float8") else {"gemm"}
        elif f"dram.{f.op_class}" in KNOBS:
            out.add(f"dram.{f.op_class}")
    if classes & {"attention_fwd", "attention_bwd"}:
        out |= {"attn", "attn_pair", "attn_row"}
        if point.row.causal:
            out.add("attn_diag")
        if classes == {"attention_fwd"}:
            out.add("attn_fwd")
        elif classes == {"attention_bwd"}:
            out.add("attn_bwd")
        if point.row.kernel == FA3:  # forward rows only: the backward's efficiency is not theirs to move
            out.discard("attn")
    return out


def fit_key(point: PublicPoint) -> str:
    """The fit a point belongs to: its die's ("GH100"), or its die's FlashAttention-3 fit ("GH100/fa3")."""
    return f"{point.gpu.chip}/{point.row.kernel}" if point.row.kernel else point.gpu.chip


def by_fit(points: list[PublicPoint]) -> dict[str, list[PublicPoint]]:
    """Points grouped by `fit_key`, a die before its FlashAttention-3 fit."""
    out: dict[str, list[PublicPoint]] = {}
    for p in points:
        out.setdefault(fit_key(p), []).append(p)
    return dict(sorted(out.items()))


def base_for(key: str, base: Curves, fits: dict[str, DieFit]) -> Curves:
    """The curves a fit starts from: `base` for a die, the die's fitted curves for its FA3 fit."""
    chip = key.partition("/")[0]
    return merged(base, fits[chip]) if key != chip and chip in fits else base


@dataclass
class DieFit:
    """The fitted knobs of one die: parameter values, the op classes they time, the rows behind them."""

    chip: str
    params: dict[str, dict[str, float]]
    classes: list[str]
    rows: int
    gpus: list[str]
    loss: float

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "classes": self.classes, "rows": self.rows, "gpus": self.gpus,
                "loss": self.loss}  # fmt: skip


class _Design:
    """Feature columns of every call of some points, grouped by GPU, and the point each call belongs to."""

    def __init__(self, points: list[PublicPoint]) -> None:
        self.groups: list[tuple[GpuSpec, Any, np.ndarray]] = []
        by_gpu: dict[str, list[tuple[int, Any]]] = {}
        for i, p in enumerate(points):
            for call in p.calls:
                by_gpu.setdefault(p.gpu.name, []).append((i, compute_features(call)))
        for name, items in sorted(by_gpu.items()):
            gpu = get_gpu(name)
            feats = [f for _, f in items]
            cols = columns(feats, [peak_of(f, gpu) for f in feats])
            self.groups.append((gpu, cols, np.asarray([i for i, _ in items], dtype=np.int64)))
        self.n = len(points)

    def predict(self, params: dict[str, dict[str, Any]], mult: dict[str, dict[str, Any]], xp: Any) -> Any:
        """Predicted ns of every point (its calls' times added)."""
        if xp is np:
            out = np.zeros(self.n)
            for gpu, cols, idx in self.groups:
                np.add.at(out, idx, predict_columns(cols, params, mult, gpu, np))
            return out
        total = xp.zeros(self.n, dtype=xp.float64)
        for gpu, cols, idx in self.groups:
            total = total.index_add(0, xp.as_tensor(idx), predict_columns(cols, params, mult, gpu, xp))
        return total


def fit_die(points: list[PublicPoint], base: Curves, *, max_iter: int = 200, name: str | None = None) -> DieFit:
    """Fit the knobs the points inform, starting from (and pulled towards) `base`; `name`: the fit's key (the
    die's name by default)."""
    import torch

    if not points:
        raise InputError("no public rows to fit", field="gpu")
    chips = {p.gpu.chip for p in points}
    if len(chips) != 1:
        raise InputError(f"one die at a time, got {', '.join(sorted(chips))}", field="gpu")
    knobs = sorted(set().union(*(knobs_of(p) for p in points)))
    design = _Design(points)
    target = torch.as_tensor(np.log([p.nanos for p in points]), dtype=torch.float64)
    theta = {k: torch.zeros((), dtype=torch.float64, requires_grad=True) for k in knobs}

    fixed = {g: {k: torch.tensor(v, dtype=torch.float64) for k, v in vals.items()} for g, vals in base.params.items()}

    def params_now() -> dict[str, dict[str, Any]]:
        params: dict[str, dict[str, Any]] = {g: dict(v) for g, v in fixed.items()}
        for k, t in theta.items():
            for group, key in KNOBS[k]:
                start = params[group].get(key, torch.tensor(START.get((group, key), 1.0), dtype=torch.float64))
                params[group][key] = start * torch.exp(t)
        return params

    def loss_fn() -> torch.Tensor:
        pred = design.predict(params_now(), base.op_mult, torch)
        err = torch.log(pred) - target
        loss = torch.nn.functional.huber_loss(err, torch.zeros_like(err), delta=HUBER_DELTA)
        reg = PRIOR * sum(t**2 for t in theta.values())
        return loss + 0.5 * reg / len(points)

    minimise(list(theta.values()), loss_fn, max_iter=max_iter, history_size=20, tolerance_change=1e-12)
    with torch.no_grad():
        final = float(loss_fn())
        fitted: dict[str, dict[str, float]] = {}
        for group, values in params_now().items():
            for key, value in values.items():
                if any((group, key) in KNOBS[k] for k in theta):
                    fitted.setdefault(group, {})[key] = float(value)
    classes = sorted({c for p in points for c in p.op_classes})
    gpus = sorted({p.gpu.name for p in points})
    return DieFit(name or next(iter(chips)), fitted, classes, len(points), gpus, final)


def merged(base: Curves, fit: DieFit) -> Curves:
    """`base` with a die's fitted parameters in place."""
    params = {g: dict(v) for g, v in base.params.items()}
    for group, values in fit.params.items():
        params[group].update(values)
    meta = {**base.meta, "public_fit": fit.chip}
    return Curves(params, dict(base.op_mult), meta)


def by_chip(points: list[PublicPoint]) -> dict[str, list[PublicPoint]]:
    out: dict[str, list[PublicPoint]] = {}
    for p in points:
        out.setdefault(p.gpu.chip, []).append(p)
    return dict(sorted(out.items()))


def fit_all(points: list[PublicPoint], base: Curves) -> dict[str, DieFit]:
    """Every fit of the points (`by_fit`): each die's, then its FlashAttention-3 fit over it."""
    fits: dict[str, DieFit] = {}
    for key, pts in by_fit(points).items():
        fits[key] = fit_die(pts, base_for(key, base, fits), name=key)
    return fits


@dataclass(frozen=True)
class Held:
    """One row predicted by a fit that did not see it."""

    gpu: str
    kind: str
    op_class: str  # gemm, attention or memory
    measured: float
    predicted: float
    where: str

    @property
    def rel_error(self) -> float:
        return abs(self.predicted - self.measured) / self.measured


def leave_one_out(points: list[PublicPoint], base: Curves) -> list[Held]:
    """Every row predicted by its fit (`by_fit`) on the fit's other rows (a die with one row: the L40S curves). An
    FA3 row's fit starts from its die's fit on all the die's other rows given (`base_for`; none given: `base`)."""
    out: list[Held] = []
    groups = by_fit(points)
    dies: dict[str, DieFit] = {}
    for key, pts in groups.items():
        chip = key.partition("/")[0]
        if key != chip and chip in groups and chip not in dies:
            dies[chip] = fit_die(groups[chip], base)
        start = base_for(key, base, dies)
        for i, p in enumerate(pts):
            rest = pts[:i] + pts[i + 1 :]
            curves = merged(start, fit_die(rest, start)) if rest else start
            pred = float(_Design([p]).predict(curves.params, curves.op_mult, np)[0])
            out.append(Held(p.gpu.name, p.row.kind, p.row.kernel_class, p.nanos, pred, p.row.where))
    return out


def data_digest(path: str | Path | None = None) -> str:
    """sha256 of the data file, recorded in the fitted file (a test checks they belong together)."""
    return hashlib.sha256(Path(path or default_path()).read_bytes()).hexdigest()


def to_json(fits: dict[str, DieFit], digest: str) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "data": "data/public_kernels.csv",
        "data_sha256": digest,
        "base": "default_curves.json",
        "chips": {chip: f.to_json() for chip, f in fits.items()},
    }


def save(path: str | Path, fits: dict[str, DieFit], digest: str) -> None:
    Path(path).write_text(json.dumps(to_json(fits, digest), indent=1) + "\n")


def parse(obj: Any, source: str = PUBLIC_CURVES) -> dict[str, DieFit]:
    """The fits of a public-curves document; InputError naming the file and field when malformed."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise InputError(f"not a {FORMAT} file", file=source, field="format")
    if obj.get("version") != VERSION:
        raise InputError(f"unsupported version {obj.get('version')!r}", file=source, field="version")
    out: dict[str, DieFit] = {}
    known = {p for params in KNOBS.values() for p in params}
    for chip, f in (obj.get("chips") or {}).items():
        try:
            params = {g: {k: float(v) for k, v in vals.items()} for g, vals in f["params"].items()}
            bad = [f"{g}.{k}" for g, vals in params.items() for k in vals if (g, k) not in known]
            if bad:
                raise InputError(f"unknown parameter {bad[0]}", file=source, field=f"chips.{chip}.params")
            out[chip] = DieFit(chip, params, list(f["classes"]), int(f["rows"]), list(f["gpus"]), float(f["loss"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InputError("malformed entry", file=source, field=f"chips.{chip}") from None
    return out


@lru_cache(maxsize=1)
def shipped_fits() -> dict[str, DieFit]:
    """The shipped fit (`public_curves.json`), {} when the package has none."""
    try:
        text = resources.files("phantora.perfmodel").joinpath(PUBLIC_CURVES).read_text()
    except FileNotFoundError:
        return {}
    return parse(json.loads(text))


def fa3_curves(gpu: GpuSpec, base: Curves) -> Curves | None:
    """The curves that time `gpu`'s FlashAttention-3 forward calls: its die's FA3 fit over the die's fit; None
    without one (a die FA3 has no published figures of, or no public fit)."""
    fits = shipped_fits()
    fa3, die = fits.get(f"{gpu.chip}/{FA3}"), fits.get(gpu.chip)
    if fa3 is None or die is None:
        return None
    return merged(merged(base, die), fa3)


def public_curves(gpu: GpuSpec, base: Curves) -> tuple[Curves, frozenset[str]] | None:
    """The curves of `gpu` under the public fit of its die and the op classes that fit times; None without one."""
    fit = shipped_fits().get(gpu.chip)
    if fit is None:
        return None
    return merged(base, fit), frozenset(fit.classes)


def baseline(points: list[PublicPoint], base: Curves) -> list[Held]:
    """Every row predicted by `base` alone (the L40S-shaped curves through the row GPU's peaks)."""
    preds = _Design(points).predict(base.params, base.op_mult, np) if points else []
    return [Held(p.gpu.name, p.row.kind, p.row.kernel_class, p.nanos, float(t), p.row.where)
            for p, t in zip(points, preds, strict=True)]  # fmt: skip


def error_table(held: list[Held]) -> dict[tuple[str, str], list[float]]:
    """Relative errors by (GPU, kernel class), in the GPU table's order."""
    from phantora.perfmodel.gpus import GPUS

    order = {name: i for i, name in enumerate(GPUS)}
    out: dict[tuple[str, str], list[float]] = {}
    for h in sorted(held, key=lambda h: (order.get(h.gpu, 99), h.op_class)):
        out.setdefault((h.gpu, h.op_class), []).append(h.rel_error)
    return out


def format_held(held: list[Held], base: list[Held] | None = None) -> str:
    """Markdown: per GPU and kernel class, rows and the leave-one-out error (median, p90, max), and the
    L40S-shaped curves' median and max on the same rows."""
    ours = error_table(held)
    theirs = error_table(base or [])
    lines = [
        "| GPU | kernel class | rows | leave-one-out median | p90 | max | L40S-shaped median | max |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, errs in ours.items():
        a = np.asarray(errs)
        b = np.asarray(theirs.get(key, [np.nan]))
        lines.append(
            f"| {key[0]} | {key[1]} | {len(a)} | {100 * np.median(a):.1f}% | {100 * np.percentile(a, 90):.1f}% | "
            f"{100 * a.max():.1f}% | {100 * np.median(b):.1f}% | {100 * b.max():.1f}% |"
        )
    return "\n".join(lines)


def write_held(path: str | Path, held: list[Held]) -> None:
    import csv

    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["gpu", "kind", "class", "where", "measured_ns", "predicted_ns", "rel_error"])
        for h in held:
            w.writerow([h.gpu, h.kind, h.op_class, h.where, f"{h.measured:.0f}", f"{h.predicted:.0f}",
                        f"{h.rel_error:.4f}"])  # fmt: skip


def split_points(points: list[PublicPoint], holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices (train, test): per die and kernel class a seeded random `holdout` fraction is tested; a group
    of two or more rows keeps one on each side, a single row stays in training."""
    rng = np.random.default_rng(seed)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.gpu.chip, p.row.kernel_class), []).append(i)
    train: list[int] = []
    test: list[int] = []
    for key in sorted(groups):
        idx = np.asarray(groups[key])[rng.permutation(len(groups[key]))]
        n_test = min(max(int(round(holdout * len(idx))), 1), len(idx) - 1) if len(idx) >= 2 else 0
        test += [int(i) for i in idx[:n_test]]
        train += [int(i) for i in idx[n_test:]]
    return sorted(train), sorted(test)


def held_out(points: list[PublicPoint], base: Curves, holdout: float = 0.3, seed: int = 0) -> list[Held]:
    """The test rows of `split_points`, each predicted by its die's fit on the training rows."""
    train_idx, test_idx = split_points(points, holdout, seed)
    fits = fit_all([points[i] for i in train_idx], base)
    test = [points[i] for i in test_idx]
    out: list[Held] = []
    for key, pts in by_fit(test).items():
        curves = merged(base_for(key, base, fits), fits[key]) if key in fits else base_for(key, base, fits)
        for p, t in zip(pts, _Design(pts).predict(curves.params, curves.op_mult, np), strict=True):
            out.append(Held(p.gpu.name, p.row.kind, p.row.kernel_class, p.nanos, float(t), p.row.where))
    return out
