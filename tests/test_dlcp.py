"""DLCP end to end: lost flow bytes of a ring all-reduce map to tensor bytes (closed form), and in a real-mode run
with gloo-backed ranks the received tensor holds zeros exactly at the reported ranges and the true sum elsewhere.

The closed forms take the ideal decomposition's flow sizes (`model="ideal"`: payload bytes on the wire); under the NCCL
model, the default, only Simple-protocol rings are mapped, and they map exactly as the ideal ones do.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from phantora.collectives import decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.collectives.traffic import (
    class_by_layer,
    class_by_size,
    lossless_reason,
    lost_ranges,
    merge,
    ring_lost_ranges,
    supports_loss,
)
from phantora.launcher import RunConfig, launch
from phantora.netsim.cli_config import engine_spec_from_flags
from phantora.topology.generators import leaf_spine


def test_layer_and_size_classes() -> None:
    assert [class_by_layer(i, 7) for i in range(7)] == [7, 6, 5, 4, 3, 2, 1]  # the last issued is layer 0
    assert class_by_layer(0, 0) == 3 and class_by_layer(9, 7) == 3  # no count yet, or past it: the default
    assert [class_by_size(b) for b in (1, 64 << 10, 256 << 10, 1 << 20, 64 << 20, 1 << 40)] == [1, 1, 2, 3, 6, 7]


def test_merge_joins_touching_ranges() -> None:
    assert merge([(10, 5), (0, 4), (4, 2), (14, 3)]) == [(0, 6), (10, 7)]


def test_lost_bytes_of_a_coarse_ring_all_reduce_map_to_slices() -> None:
    """4 ranks, 1 channel, 4000 bytes: slices of 1000. Ring position i's flow carries, in step order, slices
    (i-1, i-2, i-3) (reduce-scatter) then (i, i-1, i-2) (all-gather), 1000 bytes each: the ideal decomposition,
    and NCCL's ring with the Simple protocol (the data on the wire), which must map identically."""
    topo = leaf_spine(1, 4, 0, name="star4")
    coll = Collective("all_reduce", (0, 1, 2, 3), 4000, "fp32")
    for opts in (AlgoOptions(channels=1, model="ideal"), AlgoOptions(channels=1, algorithm="ring", protocol="Simple")):
        assert supports_loss(coll, topo, opts), opts
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
    # NCCL's LL ring: a flow is 16-byte lines of 8 data bytes; lost wire bytes 1000..2999 of position 1's flow
    # touch lines 62..187, data bytes 496..1503: the same slices as above, widened to whole lines.
    ll = AlgoOptions(channels=1, algorithm="ring", protocol="LL")
    assert supports_loss(coll, topo, ll)
    assert [f.size for f in decompose(coll, topo, ll, first_flow_id=100).flows] == [12000] * 4
    assert lost_ranges(coll, topo, ll, 100, {101: [(1000, 2000)]}) == {r: [(496, 504), (3000, 504)] for r in range(4)}
    # NCCL's own choice for so small a call is a tree here: not mapped, it stays lossless.
    assert not supports_loss(coll, topo, AlgoOptions(channels=1))


def test_chunked_ring_maps_each_chunk() -> None:
    topo = leaf_spine(1, 2, 0, name="star2")
    coll = Collective("all_reduce", (0, 1), 4000, "fp32")
    opts = AlgoOptions(channels=1, granularity="chunked", chunk_bytes=1000, model="ideal")
    dag = decompose(coll, topo, opts, first_flow_id=0)
    # 2 ranks: slices of 2000, 2 chunks each, in 2 passes of 2 steps (ids 0-3: chunk 0, ids 4-7: chunk 1; two
    # positions a step). Flow 4: pass 1, step 0 (reduce-scatter), position 0 sends slice 1's chunk 1 (3000-3999).
    assert [f.size for f in dag.flows] == [1000] * 8
    assert ring_lost_ranges(coll, topo, opts, 0, {4: [(0, 1000)]}) == {0: [(3000, 1000)], 1: [(3000, 1000)]}
    # flow 2: pass 0, step 1 (all-gather), position 0 sends its slice 0 chunk 0 to position 1 only.
    assert ring_lost_ranges(coll, topo, opts, 0, {2: [(0, 10)]}) == {1: [(0, 10)]}


