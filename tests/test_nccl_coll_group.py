"""Several legacy collectives in one NCCL group (nccl-tests' -m), against NCCL's scheduling rules restated by hand.

enqueue.cc (v2.19.4-1 to v2.30.7-1): a group's calls of one (function, reduction, type) are aggregated, the tuner
picks one algorithm and protocol for the aggregate on its summed bytes, and every call runs in the one plan (one
kernel launch), NCCL 2.22+ dealing the calls' traffic onto the channels one after another. The expected figures
below are worked out in each docstring from NCCL's code, not read back from phantora's.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.nccl import channel_split, coll_group
from phantora.collectives.nccl import tables as T
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts


def _end_us(coll: Collective, **env: str) -> tuple[float, dict]:
    dag = decompose(coll, H100, opts(**env))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000, dag.choice or {}


def test_small_calls_each_take_a_channel_of_their_own():
    """2.30, 4 all-reduces of 8 KiB on 8 ranks, Simple, the aggregate's nMaxChannels 1 of 24: traffic 2 B a byte,
    a cell 32 KiB / 2 = 16 KiB, each call counts max(32 KiB, 16 KiB) of traffic, so the plan's 128 KiB over
    min(4 x 1, 24) = 4 channels is a 32 KiB budget a channel. A call is one cell (8 KiB less than a cell) whose
    32 KiB of traffic fills its channel: the next call starts on the next channel."""
    got = coll_group.deal((2, 30), "all_reduce", "Simple", 8, [8 * KiB] * 4, 1, 24)
    assert got == [(c, (8 * KiB,)) for c in range(4)]


def test_two_large_calls_split_the_channels_and_share_one():
    """2.30, 2 all-reduces of 64 MiB, Simple, nMaxChannels 24 of 24: 256 MiB of traffic over min(48, 24) = 24
    channels, a budget of divUp(268435456 / 24 = 11184810, 16) x 16 = 11184816 B, 342 cells of 32 KiB traffic a
    channel (divUp). Call 1: 4096 cells, lo 342, mid (4096 - 342) // 342 = 10, hi 3754 - 3420 = 334: channels 0-11,
    its hi leaving 334 x 32 KiB = 10944512 B of channel 11's budget used. Call 2: lo divUp(11184816 - 10944512,
    32768) = 8 cells on channel 11, then 11 mid of 342 and hi 4088 - 3762 = 326: channels 11-23."""
    cell = 16 * KiB
    got = coll_group.deal((2, 30), "all_reduce", "Simple", 8, [64 * MiB] * 2, 24, 24)
    assert got == [
        (0, (342 * cell,) * 11 + (334 * cell,)),
        (11, (8 * cell,) + (342 * cell,) * 11 + (326 * cell,)),
    ]
    assert coll_group.channel_bytes(got)[11] == (334 + 8) * cell


def test_2_22_deals_16_byte_cells_without_a_least_traffic_per_call():
    """2.22: 16-byte cells, the calls' traffic summed as it is (no 16 KiB floor), a budget of at least 512 B:
    4 all-reduces of 8 KiB, nMaxChannels 1 of 24: 64 KiB over 4 channels, 16 KiB a channel = one call's 8 KiB x 2,
    so again a channel a call."""
    got = coll_group.deal((2, 22), "all_reduce", "Simple", 8, [8 * KiB] * 4, 1, 24)
    assert got == [(c, (8 * KiB,)) for c in range(4)]
    assert coll_group.deal((2, 21), "all_reduce", "Simple", 8, [8 * KiB] * 4, 1, 24) is None


@pytest.mark.parametrize("version", [(2, 22), (2, 23), (2, 26), (2, 29), (2, 30)])
@pytest.mark.parametrize("proto", ["LL", "Simple"])
@pytest.mark.parametrize("count", [4, 5000, 64 * KiB + 8, 3 * MiB, 64 * MiB])
def test_a_group_of_one_deals_as_a_lone_call(version, proto, count):
    """One task alone in its plan: the deal is `channel_split.split`'s parts (the same enqueue.cc loop, channel 0)."""
    got = coll_group.deal(version, "all_reduce", proto, 8, [count], 16, 24)
    assert got is not None and got[0][0] == 0
    assert got[0][1] == channel_split.split(version, "all_reduce", proto, 8, count, 16, 24)


