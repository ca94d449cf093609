"""Published nccl-tests points at an algorithm's first use (where it is connected), not the collective alone.

Two pieces of code meet here. NCCL from 2.22 connects an algorithm's channels the first time the tuner picks it
(`NCCL_RUNTIME_CONNECT`, on by default with cuMem: init.cc; enqueue.cc marks `initAlgoChannels[algo]` and connects
before the launch), and NVLS-Tree's first use also sets up NVLS. nccl-tests before v2.16.8 (commit f2015cb,
2025-08) warms up only at its largest and then its smallest size (common.cu "Warm-up for large size", "... small
size"). So the first size, inside the range, at which the tuner picks an algorithm that neither warm-up size used
is where that algorithm is connected, and the published points there are slower than at twice the size.
The connection itself is not timed, though: every nccl-tests version (v2.0.0 to v2.19.6) runs one untimed call of
each size and placement before its timed loop (common.cu `BenchTime`, "// Sync"), and NCCL connects inside the call,
before its launch (group.cc joins `ncclCollPreconnectFunc`). What slows the timed calls after NVLS-Tree's first
use is not found in NCCL's code (docs/validation.md, "#309's multi-host misses"); the points stay apart.

Which sizes those are follows from the tuner of the NCCL that ran. NCCL 2.22-2.27 rate NVLS-Tree as
nChannels x min(bwIntra, bwInter, or bwInter / 2 beyond two nodes) x 5/6 with latency 25 + 2 log2(nodes) x 14 µs
(tuning.cc of v2.22.3-v2.27.7; 2.28 retuned it; `tuning.nvls_tree_cost_2_2x`, used by `tuning.select` when
PHANTORA_NCCL_VERSION names one of them). Everything else is the same as
2.30's model. The order is visible in a published INFO log of NCCL 2.22.3 under nccl-tests v2.13.9 (AWS p5,
tests/data/nccl_tests/SOURCES.md): "Connected NVLS tree" (the 16 GiB warm-up), then the tree's channels and
"Connected all trees" (the 8 B warm-up), then the rows; no ring is ever connected there.
"""

from __future__ import annotations

from dataclasses import replace

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl import tuning
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.tuning import nvls_tree_cost_2_2x

__all__ = ["choice_2_2x", "first_uses", "nvls_tree_cost_2_2x"]


def choice_2_2x(p: Platform, st: NcclSettings, nbytes: int) -> str:
    """ "algorithm/protocol" that NCCL 2.22-2.27's tuner picks for an all-reduce of `nbytes` on several nodes."""
    choice = tuning.select("all_reduce", p, replace(st, nccl_version=T.OLD_NVLS_TREE_TUNER[1]), nbytes)
    if choice is None:
        raise ValueError(f"no all-reduce algorithm enabled on {p.nnodes} node(s)")
    return f"{choice.algorithm}/{choice.protocol}"


def first_uses(p: Platform, st: NcclSettings, sizes: list[int]) -> dict[int, str]:
    """The sizes of an nccl-tests all-reduce sweep (old warm-up: largest, then smallest size) whose timed loop
    connects an algorithm: the first size at which NCCL 2.22-2.27 pick an algorithm neither warm-up size used."""
    algo = {s: choice_2_2x(p, st, s).split("/")[0] for s in sizes}
    connected = {algo[max(sizes)], algo[min(sizes)]}
    out: dict[int, str] = {}
    for s in sorted(sizes):
        if algo[s] not in connected:
            connected.add(algo[s])
            out[s] = algo[s]
    return out