def test_lost_bytes_of_a_coarse_ring_reduce_scatter_map_to_the_owner_shard() -> None:
    """4 ranks, 1 channel, 16000 bytes in (4000 out per rank). Ring position i's flow carries the partial sums of
    slices (i-1, i-2, i-3) for steps 0..2; slice j ends at position j, whose output shard is slice j."""
    topo = leaf_spine(1, 4, 0, name="star4")
    coll = Collective("reduce_scatter", (0, 1, 2, 3), 16000, "fp32")
    opts = AlgoOptions(channels=1, model="ideal")
    dag = decompose(coll, topo, opts, first_flow_id=100)
    assert [f.size for f in dag.flows] == [12000] * 4
    # Flow of position 1, bytes 500..1499: step 0 carries slice 0 -> rank 0's output bytes 500..1499 only.
    assert lost_ranges(coll, topo, opts, 100, {101: [(500, 1000)]}) == {0: [(500, 1000)]}
    # Bytes 7500..8499 straddle step 1 (slice 3, its last 500 bytes) and step 2 (slice 2, its first 500).
    assert lost_ranges(coll, topo, opts, 100, {101: [(7500, 1000)]}) == {3: [(3500, 500)], 2: [(0, 500)]}
    # Position 3's last step carries slice 0 again (its partial sum of 3 ranks): rank 0 again, merged.
    got = lost_ranges(coll, topo, opts, 100, {101: [(0, 100)], 103: [(8000 + 100, 100)]})
    assert got == {0: [(0, 200)]}


def test_reduce_scatter_channels_share_every_shard() -> None:
    """2 channels over 4 ranks, 16000 bytes: each channel carries 2000 bytes of every 4000-byte output shard,
    channel 0 the first half, channel 1 the second; rank r is ring position r (one GPU per host)."""
    topo = leaf_spine(1, 4, 0, name="star4")
    coll = Collective("reduce_scatter", (0, 1, 2, 3), 16000, "fp32")
    opts = AlgoOptions(channels=2, model="ideal")  # the slice mapping (NCCL's LL lines: test above)
    # Channel 1's position 2 (flow id 6): step 0 sends slice 1, bytes 10..19 -> rank 1, second half of its shard.
    assert lost_ranges(coll, topo, opts, 0, {6: [(10, 10)]}) == {1: [(2010, 10)]}
    assert lost_ranges(coll, topo, opts, 0, {2: [(10, 10)]}) == {1: [(10, 10)]}


def test_chunked_reduce_scatter_and_uneven_or_other_cases_stay_lossless() -> None:
    topo = leaf_spine(1, 2, 0, name="star2")
    coll = Collective("reduce_scatter", (0, 1), 4000, "fp32")
    opts = AlgoOptions(channels=1, granularity="chunked", chunk_bytes=1000, model="ideal")
    # 2 ranks, one step, two passes: position 0 sends slice 1 (rank 1's shard) in chunks 0 (flow 0) and 1 (flow 2).
    assert lost_ranges(coll, topo, opts, 0, {2: [(0, 8)]}) == {1: [(1000, 8)]}
    uneven = Collective("reduce_scatter", (0, 1), 4002, "fp32")
    assert supports_loss(uneven, topo, AlgoOptions(channels=1, model="ideal"))
    assert not supports_loss(uneven, topo, AlgoOptions(channels=2, model="ideal"))  # 2001 per channel, odd / 2
    assert "evenly" in (lossless_reason(uneven, topo, AlgoOptions(channels=2, model="ideal")) or "")
    # NCCL model, its ring: the same rule on its channel shares. NCCL 2.19 strides 2 channels evenly (2001 each);
    # 2.20-2.21 put the count (2,001 B) on one channel (a part is aligned up to 4,096 B under Simple), and 2.22+
    # deals it in cells of at least 512 B of traffic: 2.30's 16 KiB cell holds it on one channel; one channel's
    # share then splits evenly over the 2 ranks.
    old = AlgoOptions(
        channels=2, algorithm="ring", protocol="Simple", nccl_env=nccl_env({"PHANTORA_NCCL_VERSION": "2.19"})
    )
    assert supports_loss(uneven, topo, dataclasses.replace(old, channels=1))
    assert "evenly" in (lossless_reason(uneven, topo, old) or "")
    host = dataclasses.replace(old, nccl_env=nccl_env({"PHANTORA_NCCL_VERSION": "2.21"}))
    assert supports_loss(uneven, topo, host)
    assert supports_loss(uneven, topo, AlgoOptions(channels=2, algorithm="ring", protocol="Simple"))
    assert supports_loss(uneven, topo, AlgoOptions(channels=1, protocol="LL"))  # NCCL's LL lines are mapped too
    tree = Collective("all_reduce", (0, 1), 4000, "fp32")
    assert "tree" in (lossless_reason(tree, topo, AlgoOptions(algorithm="tree")) or "")
    gather = Collective("all_gather", (0, 1), 4000, "fp32")
    assert "never" in (lossless_reason(gather, topo, AlgoOptions()) or "")


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
def test_real_mode_zeros_exactly_the_lost_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 ranks, two per leaf, 25G uplinks (4:1): the ring's leaf-crossing flows queue at the leaves, whose
    switches trim loss-tolerant packets past 8 KB. NCCL's ring with the Simple protocol (its own choice for 4 MiB
    is LL128, whose lines are not mapped to tensor bytes: the call would stay lossless)."""
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    script = tmp_path / "dlcp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="25Gbps", latency="1us", name="twoleaf4")
    ns3 = engine_spec_from_flags("ns3", sets=["trim_bytes=8000"])
    cfg = RunConfig(str(script), [str(tmp_path / "out")], topo, engine=ns3,
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


RS_SCRIPT = """
    import sys, numpy as np, torch, torch.distributed as dist
    import phantora.runtime as pr
    from phantora.runtime import session
    dist.init_process_group()
    r, w, n = dist.get_rank(), dist.get_world_size(), 1 << 18
    x = torch.arange(w * n, dtype=torch.float32) + 1 + r
    out = torch.empty(n, dtype=torch.float32)
    with pr.loss_tolerant(0.5):
        dist.reduce_scatter_tensor(out, x)
        lost = session.current().traffic.last_lost
        g = torch.empty(w * n, dtype=torch.float32)
        dist.all_gather_into_tensor(g, out)   # all-gather: never loss-tolerant
    ref = torch.empty(n, dtype=torch.float32)
    dist.reduce_scatter_tensor(ref, x)   # outside the context: lossless
    ranges = np.array(lost, dtype=np.int64).reshape(-1, 2)
    np.savez(sys.argv[1] + f".rank{r}.npz", out=out.numpy(), ref=ref.numpy(), g=g.numpy(), lost=ranges)
    pr.step()
