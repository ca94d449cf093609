"""Small checked conversions shared by the topology generators and readers."""

from __future__ import annotations

from collections.abc import Callable

from phantora.errors import InputError
from phantora.units import parse_rate_bps, parse_time_ns

Rate = int | str
Time = int | str

DEFAULT_NVLINK_BPS = 3600 * 10**9  # H100: 450 GB/s per direction (REFERENCE.md section 2)


def raw_message(exc: InputError) -> str:
    """The message of an InputError without its 'file:line: field: ' prefix."""
    text = str(exc)
    prefix = ""
    if exc.file is not None:
        prefix = str(exc.file) + (f":{exc.line}" if exc.line is not None else "") + ": "
    if exc.field is not None:
        prefix += f"field '{exc.field}': "
    return text[len(prefix) :] if text.startswith(prefix) else text


def relocate(exc: InputError, *, file: str | None = None, line: int | None = None, prefix: str = "") -> InputError:
    """A copy of exc that also names a file/line, and whose field is prefixed (e.g. 'generator.')."""
    field = exc.field
    if field is not None:
        field = prefix + field
    return InputError(
        raw_message(exc),
        file=file if file is not None else exc.file,
        line=line if line is not None else exc.line,
        field=field,
    )


def _quantity(
    value: object,
    field: str,
    parse: Callable[[str | int | float], int],
    example: str,
    *,
    positive: bool,
    file: str | None,
    line: int | None,
) -> int:
    """`parse(value)` with every error (bad type, bad text, out of range) naming the file, line and field."""
    what = "rate" if positive else "time"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"expected a {what} such as {example!r}, got {value!r}", file=file, line=line, field=field)
    try:
        n = parse(value)
    except InputError as exc:
        raise InputError(raw_message(exc), file=file, line=line, field=field) from None
    if n < 0 or (positive and n == 0):
        bound = "positive" if positive else ">= 0"
        raise InputError(f"{what} must be {bound}, got {value!r}", file=file, line=line, field=field)
    return n


def rate_bps(value: object, field: str, *, file: str | None = None, line: int | None = None) -> int:
    """A positive integer rate in bits/s from '400Gbps' or an int."""
    return _quantity(value, field, parse_rate_bps, "400Gbps", positive=True, file=file, line=line)


def time_ns(value: object, field: str, *, file: str | None = None, line: int | None = None) -> int:
    """A non-negative integer time in ns from '1us' or an int."""
    return _quantity(value, field, parse_time_ns, "1us", positive=False, file=file, line=line)


def count(value: object, field: str, minimum: int = 1) -> int:
    """An integer >= minimum (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"expected an integer, got {value!r}", field=field)
    if value < minimum:
        raise InputError(f"must be >= {minimum}, got {value}", field=field)
    return value


def ratio(value: object, field: str) -> float:
    """A positive finite number (an oversubscription ratio)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) < float("inf"):
        raise InputError(f"expected a positive number, got {value!r}", field=field)
    return float(value)


def gpu_name(value: object, field: str = "gpu") -> str | None:
    """A GPU model name, lower-cased ('H100' -> 'h100')."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or not value.replace("-", "").replace("_", "").isalnum():
        raise InputError(f"expected a GPU name such as 'h100', got {value!r}", field=field)
    return value.strip().lower()


CPU_VENDORS = ("intel", "amd", "arm")  # the hosts' CPU as NCCL's topology detection tells them apart


def cpu_name(value: object, field: str = "cpu") -> str | None:
    """The hosts' CPU vendor, lower-cased ('AMD' -> 'amd'): intel, amd or arm (NCCL's net overhead and its
    multi-node LL ceiling follow it; arm hosts take Intel's figures, as NCCL gives any non-AMD host)."""
    if value is None:
        return None
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in CPU_VENDORS:
        raise InputError(f"expected one of {', '.join(CPU_VENDORS)}, got {value!r}", field=field)
    return name


def nvlink_default(gpu: str | None) -> int | None:
    """NVLink bits/s per direction of a GPU model (phantora.perfmodel.gpus; H100 when unknown); None if it
    has no NVLink to an NVSwitch (PCIe cards, whose NVLink bridges join pairs only)."""
    from phantora.perfmodel.gpus import get_gpu

    if gpu is None:
        return DEFAULT_NVLINK_BPS
    try:
        spec = get_gpu(gpu)
    except InputError:
        return DEFAULT_NVLINK_BPS
    return int(spec.nvlink_bw) * 8 if spec.nvlink_bw else None


def format_rate(bps: int) -> str:
    """400_000_000_000 -> '400Gbps' (exact; Gbps at most, which ns-3 reads)."""
    for unit, scale in (("Gbps", 10**9), ("Mbps", 10**6), ("Kbps", 10**3)):
        if bps % scale == 0:
            return f"{bps // scale}{unit}"
    return f"{bps}bps"


def format_time(ns: int) -> str:
    """1000 -> '1000ns' (ns is exact and read by every tool)."""
    return f"{ns}ns"
