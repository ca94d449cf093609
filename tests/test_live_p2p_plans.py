"""NCCL 2.22+'s plan budget on a live group's p2p operations (a batch_isend_irecv, a coalescing block; enqueue.cc
`scheduleP2pTasksToPlan`, v2.22.3-1 .. v2.30.7-1): each rank plans its own operations pass by pass, round by round,
and cuts them where the kernel's 4 KiB arguments run out (nccl/p2p_plans.py `pair_plans`). A ring of 8 B sends on 8
H100s (each to the next rank, so each rank sends to its round-1 peer and receives from its round-1 peer: one
operation a pass, on one channel, a new work batch each) holds 254 - 32 + 1 = 223 operations a plan (254 batches in
the arguments past their header, room for 32 more kept: the peer's most channels). Operation k then runs in plan
k // 223: it ends after (k // 223 + 1) launches (LL's base latency 6.6 us), k + 1 LL steps over NVLink (0.6 us) and
k + 1 operations' bytes, as nccl-tests' sendrecv_perf -m N prices its group (tests/test_nccl_p2p_plans.py)."""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.launch_group import LaunchGroup
from phantora.collectives.nccl import choose, comm_hosts, settings
from phantora.collectives.nccl.p2p import transfer_layout
from phantora.collectives.nccl.p2p_group import plan_parts
from phantora.collectives.nccl.p2p_plans import pair_plans
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.settings import nccl_env
from phantora.egraph import replay_graph
from phantora.egraph.live import record_run
from phantora.launcher import RunConfig
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host
from phantora.topology.loader import load_topology

TOPO = dgx_host(gpu="h100")
COMM = tuple(range(8))
RING = tuple((r, (r + 1) % 8) for r in COMM)
LAUNCH_US, STEP_US = 6.6, 0.6  # NCCL's LL ring base latency and an LL step over NVLink (tuning.cc)
PER_PLAN = (4096 - 32) // 16 - 32 + 1  # 223


def _opts(version: str) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env({"PHANTORA_NCCL_VERSION": version}))


def _ring(ops: int) -> LaunchGroup:
    later = tuple((a, b, k, 0, 8) for a, b in sorted(RING) for k in range(1, ops))
    return LaunchGroup(tuple(sorted(RING)), (0,) * 8, (8,) * 8, later=later)


def _end_us(g: LaunchGroup, k: int, version: str = "2.27.3") -> float:
    """Operation k of pair 0 -> 1's end (us after the group's start at 0)."""
    coll = Collective("send_recv", (0, 1), 8, "uint8", comm=COMM, launch=g, launch_op=k)
    got = choose(coll, TOPO, _opts(version))
    assert got is not None
    return got.time_us


def _bytes_us() -> float:
    """One 8 B operation's bytes in the ring's pass (its time less a launch and a step)."""
    return _end_us(_ring(1), 0) - LAUNCH_US - STEP_US


