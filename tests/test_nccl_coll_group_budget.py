"""NCCL 2.22+'s plan budget: a group of collectives cut into plans, one kernel launch each, run one after another
(enqueue.cc `ncclLaunchPrepare`, `scheduleCollTasksToPlan`, `addWorkBatchToPlan`, `ncclTestBudget`, v2.22.3-1 to
v2.30.7-1). The kernel's arguments are 4 KiB (ncclMaxKernelArgsSize) with a 32-byte header, so 4,064 bytes of
16-byte work batches: 254. The expected cuts and times are worked out by hand in each docstring from NCCL's code.
"""

from __future__ import annotations

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.group_plans import group_plans
from phantora.collectives.nccl import coll_group
from tests.test_nccl_symmetric import H100, RANKS, opts

RING_LL = {"PHANTORA_NCCL_VERSION": "2.27.3", "NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
RING_LL_LAT_US = 15.0  # NCCL's Ring LL latency on one 8-GPU NVLink host (docs/collectives.md, -m 1 at 8 KiB)


def _sizes(plans: list[list[tuple[int, int, tuple[int, ...]]]]) -> list[int]:
    return [len(p) for p in plans]


@pytest.mark.parametrize("version", [(2, 22), (2, 27), (2, 30)])
def test_a_plan_holds_the_1017_tasks_its_guess_of_4_works_a_batch_allows(version):
    """Each plan first guesses the tasks it holds: task k is taken while its batches at 4 works each,
    16 x ceil(k / 4) bytes, fit the 4,096 - 32 bytes of the kernel's arguments: k <= 1016, so 1017 tasks (their
    works, 1017 x at most 144 bytes, are far inside half the 1 MiB work FIFO). 2000 small all-reduces on 24
    channels then take a plan of 1017 and one of 983 (their batches, about 1017 / 7 + 24, stay under 254)."""
    task = ("all_reduce", "LL", 8, 1, "k", False)
    got = coll_group.plans(version, 8, [task] * 2000, 24)
    assert _sizes(got) == [1017, 983]
    assert _sizes(coll_group.plans(version, 8, [task] * 1017, 24)) == [1017]
    assert _sizes(coll_group.plans(version, 8, [task] * 5000, 24)) == [1017] * 4 + [932]


def test_tasks_of_alternating_kernels_on_one_channel_fill_254_batches():
    """Tasks of two kernels in turn on one channel open a batch each (addWorkBatchToPlan: another funcId); a task
    is placed while the plan's batches plus its channels stay within 4,064 / 16 = 254: 254 tasks, then 46."""
    tasks = [("all_reduce", "LL", 8, 1, k % 2, False) for k in range(300)]
    assert _sizes(coll_group.plans((2, 27), 8, tasks, 1)) == [254, 46]
    same = [("all_reduce", "LL", 8, 1, 0, False)] * 300  # one kernel: 10 works (96 B) a batch, 30 batches
    assert _sizes(coll_group.plans((2, 27), 8, same, 1)) == [300]


def test_1030_calls_run_two_plans_one_after_another_each_with_its_latency():
    """-m 1030 of 8-byte Ring LL all-reduces on 8 H100s (2.27, 24 channels): one plan of 1017 calls, numPipeOps
    DIVUP(1017, 24) = 43, and one of 13 calls, numPipeOps 1: (43 + 1) x 15.0 us of latency, where one launch of
    all 1030 would count DIVUP(1030, 24) = 43. The bytes (8 KiB in all) add about 0.1 us. Both engines."""
    from tests.engine_pair import flow_and_ns3_end_ns

    group = Collective("all_reduce", RANKS, 8, "fp32", group_calls=1030)
    dag = decompose(group, H100, opts(**RING_LL))
    assert dag.choice is not None and dag.choice["plans"] == 2 and dag.choice["group_calls"] == 1030
    ends = flow_and_ns3_end_ns(H100, dag.flows)
    expected = (43 + 1) * RING_LL_LAT_US * 1000
    assert expected < ends["flow"] < expected + 200
    assert abs(ends["ns3"] - ends["flow"]) < 0.001 * ends["flow"]
    one = decompose(Collective("all_reduce", RANKS, 8, "fp32", group_calls=1017), H100, opts(**RING_LL))
    assert one.choice is not None and "plans" not in one.choice


def test_a_plan_cut_inside_the_second_aggregate_keeps_both_aggregates_choices():
    """1000 fp32 and 1000 bf16 8-byte all-reduces (2 aggregates, one per type): the first plan holds the 1000
    fp32 calls and 17 bf16 ones (its guess, 1017), the second the other 983 bf16 calls; each piece on its
    aggregate's choice, and the first plan's two pieces dealt as one plan (the bf16 ones from the channel the
    fp32 ones ended on)."""
    sizes = (8,) * 2000
    group = Collective(
        "all_reduce", RANKS, 16000, "fp32", group_sizes=sizes, group_dtypes=("fp32",) * 1000 + ("bf16",) * 1000
    )
    cut = group_plans(group, H100, opts(**RING_LL))
    assert cut is not None
    got = [[(p.dtype, len(p.group_sizes) or 1) for p, _, _ in plan] for plan in cut]
    assert got == [[("fp32", 1000), ("bf16", 17)], [("bf16", 983)]]
    assert cut[0][1][0].dealt_from == cut[0][0][0].dealt_from + len(cut[0][0][0].dealt_parts) - 1
    assert all(o.protocol == "LL" and o.algorithm == "ring" for plan in cut for _, o, _ in plan)


def test_a_pat_group_is_cut_into_plans_as_the_ring_is():
    """PAT (one GPU on each of two hosts, 2.27) is scheduled as the ring's and tree's tasks (collBins' first kind):
    1017 calls are one plan, 1018 two (1017 and 1), run one after another: the group ends at the 1017-call group's
    end plus a lone call's (refused before, past 1024)."""
    from phantora.netsim.flow import FlowSimulator
    from phantora.topology import load_topology

    topo = load_topology("testbed16")
    pat = opts(NCCL_ALGO="PAT", PHANTORA_NCCL_VERSION="2.27.3")

    def run(m: int) -> tuple[float, dict]:
        dag = decompose(Collective("all_gather", (0, 8), 1024, "bf16", group_calls=m), topo, pat)
        sim = FlowSimulator(topo)
        sim.submit(dag.flows, at=0)
        return max(c.end_ns for c in sim.drain()) / 1000, dag.choice or {}

    one, _ = run(1)
    full, got = run(1017)
    assert got["algorithm"] == "PAT" and "plans" not in got
    two, got = run(1018)
    assert got["algorithm"] == "PAT" and got["plans"] == 2
    assert two == pytest.approx(full + one, abs=0.002)


def test_more_than_1024_calls_run_before_2_22_in_one_launch_and_from_2_22_as_plans():
    """2.19 - 2.21 run 1025 calls as one launch while the work FIFO holds them (fifo_budget.py); 2.22+ cut them."""
    group = Collective("all_reduce", RANKS, 8, "fp32", group_calls=1025)
    got = decompose(group, H100, opts(PHANTORA_NCCL_VERSION="2.21.5")).choice
    assert got is not None and "plans" not in got
    dag = decompose(group, H100, opts(PHANTORA_NCCL_VERSION="2.22.3"))
    assert dag.choice is not None and dag.choice["plans"] == 2


LIVE_BLOCK = """
    import torch, torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    xs = [torch.full((8,), float(rank + 1), device=dev) for _ in range(1100)]

    def block():
        with _coalescing_manager(device=dev, async_ops=True) as cm:
            for x in xs:
                dist.all_reduce(x, async_op=True)
        cm.wait()

    block()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(2):
        block()
    end.record()
    torch.cuda.synchronize()
    print("RESULT", rank, start.elapsed_time(end) * 1000 / 2, float(xs[-1][0]), flush=True)
    dist.destroy_process_group()
"""


def _nccl_tests_group(tmp_path, capsys, m: int) -> tuple[float, dict]:
    """`all_reduce_perf -b 32 -e 32 -m m -G 1 --np 4` on 4 of 8 H100s (2.27): the group's time and choice."""
    import json

    from phantora.cli import main

    argv = ["nccl-tests", "all_reduce_perf", "-b", "32", "-e", "32", "-m", str(m), "-G", "1", "--np", "4", "-n", "2"]
    assert main([*argv, "--out", str(tmp_path / f"nt{m}")]) == 0
    capsys.readouterr()
    row = json.loads((tmp_path / f"nt{m}" / "results.json").read_text())["sizes"][0]
    return m * row["time_us"], row["choice"]


@pytest.mark.slow
def test_a_live_coalesced_call_of_1100_tensors_runs_nccls_two_plans(tmp_path, capsys, monkeypatch):
    """A `_coalescing_manager(device=...)` block of 1100 all-reduces of 32 bytes on 4 H100s (2.27), one coalesced
    call (refused before, past 1024): NCCL's plans of 1017 and 83 calls, one after another. The block takes what
    `all_reduce_perf -m 1100` prints for its group, and that is the one-plan group of 1017 calls plus one more
    Tree LL batch latency (DIVUP(DIVUP(83, 24), 10) = 1 of the first plan's DIVUP(DIVUP(1017, 24), 10) = 5) and
    83 calls' bytes. Its recording keeps the 1100 calls (type 14) and replays to the same time."""
    import textwrap

    from phantora.egraph import replay_graph
    from phantora.egraph.format import Coll
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig
    from phantora.netsim.flow import FlowSimulator
    from phantora.topology.generators import dgx_host

    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.27.3")
    group_us, choice = _nccl_tests_group(tmp_path, capsys, 1100)
    one_us, one = _nccl_tests_group(tmp_path, capsys, 1017)
    assert choice["plans"] == 2 and (choice["algorithm"], choice["protocol"]) == ("Tree", "LL")
    assert "plans" not in one
    batch_us = one["model_lat_us"] / 5
    assert group_us - one_us == pytest.approx(batch_us, abs=0.1)
    script = tmp_path / "block.py"
    script.write_text(textwrap.dedent(LIVE_BLOCK))
    topo = dgx_host(8, gpu="h100")
    cfg = RunConfig(str(script), topology=topo, nproc=4, trace="none", timeout_s=900, out_dir=tmp_path / "run")
    rep, graph = record_run(cfg, tmp_path / "graph")
    lines = [ln.split() for r in range(4) for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 4 and all(float(ln[3]) == 160.0 for ln in lines)  # 3 blocks: 1+2+3+4, then x 4, x 4
    assert all(float(ln[2]) == pytest.approx(group_us, rel=0.005) for ln in lines)
    colls = [n for p in graph.programs for n in p.nodes if isinstance(n, Coll) and n.kind == "all_reduce"]
    assert colls and all(len(n.group_sizes) == 1100 for n in colls)
    res = replay_graph(graph, topo, FlowSimulator(topo))
    busy = res.comm["all_reduce"]
    assert busy["busy_ns"] / busy["count"] / 1000 == pytest.approx(group_us, rel=0.005)