"""


@pytest.mark.ns3
@pytest.mark.slow
def test_real_mode_reduce_scatter_zeros_exactly_the_lost_ranges(tmp_path: Path) -> None:
    """FSDP's gradient collective: a loss-tolerant ring reduce-scatter, 4 gloo ranks on the 4:1 two-leaf fabric.
    Each output shard holds zeros exactly at the ranges its rank was told, the exact reduced value elsewhere;
    the all-gather of the shards in the same context stays lossless."""
    script = tmp_path / "rs.py"
    script.write_text(textwrap.dedent(RS_SCRIPT))
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="25Gbps", latency="1us", name="twoleaf4")
    ns3 = engine_spec_from_flags("ns3", sets=["trim_bytes=8000"])
    cfg = RunConfig(str(script), [str(tmp_path / "out")], topo, engine=ns3,
                    nproc=4, trace="none", timeout_s=300, out_dir=tmp_path / "run")  # fmt: skip
    launch(cfg)
    n, w = 1 << 18, 4
    full = 4 * (np.arange(w * n, dtype=np.float64) + 1) + 6  # sum over r of (i + 1 + r)
    outs, zeroed = [], 0
    for r in range(w):
        got = np.load(tmp_path / f"out.rank{r}.npz")
        want = full[r * n : (r + 1) * n].astype(np.float32)
        out, lost = got["out"], got["lost"]
        assert np.array_equal(got["ref"], want), r  # the lossless reduce-scatter is exact
        mask = np.zeros(n, dtype=bool)
        for off, length in lost:
            assert off % 4 == 0 and length % 4 == 0 and off + length <= 4 * n
            mask[off // 4 : (off + length) // 4] = True
        assert (out[mask] == 0).all() and np.array_equal(out[~mask], want[~mask]), r
        outs.append(out)
        zeroed += int(mask.sum()) * 4
    for r in range(w):  # every rank's all-gather holds every rank's shard as that rank has it, zeros included
        assert np.array_equal(np.load(tmp_path / f"out.rank{r}.npz")["g"], np.concatenate(outs)), r
    assert zeroed > 0  # the leaf-crossing flows were trimmed
    cosim = json.loads((tmp_path / "run" / "cosim.json").read_text())
    colls = cosim["collectives"]
    rs = [c for c in colls if c["kind"] == "reduce_scatter" and "lost_bytes" in c]
    assert len(rs) == 1 and 0 < rs[0]["lost_bytes"] <= 0.5 * sum(3 * n * 4 for _ in range(w))  # <= bound x bytes
    assert zeroed <= rs[0]["lost_bytes"]  # a lost flow byte is a byte of one rank's shard (zeroed once)
    ag = [c for c in colls if c["kind"] == "all_gather"]
    assert ag and all(c.get("kept_lossless") == "all_gather is never loss-tolerant" for c in ag)
    assert cosim["engine_stats"]["trimmed_bytes"] >= rs[0]["lost_bytes"]