def test_each_rank_cuts_its_ring_operations_every_223() -> None:
    chans = {(a, b): ((16,),) * 500 for a, b in RING}  # one channel an operation, as 8 B's
    plans = pair_plans(COMM, chans, 32)
    assert plans[(0, 1)] == tuple(k // PER_PLAN for k in range(500))
    assert set(plans.values()) == {plans[(0, 1)]}  # every rank alike: its send and receive share a round


def test_a_live_ring_past_the_budget_pays_a_launch_a_plan() -> None:
    """500 operations a pair: plans of 223, 223 and 54; the first of the second plan waits for a second launch."""
    g, b = _ring(500), _bytes_us()
    for k in (0, PER_PLAN - 1, PER_PLAN, 2 * PER_PLAN, 499):
        want = (k // PER_PLAN + 1) * LAUNCH_US + (k + 1) * (STEP_US + b)
        assert _end_us(g, k) == pytest.approx(want, abs=0.002), k


def test_a_live_ring_within_the_budget_and_before_2_22_is_one_plan() -> None:
    """200 operations a pair fit one plan (2.27); before 2.22 (2.21.5) NCCL's budget is not restated: one launch."""
    b = _bytes_us()
    assert _end_us(_ring(200), 199) == pytest.approx(LAUNCH_US + 200 * (STEP_US + b), abs=0.002)
    assert _end_us(_ring(300), 299, "2.21.5") == pytest.approx(LAUNCH_US + 300 * (STEP_US + b), abs=0.002)


def _rail64() -> tuple[tuple[int, ...], dict, int]:
    """All-to-all's pairs on 64 ranks of rail128 (8 hosts of 8), 1 MiB a peer: each pair's channels, as NCCL cuts
    them on its sender, and a peer's most channels."""
    topo = load_topology("topologies/rail128.toml")
    comm = tuple(range(64))
    st = settings(_opts("2.27.3"))
    on = platform_of(topo, comm, st)
    hosts = comm_hosts(topo, comm, st)
    parts = plan_parts(on, st, hosts, {(s, d): 1 << 20 for s in comm for d in comm})
    return hosts, {q: part.channels for q, part in parts.items()}, transfer_layout(on, st).most


def test_one_all_to_all_on_64_ranks_of_rail128_is_one_plan_on_every_rank() -> None:
    """64 operations a rank (one a round, itself too), each on at most nChannelsMax = 2 channels across nodes: at
    most 128 batches, 128 + 2 <= 254, and 64 x 48 B of works within half the 1 MiB work FIFO, so one plan at any
    size. 16 such all-to-alls in one group (alltoall_perf -m 16): 2048 works, at most 8 a batch, so at least 256
    batches: more than one plan, cut on every rank alike."""
    hosts, chans, most = _rail64()
    assert most == 2 and max(len(c) for c in chans.values()) == 2
    one = pair_plans(hosts, {q: (c,) for q, c in chans.items()}, most)
    assert {k for ks in one.values() for k in ks} == {0}
    sixteen = pair_plans(hosts, {q: (c,) * 16 for q, c in chans.items()}, most)
    last = {r: max(ks[-1] for q, ks in sixteen.items() if q[0] == r) for r in range(64)}
    assert len(set(last.values())) == 1 and last[0] >= 1


LIVE = """
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
n, me = dist.get_world_size(), dist.get_rank()
torch.cuda.set_device(me)
xs = [torch.full((2,), float(me), device="cuda") for _ in range(300)]  # 8 B each
ys = [torch.empty(2, device="cuda") for _ in range(300)]
dist.barrier()
torch.cuda.synchronize()
ops = [dist.P2POp(dist.isend, x, (me + 1) % n) for x in xs] + [dist.P2POp(dist.irecv, y, (me - 1) % n) for y in ys]
for q in dist.batch_isend_irecv(ops):
    q.wait()
torch.cuda.synchronize()
dist.barrier()
dist.destroy_process_group()
"""


def test_a_rank_launches_a_kernel_for_each_plan_of_its_own_operations() -> None:
    """Rank 0 of the 8-H100 ring (2.27) sending n x 8 B to rank 1 and receiving n from rank 7: one operation a pass,
    223 a plan, so ceil(n / 223) kernels its host launches at ncclGroupEnd (nccl/live_launches.py); one plan before
    2.22, under the ideal model, and for one operation a peer (as the coordinator cuts)."""
    from phantora.collectives.nccl.live_launches import rank_launches

    def launches(n: int, version: str = "2.27.3", **kw: str) -> int:
        ops = [(1, 8, True)] * n + [(7, 8, False)] * n
        return rank_launches(TOPO, _opts(version), kw, 0, COMM, ops)

    assert [launches(n) for n in (1, PER_PLAN, PER_PLAN + 1, 1000)] == [1, 1, 2, -(-1000 // PER_PLAN)]
    assert launches(1000, "2.21.5") == 1
    assert launches(1000, model="ideal") == 1
    assert rank_launches(TOPO, _opts("2.27.3"), {}, 0, COMM, [(p, 8, True) for p in range(1, 8)]) == 1


@pytest.mark.slow
def test_a_live_batch_past_the_budget_and_its_replay_pay_a_launch_a_plan(tmp_path) -> None:
    """A live batch_isend_irecv of 300 x 8 B to the next rank on 4 H100s (the default NCCL, 2.30; a peer's most
    channels 32 there too): operations 0 - 222 in the first plan, 223 - 299 in the second, so operation k ends
    (k // 223 + 1) launches, k + 1 steps and k + 1 operations' bytes after the batch's start, live and in the
    recording's flow replay. Each rank's host launches both plans' kernels at the batch's ncclGroupEnd: its
    launches are the two barriers' and the batch's (h each, host_launch.py's fallback batches) and 4.26 us for the
    second plan (one launch a group before). Slow: a live 4-rank run."""
    from phantora.collectives.nccl.p2p import transfer_layout
    from phantora.collectives.nccl.platform import platform_of

    topo = dgx_host(4, gpu="h100")
    st = settings(AlgoOptions())
    assert transfer_layout(platform_of(topo, (0, 1, 2, 3), st), st).most == 32
    script = tmp_path / "batch.py"
    script.write_text(textwrap.dedent(LIVE))
    cfg = RunConfig(str(script), topology=topo, nproc=4, tensors="phantom", trace="none", timeout_s=300,
                    out_dir=str(tmp_path / "o"))  # fmt: skip
    _, graph = record_run(cfg, tmp_path / "g")
    recs = [
        r for r in json.loads((tmp_path / "o" / "cosim.json").read_text())["collectives"] if r["kind"] == "send_recv"
    ]
    assert len(recs) == 4 * 300
    ring = tuple((r, (r + 1) % 4) for r in range(4))
    lone = Collective("send_recv", (0, 1), 8, "fp32", None, (0, 1, 2, 3), ring)
    got = choose(lone, topo, AlgoOptions())
    assert got is not None
    b = got.time_us - LAUNCH_US - STEP_US
    for a, c in ring:
        mine = sorted((r for r in recs if tuple(r["group"]) == (a, c)), key=lambda r: r["end_ns"])
        t0 = mine[0]["t_start"]
        for k in (0, PER_PLAN - 1, PER_PLAN, 299):
            want = (k // PER_PLAN + 1) * LAUNCH_US + (k + 1) * (STEP_US + b)
            assert (mine[k]["end_ns"] - t0) / 1000 == pytest.approx(want, abs=0.01), (a, c, k)
    live = sorted((r["name"].split("@")[0], *r["group"], r["end_ns"]) for r in recs)
    res = replay_graph(graph, topo, FlowSimulator(topo))
    ends: dict[tuple[str, int, int], int] = {}
    for done in res.completions:
        if "/p2p" in done.tag:
            name, pair = done.tag.split("/")[0].split("@")
            src, dst = (int(x) for x in pair.split(">"))
            ends[(name, src, dst)] = max(ends.get((name, src, dst), 0), done.end_ns)
    assert sorted((*k, e) for k, e in ends.items()) == live
    from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, HOST_LAUNCH_US, host_launch_us

    h = round(host_launch_us(DEFAULT_BATCHES) * 1000)
    for rank in json.loads((tmp_path / "o" / "results.json").read_text())["ranks"]:
        got = rank["nccl_host_launch"]
        assert (got["launches"], got["host_ns"]) == (4, 3 * h + round(HOST_LAUNCH_US * 1000)), rank["rank"]
