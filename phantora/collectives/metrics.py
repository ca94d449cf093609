"""nccl-tests figures of merit: algorithm bandwidth and bus bandwidth."""

from __future__ import annotations

from phantora.collectives.spec import Collective
from phantora.errors import InputError


def collective_metrics(coll: Collective, duration_ns: int) -> dict[str, float | int]:
    """Time and bandwidths of one collective, as nccl-tests defines them (doc/PERFORMANCE.md).

    algbw = nbytes / time and busbw = algbw * factor (2(n-1)/n for all-reduce, (n-1)/n for
    all-gather, reduce-scatter and all-to-all, 1 otherwise), in bytes/s; the ``*_gbps`` keys are the
    same in GB/s (1e9 bytes/s), the unit nccl-tests prints. Both are 0.0 when the duration is 0.
    """
    if duration_ns < 0:
        raise InputError(f"duration must be >= 0 ns, got {duration_ns}", field="duration_ns")
    algbw = coll.nbytes * 1e9 / duration_ns if duration_ns else 0.0
    busbw = algbw * coll.busbw_factor()
    return {
        "bytes": coll.nbytes,
        "ranks": coll.size,
        "time_ns": int(duration_ns),
        "time_us": duration_ns / 1e3,
        "algbw": algbw,
        "busbw": busbw,
        "algbw_gbps": algbw / 1e9,
        "busbw_gbps": busbw / 1e9,
    }
