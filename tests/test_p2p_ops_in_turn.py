"""Several sends to one peer in one NCCL group (a batch_isend_irecv, a coalescing block) run in turn, as NCCL's
passes over its peers' queues run them (enqueue.cc `scheduleP2pTasksToPlan`, v2.19.4-1 .. v2.30.7-1): one launch,
then each operation's step and bytes, each on its own bytes' protocol and channels (`LaunchGroup.later`,
`nccl._grouped`). A 4-rank ring of 4 x 8 KiB on H100s ends where `phantora nccl-tests sendrecv_perf -b 8K -e 8K -m 4
--np 4` puts its group of 4 calls (model_time_us 12.181: NCCL's LL launch 6.6 us and 4 LL steps over NVLink of
0.6 us, tuning.cc, plus 4 operations' bytes); before, the four ran side by side, all ending at one 8 KiB operation's
7.996 us. Live runs, their recordings' replays and ns-3 agree."""

from __future__ import annotations

import json
import textwrap

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.launch_group import LaunchGroup
from phantora.collectives.nccl import choose
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host

TOPO = dgx_host(4, gpu="h100")
COMM = (0, 1, 2, 3)
RING = tuple((r, (r + 1) % 4) for r in COMM)
KiB = 1 << 10
LAUNCH_US, STEP_US = 6.6, 0.6  # NCCL's LL ring base latency and an LL step over NVLink (tuning.cc)


def nccl_tests_us(nbytes: int, calls: int) -> float:
    """sendrecv_perf's model time of `calls` calls of `nbytes` in one group on 4 ranks (`-m calls --np 4`)."""
    coll = Collective("send_recv", (0, 1), nbytes, "fp32", None, COMM, RING, group_calls=calls)
    got = choose(coll, TOPO, AlgoOptions())
    assert got is not None
    return got.time_us


def batch_ends(ops: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], int]:
    """The end ns of each operation (src, dst, bytes; a pair's in order) of one group launched at 0, flow engine."""
    pairs = sorted({(a, b) for a, b, _ in ops})
    by = {p: [n for a, b, n in ops if (a, b) == p] for p in pairs}
    later = tuple((a, b, k, 0, n) for a, b in pairs for k, n in enumerate(by[(a, b)][1:], 1))
    g = LaunchGroup(tuple(pairs), (0,) * len(pairs), tuple(by[p][0] for p in pairs), later=later)
    sim, fid, ends = FlowSimulator(TOPO), 1, {}
    for a, b in pairs:
        for k, n in enumerate(by[(a, b)]):
            coll = Collective("send_recv", (a, b), n, "uint8", comm=COMM, launch=g, launch_op=k)
            dag = decompose(coll, TOPO, AlgoOptions(), first_flow_id=fid, tag=f"{a}>{b}#{k}")
            fid += len(dag.flows)
            sim.submit(dag.flows, at=0)
    for c in sim.drain():
        a, b, k = (int(x) for x in c.tag.split("/")[0].replace(">", "#").split("#"))
        ends[(a, b, k)] = max(ends.get((a, b, k), 0), c.end_ns)
    return ends


def test_a_ring_of_four_operations_a_peer_takes_nccl_tests_group_time() -> None:
    """4 x 8 KiB to the next rank on 4 H100s: operation k ends at the launch, k + 1 LL steps and k + 1 operations'
    bytes; the last at sendrecv_perf -m 4's time (12.181 us), not at one operation's (before: all at 7.996)."""
    ends = batch_ends([(a, b, 8 * KiB) for a, b in RING for _ in range(4)])
    one, four = nccl_tests_us(8 * KiB, 1), nccl_tests_us(8 * KiB, 4)
    bytes_us = one - LAUNCH_US - STEP_US  # one operation's bytes
    assert four == pytest.approx(LAUNCH_US + 4 * STEP_US + 4 * bytes_us)
    for (_, _, k), end in ends.items():
        assert end / 1000 == pytest.approx(LAUNCH_US + (k + 1) * (STEP_US + bytes_us), abs=0.002)
    assert max(ends.values()) / 1000 == pytest.approx(four, abs=0.002)