def test_aggregates_within_four_times_from_2_22_and_consecutive_before():
    """2.22+: sorted, binned by (function, reduction, type), each bin smallest first, a run under 4 x its first's
    traffic: all-reduces of 1 MiB, 64 KiB, 100 KiB, 8 MiB -> [64 KiB, 100 KiB] (under 256 KiB), [1 MiB] (8 MiB is
    not under 4 MiB), [8 MiB]. Before 2.22 consecutive calls of one (function, reduction, type) are one aggregate,
    whatever their sizes; an all-gather between two all-reduces splits them."""
    calls = [("all_reduce", "sum", "bf16", s) for s in (1 * MiB, 64 * KiB, 100 * KiB, 8 * MiB)]
    assert coll_group.aggregates((2, 22), calls) == [[1, 2], [0], [3]]
    assert coll_group.aggregates((2, 21), calls) == [[0, 1, 2, 3]]
    mixed = [("all_reduce", "sum", "bf16", MiB), ("all_gather", "sum", "bf16", MiB), ("all_reduce", "sum", "bf16", MiB)]
    assert coll_group.aggregates((2, 19), mixed) == [[0], [1], [2]]
    assert {frozenset(a) for a in coll_group.aggregates((2, 30), mixed)} == {frozenset({0, 2}), frozenset({1})}
    other_type = [("all_reduce", "sum", "bf16", MiB), ("all_reduce", "sum", "fp32", MiB)]
    assert len(coll_group.aggregates((2, 30), other_type)) == 2


def test_pipe_ops_and_the_latency_they_charge():
    """numPipeOps: 2.22+ divUp(tasks, comm channels) (48 on 16: 3); 2.20-2.21 1; 2.19 opPerChannel: 64 calls of
    1 MiB on 8 ranks and 16 channels: bytePerChannel 16 MiB halved while 64 MiB < it x 16, so 4 MiB; the 63 calls
    after the first ask divUp(1 MiB, 4 MiB) = 1 channel each, 63 over min(16, 63): 4. 4 x 8 KiB there: 2 KiB a
    channel, 3 x 4 = 12 channels over 12: 1. latCount: a ring's numPipeOps, the others' over a batch's works (9
    before 2.22, 16 at 2.22, 10 at 2.23-2.29, 7 at 2.30)."""
    assert coll_group.pipe_ops((2, 30), [8 * KiB] * 48, 48, 8, 16) == 3
    assert coll_group.pipe_ops((2, 21), [8 * KiB] * 48, 48, 8, 16) == 1
    assert coll_group.pipe_ops((2, 19), [MiB] * 64, 64, 8, 16) == 4
    assert coll_group.pipe_ops((2, 19), [8 * KiB] * 4, 4, 8, 16) == 1
    assert coll_group.lat_count((2, 30), "ring", 3) == 3
    assert [coll_group.lat_count(v, "tree", 17) for v in ((2, 19), (2, 22), (2, 25), (2, 30))] == [2, 2, 2, 3]


def test_small_all_reduces_cost_one_latency_and_their_summed_bytes():
    """8 H100s, 4 all-reduces of 8 KiB in one group: NCCL picks Ring LL for the 32 KiB aggregate, as for one
    8 KiB call, so the group costs one call's latency L plus 4 calls' bytes at the algorithm bandwidth B
    (L + 4 x 8 KiB / B), where 4 calls one after another cost 4 (L + 8 KiB / B)."""
    one_us, one = _end_us(Collective("all_reduce", RANKS, 8 * KiB, "fp32"))
    group_us, grouped = _end_us(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=4))
    assert (grouped["algorithm"], grouped["protocol"]) == (one["algorithm"], one["protocol"]) == ("Ring", "LL")
    assert grouped["group_calls"] == 4
    lat_us = one["model_lat_us"] + one.get("fill_us", 0.0)
    per_call_us = 8 * KiB / (one["model_algbw_gbs"] * 1e3)
    assert one_us == pytest.approx(lat_us + per_call_us, rel=0.01)
    assert group_us == pytest.approx(lat_us + 4 * per_call_us, rel=0.01)
    assert group_us < 0.3 * 4 * one_us


