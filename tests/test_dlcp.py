"""DLCP end to end: lost flow bytes of a ring all-reduce map to tensor bytes (closed form), and in a real-mode run
with gloo-backed ranks the received tensor holds zeros exactly at the reported ranges and the true sum elsewhere."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from phantora.collectives import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.collectives.traffic import class_by_layer, class_by_size, merge, ring_lost_ranges
from phantora.launcher import RunConfig, launch
from phantora.topology.generators import leaf_spine


def test_layer_and_size_classes() -> None:
    assert [class_by_layer(i, 7) for i in range(7)] == [7, 6, 5, 4, 3, 2, 1]  # the last issued is layer 0
    assert class_by_layer(0, 0) == 3 and class_by_layer(9, 7) == 3  # no count yet, or past it: the default
    assert [class_by_size(b) for b in (1, 64 << 10, 256 << 10, 1 << 20, 64 << 20, 1 << 40)] == [1, 1, 2, 3, 6, 7]


def test_merge_joins_touching_ranges() -> None:
    assert merge([(10, 5), (0, 4), (4, 2), (14, 3)]) == [(0, 6), (10, 7)]


def test_lost_bytes_of_a_coarse_ring_all_reduce_map_to_slices() -> None:
    """4 ranks, 1 channel, 4000 bytes: slices of 1000. Ring position i's flow carries, in step order, slices
    (i-1, i-2, i-3) (reduce-scatter) then (i, i-1, i-2) (all-gather), 1000 bytes each."""
    topo = leaf_spine(1, 4, 0, name="star4")
    coll = Collective("all_reduce", (0, 1, 2, 3), 4000, "fp32")
    opts = AlgoOptions(channels=1)
    dag = decompose(coll, topo, opts, first_flow_id=100)
    assert [f.size for f in dag.flows] == [6000] * 4
    # Flow of position 1 (id 101): bytes 500..1499 = the second half of slice 0 and the first half of slice 3,
    # both in the reduce-scatter: every rank zeroes them.
    got = ring_lost_ranges(coll, topo, opts, 100, {101: [(500, 1000)]})
    assert got == {r: [(500, 500), (3000, 500)] for r in range(4)}
    # Flow of position 1, all-gather step 3 (bytes 3000..3999 = slice 1): positions 2, 3 and 0 receive it.
    got = ring_lost_ranges(coll, topo, opts, 100, {101: [(3000, 1000)]})
    assert got == {2: [(1000, 1000)], 3: [(1000, 1000)], 0: [(1000, 1000)]}
    # The last all-gather step (bytes 5000..5999, slice 3 at step 5) reaches position 2 only.
    assert ring_lost_ranges(coll, topo, opts, 100, {101: [(5000, 1000)]}) == {2: [(3000, 1000)]}


def test_chunked_ring_maps_each_chunk() -> None:
    topo = leaf_spine(1, 2, 0, name="star2")
    coll = Collective("all_reduce", (0, 1), 4000, "fp32")
    opts = AlgoOptions(channels=1, granularity="chunked", chunk_bytes=1000)
    dag = decompose(coll, topo, opts, first_flow_id=0)
    # 2 ranks: slices of 2000, 2 chunks each; step 0 (reduce-scatter): position 0 sends slice 1, chunks 0, 1.
    assert [f.size for f in dag.flows] == [1000] * 8
    assert ring_lost_ranges(coll, topo, opts, 0, {1: [(0, 1000)]}) == {0: [(3000, 1000)], 1: [(3000, 1000)]}
    # step 1 (all-gather): flow 4 is position 0 sending its slice 0 chunk 0 to position 1 only.
    assert ring_lost_ranges(coll, topo, opts, 0, {4: [(0, 10)]}) == {1: [(0, 10)]}


SCRIPT = """
    import json, sys, numpy as np, torch, torch.distributed as dist
    import phantora.runtime as pr
    from phantora.runtime import session
    dist.init_process_group()
    r, n = dist.get_rank(), 1 << 20
    x = torch.arange(n, dtype=torch.float32) + 1 + r
    with pr.loss_tolerant(0.5):
        dist.all_reduce(x)
    y = torch.arange(n, dtype=torch.float32) + 1
    dist.all_reduce(y)   # outside the context: lossless
    lost = session.current().traffic.last_lost
    ranges = np.array(lost, dtype=np.int64).reshape(-1, 2)
    np.savez(sys.argv[1] + f".rank{r}.npz", x=x.numpy(), y=y.numpy(), lost=ranges)
    pr.step()
"""


@pytest.mark.ns3
@pytest.mark.slow
def test_real_mode_zeros_exactly_the_lost_ranges(tmp_path: Path) -> None:
    """4 ranks, two per leaf, 25G uplinks (4:1): the ring's leaf-crossing flows queue at the leaves, whose
    switches trim loss-tolerant packets past 8 KB."""
    script = tmp_path / "dlcp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="25Gbps", latency="1us", name="twoleaf4")
    cfg = RunConfig(str(script), [str(tmp_path / "out")], topo, network="ns3", packet_set=["trim_bytes=8000"],
                    nproc=4, trace="none", timeout_s=300, out_dir=tmp_path / "run")  # fmt: skip
    rep = launch(cfg)
    n = 1 << 20
    base = np.arange(n, dtype=np.float64) + 1
    want = 4 * base + 6  # sum over r of (i + 1 + r)
    total_lost = 0
    for r in range(4):
        got = np.load(tmp_path / f"out.rank{r}.npz")
        x, lost = got["x"], got["lost"]
        mask = np.zeros(n, dtype=bool)
        for off, length in lost:
            assert off % 4 == 0 and length % 4 == 0  # 1000-byte packets of 4-byte floats stay aligned
            mask[off // 4 : (off + length) // 4] = True
        assert mask.any(), r  # the leaf-crossing flows were trimmed
        assert (x[mask] == 0).all() and np.array_equal(x[~mask], want[~mask].astype(np.float32)), r
        assert mask.sum() * 4 <= 0.5 * 4 * n * 2  # bounded: within the budget of the flows it came through
        assert np.array_equal(got["y"], (4 * base).astype(np.float32))  # the lossless all-reduce is exact
        total_lost += mask.sum() * 4
    # Per-step records: each rank's zeroed bytes; cosim.json: the trims by class and each collective's lost bytes.
    run = tmp_path / "run"
    per_rank = [json.loads((run / "steps" / f"rank{r}.jsonl").read_text().splitlines()[0]) for r in range(4)]
    assert sum(line["lost_bytes"] for line in per_rank) == total_lost
    cosim = json.loads((run / "cosim.json").read_text())
    stats = cosim["engine_stats"]
    assert stats["trimmed_bytes_class3"] == stats["trimmed_bytes"] > 0  # every trimmed packet was class 3
    lost_coll = [c["lost_bytes"] for c in cosim["collectives"] if "lost_bytes" in c]
    assert len(lost_coll) == 1 and 0 < lost_coll[0] <= stats["trimmed_bytes"]
    assert rep.summary is not None
