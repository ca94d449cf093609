"""Efficiency curves: op time from features, GPU peaks and a small set of per-class parameters.

- gemm: t = floor + smoothmax(flops / (peak * eff), t_mem), with
  eff = eff_max * s(m, half_mn) * s(n, half_mn) * s(k, half_k) * s(work, half_work), s(x, h) = x / (x + h),
  work = b*m*n*(1 + k/split_k) / SMs: small dimensions waste tensor-core tiles; few output elements per SM
  leave SMs idle, unless a long k lets the library split it.
- attention_fwd / attention_bwd (flash): t = floor_gemm + smoothmax(matmul FLOPs / (peak * eff_dir)
  + pairs * pair_cyc / (SMs * clock), t_mem): the tensor-core part plus the softmax work on each kept
  (query, key) pair, which does not shrink with the head dimension. The backward's pair work is
  ATTN_BWD_PAIR_FACTOR times the forward's.
- memory-bound classes (elementwise, reduction, copy, fill, foreach):
  t = kernels * floor * fmult(op) + mixed * mixed_ns + tensors * tensor_ns + smoothmax(bmult(op) * t_mem, t_ops),
  t_mem = (bytes + (w_l2 - 1) * written bytes) * hit / bw_l2 + bytes * (1 - hit) / bw_dram (writes into L2 may
  cost w_l2 times a read), hit = 1 / (1 + (working_set / (l2_frac * L2))^sharp),
  bw_dram = e_dram * DRAM bandwidth, bw_l2 = max(l2_bpc * SMs * clock, bw_dram) (bytes per SM per clock), and
  t_ops = elements * (cyc_elem + bcast * cyc_bcast + mixed * cyc_mixed) / (SMs * clock): the index and
  cast work of broadcasting and mixed-dtype elementwise kernels, which shows when data sits in L2.
  fmult/bmult are per-op factors (1 unless fitted) for ops whose kernels launch or move more than counted.
- memcpy_h2d / memcpy_d2h: t = floor + bytes / (e_host * PCIe bandwidth).

Transfer to other GPUs: the fitted efficiencies are fractions of the GPU's own peaks (tensor FLOP/s,
DRAM and PCIe bandwidth); L2 bandwidth and per-element work are per SM per clock; L2 reach is a fraction
of the GPU's L2 size; floors stay in ns. The assumption: a kernel reaches the same fraction of each peak
on every GPU. Scaled by SMs x clock, the L2 of an HBM GPU (A100..B200) is barely faster than its DRAM,
so the model gives those GPUs little L2 benefit: a conservative (slower) estimate for small tensors.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from phantora.perfmodel.features import OpFeatures
from phantora.perfmodel.gpus import GpuSpec
from phantora.perfmodel.ops import SAME_KERNEL_AS

MEMORY_CLASSES = ("elementwise", "reduction", "copy", "fill", "foreach")
HOST_CLASSES = ("memcpy_h2d", "memcpy_d2h")
SMOOTH_Q = 4.0  # smooth max of the compute and memory times (p-norm)
# Non-matmul work per (query, key) pair in attention backward relative to forward: the backward redoes
# the exponentials and forms dS = P * (dP - rowsum(dO * O)), about twice the forward's softmax work.
ATTN_BWD_PAIR_FACTOR = 2.0
# The backward's per-row work (optional attention.row_cyc / diag_cyc) relative to the forward's: the FLOP ratio of
# the FlashAttention papers' counting (5 matrix products against 2).
ATTN_BWD_ROW_FACTOR = 2.5

_MEM = {"floor_ns": 1500.0, "e_dram": 0.75, "l2_bpc": 16.0, "l2_frac": 0.9, "w_l2": 1.0}
# Starting values: a-priori guesses (not fitted), and the model used before any calibration.
DEFAULT_PARAMS: dict[str, dict[str, float]] = {
    "gemm": {
        "floor_ns": 3000.0,
        "eff_max": 0.7,
        "half_mn": 64.0,
        "half_k": 64.0,
        "half_work": 1024.0,
        "split_k": 4096.0,
        "e_dram": 0.8,
        "l2_bpc": 16.0,
        "l2_frac": 0.9,
    },
    "attention": {"eff_fwd": 0.5, "eff_bwd": 0.5, "pair_cyc": 0.125},
    "elementwise": {**_MEM, "mixed_ns": 300.0, "cyc_elem": 0.01, "cyc_bcast": 0.1, "cyc_mixed": 0.1},
    "reduction": {**_MEM, "floor_ns": 2500.0},
    "copy": dict(_MEM),
    "fill": {**_MEM, "floor_ns": 1000.0},
    "foreach": {**_MEM, "tensor_ns": 20.0},
    "memory": {"sharp": 8.0},
    "memcpy_h2d": {"floor_ns": 1000.0, "e_host": 0.4},
    "memcpy_d2h": {"floor_ns": 1000.0, "e_host": 0.4},
}
OP_MULT_KEYS = ("floor", "bytes")
# Parameters a curves file may hold beyond DEFAULT_PARAMS, with the value meaning "absent". gemm.fp8_eff: the
# efficiency of an fp8 GEMM relative to a 16-bit one at the same shape (the public per-GPU fit sets it where
# fp8 measurements exist; perfdb/l40s has none).
# attention.row_cyc / diag_cyc: cycles per query row and head-dim element of a flash kernel (all rows / the rows of
# a causal kernel, whose diagonal tiles are computed whole); perfdb/l40s's four attention rows cannot fit them.
OPTIONAL_PARAMS: dict[tuple[str, str], float] = {
    ("gemm", "fp8_eff"): 1.0,
    ("attention", "row_cyc"): 0.0,
    ("attention", "diag_cyc"): 0.0,
}


@dataclass
class Columns:
    """Features of many op calls on one GPU, as numpy columns (one entry per call)."""

    cls: np.ndarray
    ops: list[str]
    flops: np.ndarray
    bytes: np.ndarray
    ws: np.ndarray
    kernels: np.ndarray
    tensors: np.ndarray
    mixed: np.ndarray
    bcast: np.ndarray
    b: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    peak: np.ndarray
    pairs: np.ndarray
    writes: np.ndarray
    fp8: np.ndarray  # 1 for calls whose compute dtype is an fp8 type


def columns(feats: list[OpFeatures], peaks: list[float]) -> Columns:
    """Stack features (and the matmul peak of each call's dtype, 0 when unused) into columns."""

    def col(values: list[float]) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    dims = [f.dims if len(f.dims) == 4 else (1, 1, 1, 1) for f in feats]
    return Columns(
        cls=np.asarray([f.op_class for f in feats], dtype=object),
        ops=[f.op for f in feats],
        flops=col([f.flops for f in feats]),
        bytes=col([f.bytes for f in feats]),
        ws=col([f.working_set for f in feats]),
        kernels=col([f.kernels for f in feats]),
        tensors=col([f.tensors for f in feats]),
        mixed=col([1.0 if f.mixed else 0.0 for f in feats]),
        bcast=col([1.0 if f.bcast else 0.0 for f in feats]),
        b=col([max(d[0], 1) for d in dims]),
        m=col([max(d[1], 1) for d in dims]),
        n=col([max(d[2], 1) for d in dims]),
        k=col([max(d[3], 1) for d in dims]),
        peak=col([p if p > 0 else 1.0 for p in peaks]),
        pairs=col([f.pairs for f in feats]),
        writes=col([f.writes for f in feats]),
        fp8=col([1.0 if f.dtype.startswith("float8") else 0.0 for f in feats]),
    )


def _sat(x: Any, half: Any) -> Any:
    return x / (x + half)


def _smax(a: Any, b: Any) -> Any:
    return (a**SMOOTH_Q + b**SMOOTH_Q) ** (1.0 / SMOOTH_Q)


def gemm_efficiency(p: dict[str, Any], b: Any, m: Any, n: Any, k: Any, sms: int) -> Any:
    """Fraction of the tensor peak a GEMM of this shape reaches."""
    work = b * m * n * (1.0 + k / p["split_k"]) / sms
    shape = _sat(m, p["half_mn"]) * _sat(n, p["half_mn"]) * _sat(k, p["half_k"])
    return p["eff_max"] * shape * _sat(work, p["half_work"])


def _op_factor(ops: list[str], mult: dict[str, dict[str, Any]], key: str, xp: Any, like: Any) -> Any:
    """Per-row multiplier: mult[op][key] for ops that have one, else 1."""
    names = [op for op in mult if key in mult[op]]
    if not names:
        return xp.ones_like(like)
    pos = {op: i + 1 for i, op in enumerate(names)}
    idx = np.asarray([pos.get(SAME_KERNEL_AS.get(op, op), 0) for op in ops], dtype=np.int64)
    if xp is np:
        return np.asarray([1.0] + [float(mult[o][key]) for o in names])[idx]
    table = xp.stack([xp.ones((), dtype=like.dtype)] + [xp.as_tensor(mult[o][key]) for o in names])
    return table[xp.as_tensor(idx)]


def predict_columns(
    c: Columns, params: dict[str, dict[str, Any]], mult: dict[str, dict[str, Any]], gpu: GpuSpec, xp: Any
) -> Any:
    """Predicted ns of every row. `xp` is numpy, or torch when fitting (then params are tensors)."""
    asarray = (lambda a: xp.as_tensor(a, dtype=xp.float64)) if xp is not np else np.asarray
    flops, nbytes, ws, writes = asarray(c.flops), asarray(c.bytes), asarray(c.ws), asarray(c.writes)
    out = xp.zeros_like(flops)
    sm_hz = gpu.sms * gpu.clock_hz
    sharp = params["memory"]["sharp"]

    def t_mem(p: dict[str, Any]) -> Any:
        hit = 1.0 / (1.0 + (ws / (p["l2_frac"] * gpu.l2_bytes) + 1e-12) ** sharp)
        bw_dram = p["e_dram"] * gpu.mem_bw
        bw_l2 = xp.maximum(p["l2_bpc"] * sm_hz, bw_dram)  # an L2 hit is never slower than DRAM
        l2_bytes = nbytes + (p["w_l2"] - 1.0) * writes if "w_l2" in p else nbytes
        return (l2_bytes * hit / bw_l2 + nbytes * (1.0 - hit) / bw_dram) * 1e9

    g = params["gemm"]
    for cls in np.unique(c.cls):
        mask = asarray((c.cls == cls).astype(np.float64)) > 0.5
        if cls == "gemm":
            eff = gemm_efficiency(g, asarray(c.b), asarray(c.m), asarray(c.n), asarray(c.k), gpu.sms)
            if "fp8_eff" in g:
                eff = eff * (1.0 + asarray(c.fp8) * (g["fp8_eff"] - 1.0))
            t = g["floor_ns"] + _smax(flops / (asarray(c.peak) * eff) * 1e9, t_mem(g))
        elif cls in ("attention_fwd", "attention_bwd"):
            a = params["attention"]
            fwd = cls == "attention_fwd"
            eff = a["eff_fwd"] if fwd else a["eff_bwd"]
            pair_cyc = a["pair_cyc"] * (1.0 if fwd else ATTN_BWD_PAIR_FACTOR)
            t_c = (flops / (asarray(c.peak) * eff) + asarray(c.pairs) * pair_cyc / sm_hz) * 1e9
            if "row_cyc" in a:  # per query row and head-dim element: Q in, O out, and the causal diagonal tiles
                bh, sq, hd = asarray(c.b), asarray(c.m), asarray(c.k)
                causal = (asarray(c.pairs) < bh * sq * asarray(c.n) - 0.5) * 1.0
                cyc = (a["row_cyc"] + causal * a.get("diag_cyc", 0.0)) * (1.0 if fwd else ATTN_BWD_ROW_FACTOR)
                t_c = t_c + bh * sq * hd * cyc / sm_hz * 1e9
            t = g["floor_ns"] + _smax(t_c, t_mem(g))
        elif cls in MEMORY_CLASSES:
            p = params[cls]
            floor = asarray(c.kernels) * p["floor_ns"] * _op_factor(c.ops, mult, "floor", xp, flops)
            tm = t_mem(p) * _op_factor(c.ops, mult, "bytes", xp, flops)
            if "cyc_elem" in p:
                cyc = p["cyc_elem"] + asarray(c.bcast) * p["cyc_bcast"] + asarray(c.mixed) * p["cyc_mixed"]
                tm = _smax(tm, flops * cyc / sm_hz * 1e9)
            t = floor + tm
            if "mixed_ns" in p:
                t = t + asarray(c.mixed) * p["mixed_ns"]
            if "tensor_ns" in p:
                t = t + asarray(c.tensors) * p["tensor_ns"]
        elif cls in HOST_CLASSES:
            p = params[cls]
            t = p["floor_ns"] + nbytes / (p["e_host"] * gpu.host_bw) * 1e9
        else:  # noop
            t = xp.zeros_like(flops)
        out = xp.where(mask, t, out)
    return out


def roofline_ns(f: OpFeatures, gpu: GpuSpec, peak: float) -> int:
    """The untuned roofline: efficiency 1, no floor, no cache: max(flops / peak, bytes / DRAM bandwidth)."""
    t_c = f.flops / peak if peak > 0 and f.op_class in ("gemm", "attention_fwd", "attention_bwd") else 0.0
    bw = gpu.host_bw if f.op_class in HOST_CLASSES else gpu.mem_bw
    return round(max(t_c, f.bytes / bw) * 1e9)


def default_params() -> dict[str, dict[str, float]]:
    """A fresh copy of the starting parameters."""
    return copy.deepcopy(DEFAULT_PARAMS)


@dataclass
class Curves:
    """Fitted (or default) curve parameters; JSON-serialisable via to_json/from_json."""

    params: dict[str, dict[str, float]]
    op_mult: dict[str, dict[str, float]]
    meta: dict[str, Any]

    FORMAT = "phantora-compute-curves"
    VERSION = 1

    @classmethod
    def default(cls) -> Curves:
        return cls(default_params(), {}, {"fitted": False})

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.FORMAT,
            "version": self.VERSION,
            "params": self.params,
            "op_mult": dict(sorted(self.op_mult.items())),
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, obj: Any, *, source: str = "curves") -> Curves:
        """Parse curves written by to_json; InputError naming the file and field when malformed."""
        from phantora.errors import InputError

        if not isinstance(obj, dict) or obj.get("format") != cls.FORMAT:
            raise InputError(f"not a {cls.FORMAT} file", file=source, field="format")
        if obj.get("version") != cls.VERSION:
            raise InputError(f"unsupported version {obj.get('version')!r}", file=source, field="version")
        params = default_params()
        for name, values in (obj.get("params") or {}).items():
            if name not in params or not isinstance(values, dict):
                raise InputError(f"unknown curve class {name!r}", file=source, field="params")
            for key, value in values.items():
                known = key in params[name] or (name, key) in OPTIONAL_PARAMS
                if not known or not isinstance(value, (int, float)) or value < 0:
                    raise InputError(f"bad parameter {key!r}={value!r}", file=source, field=f"params.{name}")
                params[name][key] = float(value)
        mult = obj.get("op_mult") or {}
        ok = isinstance(mult, dict) and all(
            isinstance(v, dict)
            and all(k in OP_MULT_KEYS and isinstance(x, (int, float)) and x > 0 for k, x in v.items())
            for v in mult.values()
        )
        if not ok:
            raise InputError(
                f"op_mult must map op names to {{{', '.join(OP_MULT_KEYS)}: positive number}}",
                file=source,
                field="op_mult",
            )
        op_mult = {str(op): {k: float(x) for k, x in v.items()} for op, v in mult.items()}
        return cls(params, op_mult, dict(obj.get("meta") or {}))