def test_large_all_reduces_move_their_total_at_the_bus_bandwidth():
    """4 all-reduces of 256 MiB in one group on 8 H100s: the latency is lost in the bytes, so the group moves its
    1 GiB at the bus bandwidth of a 1 GiB call (2 (n - 1) / n x bytes over the time, within 1 %), not at four
    256 MiB calls' one after another (each with its own latency and NCCL's lower rate for the smaller size)."""
    factor = 2 * 7 / 8
    one_us, _ = _end_us(Collective("all_reduce", RANKS, 256 * MiB, "fp32"))
    whole_us, whole = _end_us(Collective("all_reduce", RANKS, 1024 * MiB, "fp32"))
    group_us, grouped = _end_us(Collective("all_reduce", RANKS, 256 * MiB, "fp32", group_calls=4))
    assert grouped["group_calls"] == 4 and grouped["algorithm"] == whole["algorithm"]
    busbw = factor * 1024 * MiB / group_us
    assert busbw == pytest.approx(factor * 1024 * MiB / whole_us, rel=0.01)
    assert group_us < 4 * one_us


def test_the_tuner_picks_on_the_aggregate():
    """1 MiB all-reduces on 8 H100s: alone Ring LL (NCCL 2.30's tuner); 4 of them in a group are rated as 4 MiB,
    where NVLS Simple wins: the group records NVLS and the 4 MiB call's channels."""
    _, alone = _end_us(Collective("all_reduce", RANKS, MiB, "fp32"))
    _, four = _end_us(Collective("all_reduce", RANKS, 4 * MiB, "fp32"))
    _, grouped = _end_us(Collective("all_reduce", RANKS, MiB, "fp32", group_calls=4))
    assert (alone["algorithm"], alone["protocol"]) == ("Ring", "LL")
    assert (grouped["algorithm"], grouped["protocol"], grouped["channels"]) == (
        four["algorithm"],
        four["protocol"],
        four["channels"],
    )
    assert grouped["algorithm"] == "NVLS"


