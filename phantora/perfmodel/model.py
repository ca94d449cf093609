"""ComputeModel: a GPU, fitted curves and an optional measured table (consulted first)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from phantora.errors import InputError
from phantora.files import read_text
from phantora.perfmodel.alignment import unaligned_factor
from phantora.perfmodel.curves import Curves, columns, predict_columns
from phantora.perfmodel.features import OpCall, OpFeatures, compute_features, make_call
from phantora.perfmodel.fit import peak_of
from phantora.perfmodel.gpus import GpuSpec, get_gpu
from phantora.perfmodel.table import TimingTable

DEFAULT_CURVES = "default_curves.json"  # fitted on all of perfdb/l40s; see docs/validation.md


def load_curves(path: str | Path | None = None) -> Curves:
    """Curves from a JSON file written by `phantora calibrate --out`, or the shipped default."""
    if path is None:
        try:
            text = resources.files("phantora.perfmodel").joinpath(DEFAULT_CURVES).read_text()
        except FileNotFoundError:
            return Curves.default()
        return Curves.from_json(json.loads(text), source=DEFAULT_CURVES)
    path = Path(path)
    text = read_text(path, "curves")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"bad JSON ({exc.msg})", file=str(path), line=exc.lineno) from None
    return Curves.from_json(obj, source=str(path))


def load_inputs(
    tables: list[str | Path] | tuple[str | Path, ...] = (), curves: str | Path | None = None
) -> tuple[Curves | None, TimingTable | None]:
    """The curves file (None: the shipped curves) and the measured tables of a run, read and checked.

    Raises InputError naming the file (and line) that cannot be read."""
    return (load_curves(curves) if curves else None), (TimingTable.from_files(list(tables)) if tables else None)


def save_curves(path: str | Path, curves: Curves) -> None:
    Path(path).write_text(json.dumps(curves.to_json(), indent=2, sort_keys=False) + "\n")


class ComputeModel:
    """Predicts the GPU time of one op call, in integer ns, and says which tier timed it.

    Three tiers, first match wins: a measured table entry for exactly this call (op, shapes, dtypes,
    extra), tier "measured"; the public per-GPU fit of the GPU's die for the op classes it has public
    measurements of (`pubfit.py`), tier "public"; the L40S-shaped curves (`default_curves.json`
    through this GPU's peaks), tier "l40s". With `curves` (a `phantora calibrate --out` file) those
    curves time every op the table does not, tier "curves"; `public=False` turns the public fit off.
    A flash forward call marked `kernel="fa3"` (FlashAttention-3's) is timed by the die's FA3 fit
    (`pubfit.fa3_curves`), tier "public", where the die has one; elsewhere as any flash forward.
    The table must come from the same GPU (checked when the table names its GPU). `tf32=True` makes
    fp32 matrix products use the TF32 tensor-core peak.
    """

    def __init__(
        self,
        gpu: str | GpuSpec,
        curves: Curves | None = None,
        table: TimingTable | None = None,
        *,
        tf32: bool = False,
        public: bool = True,
    ) -> None:
        from phantora.perfmodel.pubfit import fa3_curves, public_curves

        self.gpu = get_gpu(gpu)
        if table is not None and table.gpu is not None and get_gpu(table.gpu) is not self.gpu:
            raise InputError(f"the measured table is from {table.gpu}, not {self.gpu.name}", field="gpu")
        self.public_classes: frozenset[str] = frozenset()
        self.fa3_curves: Curves | None = None
        if curves is not None:
            self.curves, self.fallback_tier = curves, "curves"
        else:
            self.curves, self.fallback_tier = load_curves(), "l40s"
            fit = public_curves(self.gpu, self.curves) if public else None
            if fit is not None:
                self.curves, self.public_classes = fit
                self.fa3_curves = fa3_curves(self.gpu, load_curves())
        self.table = table
        self.tf32 = tf32
        self._cache: dict[tuple, tuple[int, str]] = {}

    def features(self, op: str, shapes: list, dtypes: list, extra: dict | None = None) -> OpFeatures:
        return compute_features(make_call(op, shapes, dtypes, extra))

    def predict_call(self, call: OpCall) -> int:
        """Time of a normalised call: table first, then the curves. Cached per call key."""
        return self.timed_call(call)[0]

    def timed_call(self, call: OpCall) -> tuple[int, str]:
        """(ns, tier) of a normalised call: table first, then the curves. Cached per call key, TF32 use and the
        output and layout hints (hints are not part of the table key, but TF32 changes an fp32 product's peak, the
        outputs a memory-bound op's bytes (nll_loss's reduction, a value-dependent output's size) and the operands'
        strides and offsets whether a GEMM runs an unaligned kernel)."""
        extra = call.extra
        tf32 = bool(extra.get("tf32", self.tf32))
        shapes, dtypes = extra.get("out_shapes"), extra.get("out_dtypes")
        outs = tuple(map(tuple, shapes)) if shapes else None, tuple(dtypes) if dtypes else None
        strides, offsets = extra.get("strides"), extra.get("offsets")
        layout = (tuple(map(tuple, strides)) if strides else None, tuple(offsets) if offsets else None)
        key = (*call.key(), tf32, outs, layout)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        measured = self.table.lookup(call) if self.table is not None else None
        if measured is not None:
            out = (measured, "measured")
        else:
            f = compute_features(call)
            if self.fa3_curves is not None and f.op_class == "attention_fwd" and extra.get("kernel") == "fa3":
                out = (self.model_ns(f, curves=self.fa3_curves), "public")
            else:
                tier = "public" if f.op_class in self.public_classes else self.fallback_tier
                out = (self.model_ns(f, tf32=tf32), tier)
        self._cache[key] = out
        return out

    def model_ns(self, f: OpFeatures, *, tf32: bool = False, curves: Curves | None = None) -> int:
        """The curves' time for features `f` (no table lookup); an unaligned tensor-core GEMM's (an operand's
        contiguous extent, leading dimension or offset off the 16-byte grid) is divided by alignment.UNALIGNED_EFF
        (the curves are fitted on aligned GEMMs)."""
        if f.op_class == "noop":
            return 0
        cols = columns([f], [peak_of(f, self.gpu, tf32)])
        c = curves or self.curves
        t = predict_columns(cols, c.params, c.op_mult, self.gpu, np)
        return max(0, int(round(float(t[0]) * unaligned_factor(f, tf32))))

    def predict_ns(self, op: str, shapes: list, dtypes: list, extra: dict | None = None) -> int:
        """Time of `op` (aten name, e.g. 'aten::mm') on input `shapes`/`dtypes`; see predict_ns()."""
        return self.predict_call(make_call(op, shapes, dtypes, extra))


@lru_cache(maxsize=16)
def _default_model(gpu: str) -> ComputeModel:
    return ComputeModel(gpu)


def predict_ns(
    op: str,
    shapes: list[tuple[int, ...]],
    dtypes: list[str],
    gpu: str,
    extra: dict[str, Any] | None = None,
) -> int:
    """GPU time (ns) of one aten op on `gpu`, with the shipped calibrated curves.

    `shapes`/`dtypes` describe the tensor inputs in argument order (skip None and scalars); foreach
    ops take all lists flattened, with `extra={"list_len": n}`. Other `extra` keys: `causal`
    (attention), `dtype` (`_to_copy` target), `p`/`train` (dropout), `out_shapes`/`out_dtypes`
    (override the outputs of a memory-bound op), `tf32` (fp32 matmuls on tensor cores).
    """
    return _default_model(get_gpu(gpu).name).predict_ns(op, shapes, dtypes, extra)
