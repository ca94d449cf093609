"""Public kernel-level measurements (`data/public_kernels.csv`): reader and conversion to timed op calls.

Each row is one published measurement with its citation: a GEMM's TFLOP/s at one shape, a flash
attention kernel's TFLOP/s at one (batch, heads, sequence, head dim; FlashAttention-2 class, or
FlashAttention-3's forward, kind `fa3_fwd`, its calls marked `kernel="fa3"`), or a STREAM kernel's GB/s. A
row becomes a `PublicPoint`: the op calls it timed (a forward + backward row is two calls, timed
together) and their time in ns, from the published rate and the source's own FLOP or byte counting
(column `flops`), so a point's time is what the source measured whatever phantora counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from phantora.errors import InputError
from phantora.files import csv_records, read_text
from phantora.perfmodel.dtypes import dtype_bytes, normalize_dtype
from phantora.perfmodel.features import OpCall, compute_features, make_call
from phantora.perfmodel.gpus import GpuSpec, get_gpu

PUBLIC_FILE = "public_kernels.csv"
COLUMNS = ["gpu", "kind", "dtype", "shape", "causal", "value", "unit", "flops", "source", "locator", "note"]
KINDS = {  # kind -> the counting conventions it may use
    "gemm": ("2mnk",),
    "attn_fwd": ("fa",),
    "attn_bwd": ("fa",),
    "attn_fwd_bwd": ("fa",),
    "fa3_fwd": ("fa",),
    "stream_copy": ("stream",),
    "stream_mul": ("stream",),
    "stream_add": ("stream",),
    "stream_triad": ("stream",),
}
UNITS = {"TFLOP/s": 1e12, "GB/s": 1e9}
FA_FACTOR = {"attn_fwd": 1.0, "attn_bwd": 2.5, "attn_fwd_bwd": 3.5, "fa3_fwd": 1.0}  # of the forward FLOPs (FA papers)
ATTN_KINDS = frozenset(FA_FACTOR)
FA3_KINDS = frozenset({"fa3_fwd"})  # FlashAttention-3's kernels: calls marked `kernel="fa3"`, fitted on their own
FA3 = "fa3"
STREAM_ARRAYS = {"stream_copy": 2, "stream_mul": 2, "stream_add": 3, "stream_triad": 3}  # arrays read + written


@dataclass(frozen=True)
class PublicRow:
    """One row of the file, checked."""

    gpu: str  # canonical GPU name
    kind: str
    dtype: str  # canonical dtype
    shape: tuple[int, ...]
    causal: bool
    value: float
    unit: str
    flops: str
    source: str
    locator: str
    note: str
    where: str  # file:line

    @property
    def kernel(self) -> str:
        """The flash kernel family a row measures: "fa3" for FlashAttention-3's, else "" (FlashAttention-2 class)."""
        return FA3 if self.kind in FA3_KINDS else ""

    @property
    def kernel_class(self) -> str:
        """The class the row informs: gemm, attention (FlashAttention-2 class), attention-fa3, or memory (STREAM)."""
        if self.kind in ATTN_KINDS:
            return f"attention-{self.kernel}" if self.kernel else "attention"
        return "gemm" if self.kind == "gemm" else "memory"


@dataclass(frozen=True)
class PublicPoint:
    """A row as the model sees it: the GPU, the op calls it timed (their times add up) and the measured ns."""

    gpu: GpuSpec
    calls: tuple[OpCall, ...]
    nanos: float
    row: PublicRow

    @property
    def op_classes(self) -> tuple[str, ...]:
        return tuple(compute_features(c).op_class for c in self.calls)


def default_path() -> Path:
    """The shipped file (package data)."""
    return Path(str(resources.files("phantora.perfmodel").joinpath("data", PUBLIC_FILE)))


def read_public(path: str | Path | None = None) -> list[PublicRow]:
    """Read and check the file (default: the shipped one). InputError names the file, line and column."""
    path = Path(path) if path is not None else default_path()
    text = read_text(path, "public kernel data")
    header: list[str] | None = None
    rows: list[PublicRow] = []
    for line, record in csv_records(text):
        if header is None:
            header = [h.strip() for h in record]
            if header != COLUMNS:
                raise InputError(f"expected the header {','.join(COLUMNS)!r}", file=str(path), line=line)
            continue
        if len(record) != len(COLUMNS):
            raise InputError(f"expected {len(COLUMNS)} columns, found {len(record)}", file=str(path), line=line)
        try:
            row = _row(dict(zip(COLUMNS, (v.strip() for v in record), strict=True)), f"{path}:{line}")
            to_point(row)  # the shapes must make op calls
        except InputError as exc:
            raise InputError(exc.message, file=str(path), line=line, field=exc.field) from None
        rows.append(row)
    if header is None:
        raise InputError("empty file (no header)", file=str(path))
    return rows


