"""A live uneven all_to_all_single (an MoE token dispatch, skewed to one expert) runs as NCCL runs it: one group of
sends and receives on the 8-rank communicator (nccl/p2p_group.py), not 56 lone send/recvs on 2-rank ones.

8 H100s, --phantom. Rank s sends rank d 16 x (1 + (s + 2d) mod 3) rows of 4 KiB (64, 128 or 192 KiB) except rank 0,
which sends rank 1 4,096 rows (16 MiB). Closed form from NCCL's figures (tests/test_p2p_group.py's docstring): a
transfer of 64 KiB per channel up to 4 runs on 1-3 channels, the large one on 4 (32 p2p channels / 8 ranks);
the rounds' channels are distinct; with 7 peers in flight each way a channel moves half an NVLink (10.3 GB/s), so
every small transfer ends after 64 KiB / 10.3 GB/s, and the large one, then alone (one peer each way), moves on at a
link a channel (4 x 20.6 GB/s). Latency 11.8 us (Simple: ring base 6.8 + NVLink hop 5). Before, each pair ran as
a lone send/recv on its own 2-rank communicator (16 channels: the 16 MiB took 63.6 us, here 218.6)."""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.egraph import ExecGraph, replay_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.egraph.live import record_run
from phantora.launcher import RunConfig
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host

SCRIPT = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(me)
    def rows(src, dst):
        return 4096 if (src, dst) == (0, 1) else 16 * (1 + (src + 2 * dst) % 3)
    ins, outs = [rows(me, j) for j in range(n)], [rows(j, me) for j in range(n)]
    x = torch.ones(sum(ins), 1024, device="cuda")
    y = torch.empty(sum(outs), 1024, device="cuda")
    dist.barrier()
    torch.cuda.synchronize()
    dist.all_to_all_single(y, x, outs, ins)
    torch.cuda.synchronize()
    lists_out = [torch.empty(k, 1024, device="cuda") for k in outs]
    lists_in = [torch.ones(k, 1024, device="cuda") for k in ins]
    part = torch.ones(2048, 1024, device="cuda")  # 8 MiB a rank, gathered to rank 0
    parts = [torch.empty_like(part) for _ in range(n)] if me == 0 else None
    dist.barrier()  # every call issued at once on every rank (the replay starts a call's transfers together)
    torch.cuda.synchronize()
    dist.all_to_all(lists_out, lists_in)  # the same splits, as lists
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    dist.gather(part, parts, dst=0)
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""
LINK, LAT_NS, ROW = 20.6, 11_800, 4096


def rows(src: int, dst: int) -> int:
    return 4096 if (src, dst) == (0, 1) else 16 * (1 + (src + 2 * dst) % 3)


TOPO = dgx_host(8, gpu="h100")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], ExecGraph]:
    """The live run's transfer records (cosim.json) and its recording."""
    d = tmp_path_factory.mktemp("moe")
    script = d / "moe.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cfg = RunConfig(str(script), topology=TOPO, nproc=8, tensors="phantom", trace="none", timeout_s=120,
                    out_dir=str(d / "o"))  # fmt: skip
    _, graph = record_run(cfg, d / "g")
    recs = json.loads((d / "o" / "cosim.json").read_text())["collectives"]
    return [r for r in recs if r["kind"] != "all_reduce"], graph  # less the barrier


def test_a_skewed_all_to_all_single_is_one_nccl_group(recorded: tuple[list[dict], ExecGraph]) -> None:
    recs = [r for r in recorded[0] if r["name"].startswith("all_to_all#1@")]
    assert len(recs) == 56 and {r["kind"] for r in recs} == {"send_recv"}
    assert {tuple(r["comm"]) for r in recs} == {tuple(range(8))}  # on the group's communicator
    assert len({r["t_start"] for r in recs}) == 1  # one group launch, after the barrier
    t_small = 64 * 1024 / (0.5 * LINK)  # ns: every small transfer, 64 KiB a channel at half a link a channel
    for r in recs:
        src, dst = r["group"]
        nbytes = rows(src, dst) * ROW
        assert r["nbytes"] == nbytes
        took = r["end_ns"] - r["t_start"]
        if (src, dst) == (0, 1):
            expect = t_small + (nbytes - 4 * 0.5 * LINK * t_small) / (4 * LINK)
            assert (r["nccl"]["protocol"], r["nccl"]["channels"]) == ("Simple", 4)
        else:
            expect = t_small
            assert (r["nccl"]["protocol"], r["nccl"]["channels"]) == ("Simple", nbytes // (64 * 1024))
        assert took == pytest.approx(LAT_NS + expect, abs=2)
        assert r["nccl"]["model_time_us"] == pytest.approx((LAT_NS + expect) / 1e3, abs=1e-3)


def test_its_replay_and_chakra_export_rate_the_group_as_live(recorded: tuple[list[dict], ExecGraph], tmp_path) -> None:
    """The recording holds the transfers as P2P nodes with the call's tag (nothing new stored); the replay finds the
    call's group again (egraph/p2p_calls.py) and each transfer ends when it did live, also after a Chakra round trip
    (before: each replayed alone on its pair's communicator, the 16 MiB in 63.6 us)."""
    recs, graph = recorded
    live = {tuple(r["group"]): r["end_ns"] for r in recs}
    export_chakra(graph, tmp_path / "chakra")
    for g in (graph, read_chakra(tmp_path / "chakra")):
        res = replay_graph(g, TOPO, FlowSimulator(TOPO))
        rank = {TOPO.node_of_rank(r): r for r in range(8)}
        ends: dict[tuple[int, int], int] = {}
        for c in res.completions:
            if "/p2p" in c.tag:
                pair = (rank[c.src], rank[c.dst])
                ends[pair] = max(ends.get(pair, 0), c.end_ns)
        assert ends == live


def test_the_lists_run_as_the_single_and_a_gather_s_root_shares_its_receive_side(
    recorded: tuple[list[dict], ExecGraph],
) -> None:
    """The same splits as all_to_all's lists take the same time a pair; a gather of 8 MiB a rank to rank 0 takes
    7 x 8 MiB over the root's 28 receive channels (7 rounds x 4, distinct) at half a link, plus 11.8 us."""
    recs = recorded[0]
    took = {(r["name"].split("@")[0], *r["group"]): r["end_ns"] - r["t_start"] for r in recs}
    first, second = sorted({k[0] for k in took if k[0].startswith("all_to_all#")}, key=lambda x: int(x.split("#")[1]))
    single = {k[1:]: v for k, v in took.items() if k[0] == first}
    lists = {k[1:]: v for k, v in took.items() if k[0] == second}
    assert len(single) == 56 and lists == single
    gather = [r for r in recs if r["name"].startswith("gather#")]
    assert sorted(tuple(r["group"]) for r in gather) == [(j, 0) for j in range(1, 8)]
    for r in gather:
        assert r["end_ns"] - r["t_start"] == pytest.approx(LAT_NS + 7 * 8 * 2**20 / (28 * 0.5 * LINK), abs=2)
        assert (r["nccl"]["protocol"], r["nccl"]["channels"]) == ("Simple", 4)
