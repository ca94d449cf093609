"""An all_to_all_single with splits is one NCCL group of transfers on every rank, whatever its own splits look like.

Each rank sees only its own splits (what it sends and receives). Before, a rank whose own were all equal posted an
ordinary all-to-all collective and the others transfers, so the call never met (the run hung, or was stopped as
deadlocked; a real MoE dispatch at a capacity limit does this: the capped rank's splits are all equal). NCCL runs
every case as the same group of sends and receives (ProcessGroupNCCL's all_to_all_single), and so does every rank
here.

4 H100s, --phantom. Rank 0 sends and receives 16 rows of 4 KiB (64 KiB) to and from each rank, itself included: its own
splits are all equal. Ranks 1-3 send each other 64, 128 or 192 KiB. Closed form (NCCL's figures,
tests/test_p2p_group.py's docstring): a transfer moves 64 KiB a channel on its own channels (distinct by round), Simple;
every GPU has its 3 peers in flight each way, so a channel moves half an NVLink (10.3 GB/s on an H100), and every
transfer ends after 64 KiB / 10.3 GB/s, plus NCCL's launch and one Simple step over NVLink (6.8 + 5 us).

Balanced splits give the ordinary all-to-all's result: on 16 ranks deduplicated to 8 (the default), the world's
all-to-all (whose ranks 0 and 8 one live rank stands for) is the collective itself, and an all-to-all on groups of 4
(one live rank each) is a group of transfers, each of which takes the collective's time where the group's ranks
issue it together (ranks 4-7 here; rank 0 leaves the barrier 4.1 us after ranks 1-3, whose pairs then start
without it, as NCCL's would).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from phantora.launcher import RunConfig, launch
from phantora.topology import dgx_host

MIXED = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(me)
    ROWS = {(1, 2): 32, (1, 3): 48, (2, 1): 16, (2, 3): 32, (3, 1): 48, (3, 2): 16}
    def rows(src, dst):
        return ROWS.get((src, dst), 16)  # rank 0's own part too (kept local): all its splits are 16
    ins, outs = [rows(me, j) for j in range(n)], [rows(j, me) for j in range(n)]
    x = torch.ones(sum(ins), 1024, device="cuda")
    y = torch.empty(sum(outs), 1024, device="cuda")
    dist.barrier()
    torch.cuda.synchronize()
    dist.all_to_all_single(y, x, outs, ins)
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""
ROWS = {(1, 2): 32, (1, 3): 48, (2, 1): 16, (2, 3): 32, (3, 1): 48, (3, 2): 16}
LINK, LAT_NS, ROW = 20.6, 11_800, 4096

BALANCED = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(me % 8)
    quads = [dist.new_group(list(range(i, i + 4))) for i in range(0, n, 4)]
    for group, k in ((None, n), (quads[me // 4], 4)):
        x = torch.ones(256 * k, 1024, device="cuda")
        y = torch.empty_like(x)
        for splits in (True, False):
            dist.barrier()
            torch.cuda.synchronize()
            if splits:
                dist.all_to_all_single(y, x, [256] * k, [256] * k, group=group)
            else:
                dist.all_to_all_single(y, x, group=group)
            torch.cuda.synchronize()
    dist.destroy_process_group()
"""

UNEVEN_WORLD = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(me % 8)
    ins, outs = [16 + (me + j) % 3 for j in range(n)], [16 + (j + me) % 3 for j in range(n)]
    x, y = torch.ones(sum(ins), 1024, device="cuda"), torch.empty(sum(outs), 1024, device="cuda")
    dist.all_to_all_single(y, x, outs, ins)
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


def _run(tmp_path: Path, script: str, **kw: object) -> list[dict]:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(script))
    cfg = RunConfig(str(path), tensors="phantom", trace="none", timeout_s=120, out_dir=str(tmp_path / "o"), **kw)
    launch(cfg)  # a hang is the run's timeout: a one-line error, not a stuck suite
    recs = json.loads((tmp_path / "o" / "cosim.json").read_text())["collectives"]
    return [r for r in recs if r["kind"] != "all_reduce"]  # less the barriers


def test_a_rank_with_equal_splits_beside_uneven_ones_runs_the_group(tmp_path: Path) -> None:
    recs = _run(tmp_path, MIXED, topology=dgx_host(4, gpu="h100"), nproc=4)
    assert {r["kind"] for r in recs} == {"send_recv"} and len(recs) == 12  # every pair, rank 0's too
    assert {tuple(r["comm"]) for r in recs} == {(0, 1, 2, 3)} and len({r["t_start"] for r in recs}) == 1
    each = LAT_NS + 64 * 1024 / (0.5 * LINK)  # ns: 64 KiB a channel at half a link a channel
    for r in recs:
        src, dst = r["group"]
        nbytes = ROWS.get((src, dst), 16) * ROW
        assert r["nbytes"] == nbytes
        assert (r["nccl"]["protocol"], r["nccl"]["channels"]) == ("Simple", nbytes // (64 * 1024))
        assert r["end_ns"] - r["t_start"] == pytest.approx(each, abs=2)


@pytest.mark.slow
def test_balanced_splits_give_the_all_to_all_with_rank_deduplication(tmp_path: Path) -> None:
    recs = _run(tmp_path, BALANCED, topology="testbed16", nproc=16, dedup="auto")
    world = [r["end_ns"] - r["t_start"] for r in recs if len(r["group"]) == 16]
    assert len(world) == 2 and world[0] == world[1]  # with splits (the collective: ranks 0 and 8 are one live rank)
    plain = [r for r in recs if r["kind"] == "all_to_all" and len(r["group"]) == 4]
    grouped = [r for r in recs if r["kind"] == "send_recv" and set(r["group"]) <= {4, 5, 6, 7}]
    assert len(plain) == 2 and len({r["end_ns"] - r["t_start"] for r in plain}) == 1
    assert len(grouped) == 12 and {r["t_start"] for r in grouped} == {max(r["t_start"] for r in grouped)}
    assert {r["end_ns"] - r["t_start"] for r in grouped} == {plain[0]["end_ns"] - plain[0]["t_start"]}


@pytest.mark.slow
def test_uneven_splits_on_a_group_one_live_rank_stands_twice_in_are_refused_in_one_line(tmp_path: Path) -> None:
    """16 ranks deduplicated to 8: ranks 0 and 8 are one live rank, so no transfer between them can run; uneven parts
    there are refused at the call, naming --dedup (even ones run as the collective, above)."""
    with pytest.raises(BridgeError, match=r"an all-to-all with uneven parts .* 8 live ranks\): run with --dedup off"):
        _run(tmp_path, UNEVEN_WORLD, topology="testbed16", nproc=16, dedup="auto")