def _row(f: dict[str, str], where: str) -> PublicRow:
    for col in ("gpu", "kind", "dtype", "shape", "value", "unit", "flops", "source", "locator"):
        if not f[col]:
            raise InputError("empty (every row needs it; source and locator are its citation)", field=col)
    gpu = get_gpu(f["gpu"]).name
    kind = f["kind"]
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})", field="kind")
    if f["flops"] not in KINDS[kind]:
        raise InputError(f"{kind} rows count with {' or '.join(KINDS[kind])}, not {f['flops']!r}", field="flops")
    if f["unit"] not in UNITS:
        raise InputError(f"unknown unit {f['unit']!r} (known: {', '.join(UNITS)})", field="unit")
    if (f["unit"] == "GB/s") != kind.startswith("stream"):
        raise InputError(f"{kind} rows are in {'GB/s' if kind.startswith('stream') else 'TFLOP/s'}", field="unit")
    try:
        shape = tuple(int(x) for x in f["shape"].lower().split("x"))
    except ValueError:
        raise InputError(f"shape {f['shape']!r} is not integers joined by 'x'", field="shape") from None
    want = 3 if kind == "gemm" else 4 if kind in ATTN_KINDS else 1
    if len(shape) != want or min(shape) <= 0:
        raise InputError(f"{kind} needs {want} positive dimensions, got {f['shape']!r}", field="shape")
    try:
        value = float(f["value"])
    except ValueError:
        raise InputError(f"value {f['value']!r} is not a number", field="value") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"value {f['value']!r} must be a positive number", field="value")
    causal = f["causal"] in ("1", "true", "yes")
    if f["causal"] not in ("", "0", "1", "true", "false", "yes", "no"):
        raise InputError(f"causal must be 0 or 1, got {f['causal']!r}", field="causal")
    dtype = normalize_dtype(f["dtype"])
    return PublicRow(gpu, kind, dtype, shape, causal, value, f["unit"], f["flops"], f["source"], f["locator"],
                     f["note"], where)  # fmt: skip


def work(row: PublicRow) -> float:
    """FLOPs (or bytes) the source divides by the time, by its own counting."""
    if row.flops == "2mnk":
        m, n, k = row.shape
        return 2.0 * m * n * k
    if row.flops == "fa":
        b, h, s, d = row.shape
        fwd = 4.0 * b * h * s * s * d * (0.5 if row.causal else 1.0)
        return fwd * FA_FACTOR[row.kind]
    (n,) = row.shape
    return float(STREAM_ARRAYS[row.kind] * n * dtype_bytes(row.dtype))


def to_point(row: PublicRow) -> PublicPoint:
    """The op calls a row timed and their measured time in ns."""
    d = row.dtype
    if row.kind == "gemm":
        m, n, k = row.shape
        op = "aten::_scaled_mm" if d.startswith("float8") else "aten::mm"
        calls: tuple[OpCall, ...] = (make_call(op, [[m, k], [k, n]], [d, d]),)
    elif row.kind in ATTN_KINDS:
        b, h, s, hd = row.shape
        qkv = [[b, h, s, hd]] * 3
        extra: dict[str, object] = {"causal": row.causal} | ({"kernel": row.kernel} if row.kernel else {})
        fwd = make_call("aten::_scaled_dot_product_flash_attention", qkv, [d] * 3, extra)
        bwd = make_call(
            "aten::_scaled_dot_product_flash_attention_backward",
            [[b, h, s, hd], *qkv, [b, h, s, hd], [b, h, s]],
            [d, d, d, d, d, "float32"],
            extra,
        )
        calls = {"attn_fwd": (fwd,), "attn_bwd": (bwd,), "attn_fwd_bwd": (fwd, bwd), "fa3_fwd": (fwd,)}[row.kind]
    else:
        (n,) = row.shape
        if row.kind == "stream_copy":
            calls = (make_call("aten::copy_", [[n], [n]], [d, d]),)
        elif row.kind == "stream_mul":
            calls = (make_call("aten::mul", [[n]], [d]),)
        else:  # add, triad: two arrays in, one out
            calls = (make_call("aten::add", [[n], [n]], [d, d]),)
    nanos = work(row) / (row.value * UNITS[row.unit]) * 1e9
    return PublicPoint(get_gpu(row.gpu), calls, nanos, row)


def read_points(path: str | Path | None = None) -> list[PublicPoint]:
    return [to_point(r) for r in read_public(path)]