def test_a_mixed_batch_runs_each_pairs_operations_in_turn() -> None:
    """2 x 8 KiB to the next rank and 1 to the previous: the first to each peer run together (2 sends a GPU in
    flight), the second to the next rank after the first, alone by then: a step and one lone operation's bytes."""
    ends = batch_ends([(r, (r + 1) % 4, 8 * KiB) for r in COMM] * 2 + [(r, (r - 1) % 4, 8 * KiB) for r in COMM])
    lone_bytes_us = nccl_tests_us(8 * KiB, 1) - LAUNCH_US - STEP_US
    for r in COMM:
        first, back = ends[(r, (r + 1) % 4, 0)], ends[(r, (r - 1) % 4, 0)]
        assert first == back
        assert ends[(r, (r + 1) % 4, 1)] / 1000 == pytest.approx(first / 1000 + STEP_US + lone_bytes_us, abs=0.002)


def test_a_later_operation_must_name_a_pair_of_the_group() -> None:
    """Later operations of a pair not in the group, or out of order, are refused in one line naming the field."""
    with pytest.raises(InputError, match="later operations") as err:
        LaunchGroup(((0, 1),), (0,), (8,), later=((1, 2, 1, 0, 8),))
    assert err.value.field == "launch"
    with pytest.raises(InputError, match="later operations"):
        LaunchGroup(((0, 1),), (0,), (8,), later=((0, 1, 2, 0, 8),))
    g = LaunchGroup(((0, 1),), (0,), (8,), later=((0, 1, 1, 0, 16),))
    with pytest.raises(InputError, match="as its operation 1"):
        Collective("send_recv", (0, 1), 8, "uint8", comm=(0, 1), launch=g, launch_op=1)
    with pytest.raises(InputError, match="needs a launch group"):
        Collective("send_recv", (0, 1), 8, "uint8", comm=(0, 1), launch_op=1)


@pytest.mark.ns3
@pytest.mark.slow
def test_operations_in_turn_take_the_same_time_through_ns3(ns3_lib) -> None:
    """The ring of 4 x 1 MiB a peer through ns-3 (one connection's messages in turn) ends within 3 % of the flow
    engine's, which is sendrecv_perf -m 4's time."""
    from tests.engine_pair import flow_and_ns3_end_ns

    pairs = RING
    g = LaunchGroup(
        pairs, (0,) * 4, (1 << 20,) * 4, later=tuple((a, b, k, 0, 1 << 20) for a, b in pairs for k in (1, 2, 3))
    )
    flows, fid = [], 1
    for a, b in pairs:
        for k in range(4):
            coll = Collective("send_recv", (a, b), 1 << 20, "uint8", comm=COMM, launch=g, launch_op=k)
            dag = decompose(coll, TOPO, AlgoOptions(), first_flow_id=fid, tag=f"{a}>{b}#{k}")
            fid += len(dag.flows)
            flows += dag.flows
    times = flow_and_ns3_end_ns(TOPO, flows)
    assert times["flow"] / 1000 == pytest.approx(nccl_tests_us(1 << 20, 4), rel=0.01)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.03)


SCRIPT = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(me)
    K = 2048  # fp32 elements: 8 KiB
    nxt, prv = (me + 1) % n, (me - 1) % n

    def batch(ops):
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        torch.cuda.synchronize()

    def fence():
        dist.barrier()
        torch.cuda.synchronize()

    xs = [torch.full((K,), float(10 * me + i), device="cuda") for i in range(4)]
    ys = [torch.empty(K, device="cuda") for _ in range(4)]
    fence()
    batch([dist.P2POp(dist.isend, x, nxt) for x in xs] + [dist.P2POp(dist.irecv, y, prv) for y in ys])
    fence()
    zs = [torch.empty(K, device="cuda") for _ in range(3)]
    batch([dist.P2POp(dist.isend, xs[0], nxt), dist.P2POp(dist.isend, xs[1], nxt), dist.P2POp(dist.isend, xs[2], prv),
           dist.P2POp(dist.irecv, zs[0], prv), dist.P2POp(dist.irecv, zs[1], prv), dist.P2POp(dist.irecv, zs[2], nxt)])
    fence()
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    """The live run's transfer records (cosim.json) and its recording."""
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig

    d = tmp_path_factory.mktemp("ops")
    script = d / "ops.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cfg = RunConfig(str(script), topology=TOPO, nproc=4, tensors="phantom", trace="none", timeout_s=180,
                    out_dir=str(d / "o"))  # fmt: skip
    _, graph = record_run(cfg, d / "g")
    recs = json.loads((d / "o" / "cosim.json").read_text())["collectives"]
    return [r for r in recs if r["kind"] == "send_recv"], graph


