"""An opt-in host cost for a plain gloo group's all-reduce in real mode (backend.py `gloo_sync`), from gloo's own
published benchmark.

By default such a call costs no simulated time: it ends at its latest member's entry. The one published gloo
measurement found with its conditions is the example output in gloo's README ("Benchmarking", pytorch/gloo): its
`benchmark` tool's `allreduce_ring_chunked` over the TCP transport on 4 machines joined by 40GbE, float32 elements
(the tool's default type), the median (p50) time per size. `PHANTORA_GLOO_COST=readme-40gbe` adds that time, read off
the table by the call's bytes (linear between its rows, the first row's below it, the last two rows' slope above it),
to each member's end of a gloo group's all-reduce: every member then leaves at the latest entry plus that time. It
stands for those hosts and that network, not the simulated cluster's (whose host network is not modelled), and for 4
processes only: other group sizes take the same figure. Broadcast, barrier, send/recv and the other calls stay free
(no published figure). Unset, empty or "off": no cost.
"""

from __future__ import annotations

import functools
import os

from phantora.errors import InputError

ENV = "PHANTORA_GLOO_COST"
MODELS = ("readme-40gbe",)
# gloo README, "Benchmarking" example output: (elements of float32, p50 us), allreduce_ring_chunked, TCP, 4 machines,
# 40GbE
README_40GBE = (
    (1, 263), (2, 261), (5, 261), (10, 263), (20, 268), (50, 265), (100, 265), (200, 264), (500, 264), (1000, 267),
    (2000, 263), (5000, 335), (10000, 346), (20000, 358), (50000, 438), (100000, 487), (200000, 1450),
    (500000, 1294), (1000000, 2286), (2000000, 3993), (5000000, 10608),
)  # fmt: skip
FLOAT_BYTES = 4


def table_ns(nbytes: int, rows: tuple[tuple[int, int], ...] = README_40GBE) -> int:
    """The table's p50 for `nbytes` (elements x 4 B), in ns: linear between rows, the first row's below the first,
    the last two rows' slope past the last."""
    pts = [(e * FLOAT_BYTES, us * 1000) for e, us in rows]
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if nbytes <= b1:
            return round(t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0))
    (b0, t0), (b1, t1) = pts[-2], pts[-1]
    return round(t1 + (t1 - t0) * (nbytes - b1) / (b1 - b0))


@functools.cache
def model() -> str | None:
    """The cost model `PHANTORA_GLOO_COST` names (None: none); a one-line error for any other value."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "off"):
        return None
    if v not in MODELS:
        raise InputError(f"{ENV}={v!r}: expected one of {', '.join(MODELS)} or off", field=ENV)
    return v


def host_ns(kind: str, nbytes: int) -> int:
    """The host cost in ns a gloo group's call of `kind` over `nbytes` adds to its members' end (0 without the opt-in,
    and for any call but an all-reduce)."""
    if kind != "all_reduce" or model() is None:
        return 0
    return table_ns(nbytes)
