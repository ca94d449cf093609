"""`torch.cuda.memory_summary()` on the simulated GPU: the figures phantora models, in torch's frame.

torch's own summary reads about 80 counters of the CUDA caching allocator (each metric for the large and small
pools, with totals allocated and freed); phantora models the allocated, active and reserved bytes (current and
peak), the reserved segments, the cached free bytes and the allocator's retries, so those are printed, and the
rest is said not to be modelled rather than shown as zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

WIDTH = 75
_BYTES = (
    ("allocated_bytes", "Allocated memory"),
    ("active_bytes", "Active memory"),
    ("reserved_bytes", "GPU reserved memory"),
)


def size(n: int) -> str:
    """A byte count in binary units, at most four digits before the point."""
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 10240:
            break
        value, unit = value / 1024, bigger
    return f"{value:7.1f} {unit:<3}" if unit != "B" else f"{int(value):7d} B  "


def summary(stats: Mapping[str, Any], device: int, abbreviated: bool = False) -> str:
    """The summary of `stats` (what `torch.cuda.memory_stats()` answers on the simulated GPU) for GPU `device`.
    `abbreviated` is accepted as torch's is; the simulated allocator has no per-pool figures to leave out."""
    rule, thick = "-" * WIDTH, "=" * WIDTH
    lines = [
        thick,
        f"{'PyTorch CUDA memory summary, device ID ' + str(device):^{WIDTH}}",
        f"{'simulated by phantora: allocated, active and reserved bytes':^{WIDTH}}",
        rule,
        f"  CUDA OOMs: {stats.get('num_ooms', 0):<12d} | cudaMalloc retries: {stats.get('num_alloc_retries', 0):<8d}",
        thick,
        "        Metric         | Cur Usage   | Peak Usage  ",
        rule,
    ]
    for key, name in _BYTES:
        cur, peak = stats[f"{key}.all.current"], stats[f"{key}.all.peak"]
        lines.append(f" {name:<21} | {size(cur)} | {size(peak)} ")
    lines.append(
        f" {'Non-releasable memory':<21} | {size(stats.get('inactive_split_bytes.all.current', 0))} | {'n/a':>11} "
    )
    lines.append(f" {'GPU reserved segments':<21} | {stats.get('segment.all.current', 0):11d} | {'n/a':>11} ")
    lines += [
        rule,
        " Not modelled: the large and small pools apart, the totals allocated and",
        " freed, the allocation counts",
        thick,
    ]
    return "|" + "|\n|".join(line.ljust(WIDTH) for line in lines) + "|\n"
