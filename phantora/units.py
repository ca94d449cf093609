"""Parsing of rates, times and sizes into integers (bits/s, ns, bytes); `plural` for counts in messages."""

from __future__ import annotations

import re
from collections.abc import Mapping

from phantora.errors import InputError

_RATE = {"bps": 1, "kbps": 10**3, "mbps": 10**6, "gbps": 10**9, "tbps": 10**12}
_TIME = {"ps": 0.001, "ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9}  # µs: as output writes it
_SIZE = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def _parse(
    text: str | int | float, table: Mapping[str, float], default: str, what: str, field: str | None = None
) -> float:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text) * table[default]
    m = _NUM.match(str(text))
    if not m:
        raise InputError(f"cannot parse {what} {text!r}", field=field)
    unit = (m.group(2) or default).lower()
    if unit not in table:
        raise InputError(f"unknown {what} unit {m.group(2)!r} in {text!r} (known: {', '.join(table)})", field=field)
    return float(m.group(1)) * table[unit]


def parse_rate_bps(text: str | int | float) -> int:
    """'100Gbps' -> 100_000_000_000 (bits per second). Bare numbers are bits/s."""
    return round(_parse(text, _RATE, "bps", "rate"))


def parse_time_ns(text: str | int | float) -> int:
    """'1us' -> 1000. Bare numbers are nanoseconds."""
    return round(_parse(text, _TIME, "ns", "time"))


def parse_size_bytes(text: str | int | float, field: str | None = None) -> int:
    """'4MiB' -> 4194304, '80e9' -> 80000000000. Bare numbers are bytes; errors name `field`."""
    return round(_parse(text, _SIZE, "b", "size", field))


def transmit_ns(nbytes: int, rate_bps: int) -> int:
    """Serialisation time of nbytes at rate_bps, in integer ns (rounded up)."""
    return -(-nbytes * 8 * 10**9 // rate_bps)


def plural(n: int, noun: str) -> str:
    """A count and its noun, plural with an s: "1 step", "2 steps"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