@pytest.mark.slow
def test_live_batches_run_each_pairs_operations_in_turn_and_replay_so(recorded) -> None:
    """Live: the ring's 4 x 8 KiB a peer end one LL step and one operation's bytes apart, the last at sendrecv_perf
    -m 4's time after their start; in the mixed batch the second send to the next rank ends a step and a lone
    operation's bytes after the first, which ends with the send back. The recording replays every transfer to its
    live ns (flow engine). Slow: a live 4-rank run."""
    from phantora.egraph import replay_graph

    recs, graph = recorded
    assert len(recs) == 16 + 12
    assert {tuple(r["comm"]) for r in recs} == {COMM}
    one, four = nccl_tests_us(8 * KiB, 1), nccl_tests_us(8 * KiB, 4)
    bytes_us = one - LAUNCH_US - STEP_US
    ring, mixed = recs[:16], recs[16:]
    for a, b in RING:
        mine = sorted((r for r in ring if tuple(r["group"]) == (a, b)), key=lambda r: r["end_ns"])
        assert len(mine) == 4
        t0 = mine[0]["t_start"]
        for k, r in enumerate(mine):
            assert (r["end_ns"] - t0) / 1000 == pytest.approx(LAUNCH_US + (k + 1) * (STEP_US + bytes_us), abs=0.002)
        assert (mine[-1]["end_ns"] - t0) / 1000 == pytest.approx(four, abs=0.002)
        fwd = sorted((r for r in mixed if tuple(r["group"]) == (a, b)), key=lambda r: r["end_ns"])
        (back,) = [r for r in mixed if tuple(r["group"]) == (b, a)]
        assert len(fwd) == 2 and fwd[0]["end_ns"] == back["end_ns"]
        gap = (fwd[1]["end_ns"] - fwd[0]["end_ns"]) / 1000
        assert gap == pytest.approx(STEP_US + bytes_us, abs=0.002)
    live = sorted((r["name"].split("@")[0], *r["group"], r["end_ns"]) for r in recs)
    res = replay_graph(graph, TOPO, FlowSimulator(TOPO))
    ends: dict[tuple[str, int, int], int] = {}
    for c in res.completions:
        if "/p2p" in c.tag:
            name, pair = c.tag.split("/")[0].split("@")
            src, dst = (int(x) for x in pair.split(">"))
            ends[(name, src, dst)] = max(ends.get((name, src, dst), 0), c.end_ns)
    assert sorted((*k, e) for k, e in ends.items()) == live


@pytest.mark.slow
def test_a_window_mode_recording_replays_each_operation_in_its_live_time(tmp_path) -> None:
    """The same program in 20 us windows, recorded and replayed (the coordinator's rounds, `launch_release_ns`):
    every transfer takes its live time, the ring's operations one LL step and one operation's bytes apart as in
    exact mode. Slow: a live 4-rank run."""
    from phantora.egraph import replay_graph
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig
    from phantora.netsim.engine_spec import EngineSpec

    script = tmp_path / "ops.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cfg = RunConfig(str(script), topology=TOPO, nproc=4, tensors="phantom", trace="none", timeout_s=300,
                    out_dir=str(tmp_path / "o"), engine=EngineSpec(window_ns=20_000))  # fmt: skip
    _, graph = record_run(cfg, tmp_path / "g")
    recs = [
        r for r in json.loads((tmp_path / "o" / "cosim.json").read_text())["collectives"] if r["kind"] == "send_recv"
    ]
    live = {(r["name"].split("@")[0], *r["group"]): r["end_ns"] - r["t_start"] for r in recs}
    bytes_us = nccl_tests_us(8 * KiB, 1) - LAUNCH_US - STEP_US
    ring = sorted(r["end_ns"] - r["t_start"] for r in recs[:16] if tuple(r["group"]) == (0, 1))
    assert [t / 1000 for t in ring] == pytest.approx(
        [LAUNCH_US + (k + 1) * (STEP_US + bytes_us) for k in range(4)], abs=0.002
    )
    res = replay_graph(graph, TOPO, FlowSimulator(TOPO), fresh=lambda: FlowSimulator(TOPO))
    delay = {f.id: f.delay_ns for f in res.plan_flows}
    span: dict[tuple[str, int, int], tuple[int, int]] = {}
    for c in res.completions:
        if "/p2p" in c.tag:
            name, pair = c.tag.split("/")[0].split("@")
            src, dst = (int(x) for x in pair.split(">"))
            lo, hi = span.get((name, src, dst), (c.start_ns - delay[c.flow_id], c.end_ns))
            span[(name, src, dst)] = (min(lo, c.start_ns - delay[c.flow_id]), max(hi, c.end_ns))
    assert {k: hi - lo for k, (lo, hi) in span.items()} == live
