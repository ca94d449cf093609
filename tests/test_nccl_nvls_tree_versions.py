"""Which NCCL versions rate NVLS-Tree by the 2.22-2.27 rule (old_tuners.nvls_tree_rating), read off tuning.cc: the
bandwidth nChannels x min(bwIntra, bwInter / 2 beyond two nodes) x 5/6 and the latency hwLat[NVLINK][NVLS_TREE] +
2 log2(nodes) x hwLat[NET][NVLS_TREE] hold from v2.19.1-1 to v2.27.7-1, with hwLat[NVLINK][NVLS_TREE][SIMPLE] 25 µs
from v2.21.5-1 and 23 in v2.19.1-1 / v2.20.5-1 (hwLat[NET] 14 through v2.28.7-1). v2.18.x rate it otherwise
(23 + 2 (4 - 1) x 19 µs, 8 x 48 x 0.7 x 4 / 6 GB/s); v2.28.3-1 brought 2.30's bandwidth (8 x min(40 x 0.85 x 7/8
x 2, 48, 45.5) x 32 / 62) with the 14 µs hop until v2.28.7-1, 20.9 from v2.28.9-1 (2.30's model: None). On 4 H100
hosts (8 channels, bwIntra 40, bwInter 48 GB/s): 8 x 24 x 5/6 = 160 GB/s, latency 25 (or 23) + 2 x 2 x 14 µs."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl import old_tuners, tuning
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.published import machine, tables

VM4 = "h100_32gpu_4node_ndr400_all_reduce_nccltests309_vm"


@pytest.mark.parametrize(
    ("version", "rating"),
    [((2, 18), (137.0, 179.2)), ((2, 19), (79.0, 160.0)), ((2, 20), (79.0, 160.0)), ((2, 21), (81.0, 160.0)),
     ((2, 26), (81.0, 160.0)), ((2, 27), (81.0, 160.0)), ((2, 28, 7), (81.0, 8 * 45.5 * 32 / 62)), ((2, 28), None)],
)  # fmt: skip
def test_nvls_tree_rating_by_version(version: tuple[int, ...], rating: tuple[float, float] | None) -> None:
    table = next(t for t in tables() if t.name == VM4)
    p = platform_of(machine(table), tuple(range(table.gpus)))
    g = tuning.nvls_graph(p)
    assert (g.nchannels, g.bw_intra, g.bw_inter) == (8, 40.0, 48.0)
    got = old_tuners.nvls_tree_rating(version, p, g.nchannels, g.bw_intra, g.bw_inter)
    assert got == (None if rating is None else pytest.approx(rating))