def test_more_tasks_than_channels_charge_a_rings_latency_per_pipelined_op():
    """NCCL_MAX_NCHANNELS=2, NCCL_ALGO=Ring, NCCL_PROTO=LL: 8 calls of 1 KiB on 2 channels, numPipeOps
    divUp(8, 2) = 4, so the ring's latency counts 4 times (ncclTopoGetAlgoTime); the bandwidth term stays the
    aggregate's 8 KiB."""
    env = {"NCCL_MAX_NCHANNELS": "2", "NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    _, total = _end_us(Collective("all_reduce", RANKS, 8 * KiB, "fp32"), **env)
    _, grouped = _end_us(Collective("all_reduce", RANKS, KiB, "fp32", group_calls=8), **env)
    lat = total["model_lat_us"]
    assert grouped["model_lat_us"] == pytest.approx(4 * lat, abs=2e-3)
    assert grouped["model_time_us"] == pytest.approx(total["model_time_us"] + 3 * lat, abs=2e-3)


def test_more_than_1024_calls_in_one_group_run_as_one_launch_before_2_22():
    """2.19 - 2.21 hold a group in one plan while half the work FIFO holds its works (fifo_budget.py; from 2.22 the
    group runs as NCCL's plans: tests/test_nccl_coll_group_budget.py): 1025 all-reduces of 1 KiB, one aggregate,
    one launch."""
    group = Collective("all_reduce", RANKS, KiB, "fp32", group_calls=1025)
    got = decompose(group, H100, opts(PHANTORA_NCCL_VERSION="2.21.5")).choice
    assert got is not None and got["group_calls"] == 1025 and "plans" not in got


def _table(argv: list[str], out) -> list[dict]:
    from phantora.cli import main

    assert main(["nccl-tests", *argv, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["sizes"]


def test_nccl_tests_m_prints_the_groups_time_per_call(tmp_path):
    """`all_reduce_perf -m 4` on 8 H100s at 8 KiB: one launch for the four calls, so a call's printed time is the
    group's L + 4 S / B over 4 (the host's one launch a group, 4.26 us, hides behind the GPUs' time but for the
    first of the 20 iterations), well under `-m 1`'s L + S / B."""
    argv = ["all_reduce_perf", "-b", "8K", "-e", "8K", "-n", "20", "-w", "0"]
    four = _table([*argv, "-m", "4"], tmp_path / "m4")[0]
    one = _table(argv, tmp_path / "m1")[0]
    c = one["choice"]
    lat_us = c["model_lat_us"] + c.get("fill_us", 0.0)
    per_call_us = 8 * KiB / (c["model_algbw_gbs"] * 1e3)
    assert four["choice"]["group_calls"] == 4
    assert four["time_us"] < 0.5 * one["time_us"]
    assert four["time_us"] == pytest.approx((lat_us + 4 * per_call_us) / 4, rel=0.05)


def test_a_coalesced_call_carries_its_calls_to_the_planner():
    """A live coalesced call (torch's allreduce_coalesced: one NCCL group of one all-reduce a tensor) reaches the
    planner as its total with the calls' bytes in its `algo` map: 4 x 8 KiB plan as a group of 4 equal calls."""
    from phantora.collectives.mirrors import Mirrors
    from phantora.collectives.plan import CallSpec, CollectivePlanner

    planner = CollectivePlanner(H100, opts(), Mirrors(8, 8))
    call = CallSpec("all_reduce", RANKS, 32 * KiB, "fp32", algo={"group_sizes": (8 * KiB,) * 4})
    plan = planner.plan(call, "coalesced")
    grouped = decompose(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=4), H100, opts())
    assert (plan.choice or {})["group_calls"] == 4
    assert [(f.src, f.dst, f.size, f.rate_bps) for f in plan.flows] == [
        (f.src, f.dst, f.size, f.rate_bps) for f in grouped.flows
    ]


def test_calls_nccl_aggregates_apart_share_the_groups_bandwidth_time():
    """2.30: all-reduces of 64 KiB and 8 MiB (over 4 x apart) are two aggregates, each its tuner's pick (Ring LL,
    NVLS Simple, as each alone). One launch, the sum of their bandwidth times (bytes / algbw each); the ring is dealt
    first, on channels 0-1, and NVLS after it from channel 0, so on the channels they share NVLS's work starts after
    the ring's latency and pays its own (NVLS's base latency is 0: channel_turns.py): on an idle host the group ends
    at both latencies plus the bandwidth sum; 2.21 aggregates them."""
    small, big = 64 * KiB, 8 * MiB
    _, a = _end_us(Collective("all_reduce", RANKS, small, "bf16"))
    _, b = _end_us(Collective("all_reduce", RANKS, big, "bf16"))
    group = Collective("all_reduce", RANKS, small + big, "bf16", group_sizes=(small, big))
    group_us, got = _end_us(group)
    assert [(x["algorithm"], x["protocol"]) for x in got["aggregates"]] == [
        (a["algorithm"], a["protocol"]),
        (b["algorithm"], b["protocol"]),
    ]
    assert got["group_calls"] == 2
    assert T.BASE_LAT["nvls"][T.PROTOCOLS.index(b["protocol"])] == 0.0
    lat = sum(c["model_lat_us"] + c.get("fill_us", 0.0) for c in (a, b))
    bw = small / (a["model_algbw_gbs"] * 1e3) + big / (b["model_algbw_gbs"] * 1e3)
    assert group_us == pytest.approx(lat + bw, rel=0.02)
    _, old = _end_us(group, PHANTORA_NCCL_VERSION="2.21.5")
    assert "aggregates" not in old and old["group_calls"] == 2


def test_a_recorded_coalesced_call_keeps_its_calls(tmp_path):
    """The execution graph stores a coalesced call's calls' bytes (node type 14) and reads them back, on a later
    process group too (its pg kept); sizes that do not add up to the call are refused in one line."""
    from phantora.egraph import ProgramBuilder
    from phantora.egraph.format import T_COLL_GROUP, Coll, Program

    b = ProgramBuilder(0)
    b.collective("reduce_scatter", [0, 1], 3000, dtype="fp32", group_sizes=(1000, 2000), redop="max")
    prog, _ = b.build()
    assert Program.decode(prog.encode()).nodes == prog.nodes
    node = prog.nodes[0]
    assert isinstance(node, Coll) and node.group_sizes == (1000, 2000) and node.redop == "max"
    assert T_COLL_GROUP == 14
    b2 = ProgramBuilder(0)
    b2.collective("all_gather", [0, 1], 3000, group_sizes=(1000, 2000), pg=1)
    later, _ = b2.build()
    assert Program.decode(later.encode()).nodes == later.nodes and later.nodes[0].pg == 1
    with pytest.raises(InputError, match="group sizes"):
        ProgramBuilder(0).collective("all_reduce", [0, 1], 3000, group_sizes=(1000, 1000))


def test_a_replayed_coalesced_call_runs_as_its_group(tmp_path):
    """A graph whose ranks issue one coalesced all-reduce of 64 KiB and 8 MiB replays as that group (two aggregates
    in one launch), the same end as the group decomposed alone, not as one call of the total; so does its Chakra
    export read back."""
    from phantora.egraph import replay_graph
    from phantora.egraph.builder import ProgramBuilder
    from phantora.egraph.chakra import export_chakra, read_chakra
    from phantora.egraph.format import Program, assemble

    sizes = (64 * KiB, 8 * MiB)
    parts = []
    for r in RANKS:
        b = ProgramBuilder(r)
        b.wait([b.collective("all_reduce", RANKS, sum(sizes), dtype="bf16", group_sizes=sizes)])
        prog, groups = b.build()
        parts.append((Program.decode(prog.encode()), groups))
    graph = assemble(parts)
    export_chakra(graph, tmp_path / "chakra")
    group_us, _ = _end_us(Collective("all_reduce", RANKS, sum(sizes), "bf16", group_sizes=sizes))
    whole_us, _ = _end_us(Collective("all_reduce", RANKS, sum(sizes), "bf16"))
    assert abs(group_us - whole_us) > 0.01 * whole_us
    for g in (graph, read_chakra(tmp_path / "chakra")):  # a Chakra export keeps it (phantora_group_sizes)
        res = replay_graph(g, H100, FlowSimulator(H100))
        assert max(c.end_ns for c in res.completions) / 1000 == pytest.approx(group_us, abs=1e-3)


LIVE_BLOCK = """
    import torch, torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    xs = TENSORS

    def block():
        with _coalescing_manager(async_ops=True) as cm:
            for x in xs:
                dist.all_reduce(x, async_op=True)
        cm.wait()

    for _ in range(2):
        block()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        block()
    end.record()
    torch.cuda.synchronize()
    print("RESULT", rank, start.elapsed_time(end) * 1000 / 10, VALUES, flush=True)
    dist.destroy_process_group()
"""


def live_block(tensors: str, values: str) -> str:
    """A live program that times 10 `_coalescing_manager` blocks of async all-reduces of `tensors` (a Python
    expression of a list of CUDA tensors) after 2 warm-ups, and prints "RESULT rank us-per-block `values`"."""
    return textwrap.dedent(LIVE_BLOCK).replace("TENSORS", tensors).replace("VALUES", values)


LIVE = live_block('[torch.ones(2048, device="cuda") for _ in range(4)]', "float(xs[0][0])")  # 4 x 8 KiB of fp32


@pytest.mark.slow
def test_a_live_coalescing_block_takes_nccl_tests_group_time(tmp_path, capsys):
    """4 ranks of an 8-H100 host, a `_coalescing_manager` block of 4 all-reduces of 8 KiB (torch's fast path:
    allreduce_coalesced, one NCCL group): a block takes what `all_reduce_perf -m 4 -G 1 --np 4` prints for 4 calls
    (the group's GPU time), it is recorded with its calls' sizes, and its replay takes the same time."""
    from phantora.cli import main
    from phantora.egraph import replay_graph
    from phantora.egraph.format import Coll
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig
    from phantora.topology.generators import dgx_host

    argv = ["nccl-tests", "all_reduce_perf", "-b", "8K", "-e", "8K", "-m", "4", "-G", "1", "--np", "4", "-n", "5"]
    assert main([*argv, "--out", str(tmp_path / "nt")]) == 0
    capsys.readouterr()
    row = json.loads((tmp_path / "nt" / "results.json").read_text())["sizes"][0]
    group_us = 4 * row["time_us"]
    script = tmp_path / "coalesce.py"
    script.write_text(LIVE)
    topo = dgx_host(8, gpu="h100")
    cfg = RunConfig(str(script), topology=topo, nproc=4, trace="none", timeout_s=600, out_dir=tmp_path / "run")
    rep, graph = record_run(cfg, tmp_path / "graph")
    lines = [ln.split() for r in range(4) for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 4 and all(float(ln[3]) == 4.0**12 for ln in lines)  # the sums went through
    assert all(float(ln[2]) == pytest.approx(group_us, rel=0.005) for ln in lines)
    colls = [n for p in graph.programs for n in p.nodes if isinstance(n, Coll) and n.kind == "all_reduce"]
    assert colls and all(n.group_sizes == (8 * KiB,) * 4 for n in colls)
    res = replay_graph(graph, topo, FlowSimulator(topo))
    busy = res.comm["all_reduce"]
    assert busy["busy_ns"] / busy["count"] / 1000 == pytest.approx(group_us, rel=0.005)
