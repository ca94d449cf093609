"""Fitting the curves to measured rows: a seeded, class-stratified split and a least-squares fit in log space.

The fit minimises the mean Huber loss of log(predicted / measured) over the training rows, plus a
weak pull of every parameter towards its a-priori starting value and a stronger pull of each per-op
factor towards 1, with torch's L-BFGS in float64 (deterministic on CPU). Parameters are optimised
as logarithms, so they stay positive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from phantora.errors import InputError
from phantora.perfmodel.curves import (
    MEMORY_CLASSES,
    OP_MULT_KEYS,
    Curves,
    columns,
    default_params,
    predict_columns,
)
from phantora.perfmodel.features import OpFeatures, compute_features
from phantora.perfmodel.gpus import GpuSpec, get_gpu
from phantora.perfmodel.ops import is_efficient_attention
from phantora.perfmodel.table import MeasuredRow

if TYPE_CHECKING:
    import torch

MIN_ROWS_FOR_MULT = 3  # an op gets its own factors only with this many training rows
PRIOR = 0.01  # pull of log-parameters towards their starting values, in training rows' worth of loss
MULT_PRIOR = 2.0  # pull of per-op log-factors towards 0 (factor 1), in training rows' worth of loss
HUBER_DELTA = 0.3
_USES = {  # which parameter groups each class's rows inform
    "gemm": ("gemm", "memory"),
    "attention_fwd": ("attention", "gemm", "memory"),
    "attention_bwd": ("attention", "gemm", "memory"),
    "memcpy_h2d": ("memcpy_h2d",),
    "memcpy_d2h": ("memcpy_d2h",),
    **{c: (c, "memory") for c in MEMORY_CLASSES},
}


def row_features(rows: list[MeasuredRow]) -> list[OpFeatures]:
    return [compute_features(r.call, aliased=r.aliased) for r in rows]


def peak_of(f: OpFeatures, gpu: GpuSpec, tf32: bool = False) -> float:
    """The matmul peak used for a compute-bound class (0 for memory-bound classes)."""
    if f.op_class in ("attention_fwd", "attention_bwd") and f.dtype == "float32" and is_efficient_attention(f.op):
        return gpu.fast_f32_peak()
    if f.op_class in ("gemm", "attention_fwd", "attention_bwd"):
        return gpu.matmul_peak(f.dtype, tf32=tf32)
    return 0.0


def split_rows(
    rows: list[MeasuredRow], holdout: float, seed: int, feats: list[OpFeatures] | None = None
) -> tuple[list[int], list[int]]:
    """Indices (train, test): per op class, a seeded random `holdout` fraction goes to test.

    Every class with two or more rows keeps at least one row on each side when 0 < holdout < 1.
    """
    if not 0.0 <= holdout < 1.0:
        raise InputError(f"holdout must be in [0, 1), got {holdout}", field="holdout")
    feats = feats if feats is not None else [compute_features(r.call, aliased=r.aliased) for r in rows]
    rng = np.random.default_rng(seed)
    by_class: dict[str, list[int]] = {}
    for i, f in enumerate(feats):
        by_class.setdefault(f.op_class, []).append(i)
    train: list[int] = []
    test: list[int] = []
    for cls in sorted(by_class):
        idx = np.asarray(by_class[cls])
        perm = idx[rng.permutation(len(idx))]
        n_test = int(round(holdout * len(idx)))
        if holdout > 0 and len(idx) >= 2:
            n_test = min(max(n_test, 1), len(idx) - 1)
        test.extend(int(i) for i in perm[:n_test])
        train.extend(int(i) for i in perm[n_test:])
    return sorted(train), sorted(test)


def fit_curves(
    rows: list[MeasuredRow], gpu: str | GpuSpec, *, init: Curves | None = None, max_iter: int = 500
) -> Curves:
    """Fit curve parameters (and per-op factors of memory-bound ops) to `rows` measured on `gpu`.

    Only parameter groups that some training row informs are fitted; the others keep their
    starting values. Every parameter is pulled weakly towards its starting value (PRIOR), so a
    parameter the rows cannot pin down stays near its a-priori guess.
    """
    import torch

    gpu = get_gpu(gpu)
    feats = row_features(rows)
    keep = [i for i, (r, f) in enumerate(zip(rows, feats, strict=True)) if r.nanos > 0 and f.op_class != "noop"]
    if not keep:
        raise InputError("no timed rows to fit (all rows are no-ops or 0 ns)", field="table")
    feats = [feats[i] for i in keep]
    nanos = np.asarray([rows[i].nanos for i in keep], dtype=np.float64)
    cols = columns(feats, [peak_of(f, gpu) for f in feats])
    start = init or Curves.default()
    params0 = default_params()
    for group, values in start.params.items():
        params0.setdefault(group, {}).update(values)

    def leaf(value: float) -> torch.Tensor:
        return torch.tensor(np.log(max(value, 1e-9)), dtype=torch.float64, requires_grad=True)

    groups = sorted({g for f in feats for g in _USES[f.op_class]})
    free = {g: {k: leaf(v) for k, v in params0[g].items()} for g in groups}
    prior = {g: {k: float(t.detach()) for k, t in vals.items()} for g, vals in free.items()}
    counts: dict[str, int] = {}
    for f in feats:
        if f.op_class in MEMORY_CLASSES:
            counts[f.op] = counts.get(f.op, 0) + 1
    mult_ops = sorted(op for op, n in counts.items() if n >= MIN_ROWS_FOR_MULT)
    log_mult = {op: {k: leaf(start.op_mult.get(op, {}).get(k, 1.0)) for k in OP_MULT_KEYS} for op in mult_ops}
    leaves = [t for g in free.values() for t in g.values()] + [t for m in log_mult.values() for t in m.values()]
    target = torch.as_tensor(np.log(nanos))

    def current() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        params: dict[str, dict[str, Any]] = {g: dict(v) for g, v in params0.items()}
        for g, values in free.items():
            params[g] = {k: torch.exp(t) for k, t in values.items()}
        return params, {op: {k: torch.exp(t) for k, t in m.items()} for op, m in log_mult.items()}

    def loss_fn() -> torch.Tensor:
        params, mult = current()
        pred = predict_columns(cols, params, mult, gpu, torch)
        err = torch.log(pred) - target
        loss = torch.nn.functional.huber_loss(err, torch.zeros_like(err), delta=HUBER_DELTA)
        reg = PRIOR * sum((t - prior[g][k]) ** 2 for g, vals in free.items() for k, t in vals.items())
        reg = reg + MULT_PRIOR * sum(t**2 for m in log_mult.values() for t in m.values())
        return loss + 0.5 * reg / len(feats)

    minimise(leaves, loss_fn, max_iter=max_iter, history_size=50)
    with torch.no_grad():
        params, mult = current()
        final = float(loss_fn())
    out_params = {g: {k: float(v) for k, v in vals.items()} for g, vals in params.items()}
    out_mult = {op: {k: float(v) for k, v in m.items()} for op, m in mult.items()}
    meta = {"fitted": True, "gpu": gpu.name, "rows": len(feats), "loss": final, "classes": sorted(set(cols.cls))}
    return Curves(out_params, out_mult, meta)


def minimise(
    params: list[torch.Tensor],
    loss_fn: Callable[[], torch.Tensor],
    *,
    max_iter: int,
    history_size: int,
    tolerance_change: float = 1e-9,
) -> None:
    """Minimise `loss_fn` over `params` in place with L-BFGS (strong Wolfe line search), deterministically."""
    import torch

    opt = torch.optim.LBFGS(
        params, lr=1.0, max_iter=max_iter, history_size=history_size, line_search_fn="strong_wolfe",
        tolerance_grad=1e-10, tolerance_change=tolerance_change,
    )  # fmt: skip

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    opt.step(closure)
