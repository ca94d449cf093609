"""A replay follows a live run's lone sends as the live coordinator does (phantora/egraph/replay.py).

- their connection slots (tests/test_handoff_slots.py): a replayed send waits for the flows of the earlier sends
  whose slots it needs, on the replayed network's channels and chunks;
- a call issued after such a send is issued at once; only its start waits for the send's hand-off. Until this
  change the replay held the whole rank at that call until the send's predecessors had launched, which a live
  rank never does, so a program that ran live could deadlock in replay only (`STRICT`, below).
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from phantora.egraph import replay_graph
from phantora.egraph.builder import ProgramBuilder
from phantora.egraph.format import Program, assemble
from phantora.errors import InputError
from phantora.launcher import RunConfig
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology
from phantora.topology.generators import leaf_spine

KIB = 1024
NVL = round(11_800 + 64 * KIB / 20.6)  # 14,981 ns: a 64 KiB send's hand-off between two H100 over NVLink
H = round(host_launch_us(DEFAULT_BATCHES) * 1000)  # the host's launch of a call (runtime/nccl_launch.py)


def _bursts(k: int, nbytes: int, late_ns: int, both: bool):
    """Rank 0 sends `k` sends of `nbytes` to rank 1, each waited at its hand-off; rank 1 computes `late_ns`, then
    receives them (with `both`, each rank sends first, then receives)."""
    parts = []
    for me in (0, 1):
        b = ProgramBuilder(me)
        if me == 1 and late_ns:
            b.compute("late", late_ns)
        if me == 0 or both:
            for _ in range(k):
                b.wait([b.p2p(1 - me, True, nbytes)], handoff=True)
        if me == 1 or both:
            for _ in range(k):
                b.wait([b.p2p(1 - me, False, nbytes)])
        prog, groups = b.build()
        parts.append((Program.decode(prog.encode()), groups))
    return assemble(parts)


def test_a_replayed_send_past_the_slots_waits_for_the_first_flow(tmp_path: Path):
    """Nine 64 KiB sends (one NVLink slot each) to a receiver 1 ms late: eight hand off back to back, the ninth at
    the first flow's end + the flag's way back (the NVLink path's propagation, `Slots.back_ns`) + 14,981 ns; the
    same after a Chakra export and read-back (the windows are recomputed from the hand-off waits, node type 7)."""
    from phantora.egraph.chakra import export_chakra, read_chakra

    topo = load_topology("testbed16")
    back = topo.path_latency_ns(topo.route(topo.node_of_rank(1), topo.node_of_rank(0)))
    graph = _bursts(9, 64 * KIB, 1_000_000, False)
    export_chakra(graph, tmp_path / "chakra")
    for g in (graph, read_chakra(tmp_path / "chakra")):
        res = replay_graph(g, topo, FlowSimulator(topo))
        handed = sorted(c.end_ns for c in res.completions if c.tag.startswith("r0/handoff"))
        first = min((c for c in res.completions if c.size), key=lambda c: c.start_ns)
        assert handed[:8] == [NVL * (i + 1) for i in range(8)], handed
        assert first.start_ns >= 1_000_000 and handed[8] == first.end_ns + back + NVL, (handed, first)


def test_replayed_sends_across_hosts_deadlock_as_live():
    """Two 256 KiB sends, then two receives, on both ranks of two hosts: the second waits for the first's flow,
    whose receive comes after the peer's second send (NCCL hangs, and the live run: tests/test_handoff_slots.py);
    inside a host both hand off."""
    cross = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    with pytest.raises(InputError, match=r"deadlocks: rank 0 waits on send_recv 0->1 tag 0 #0"):
        replay_graph(_bursts(2, 256 * KIB, 0, True), cross, FlowSimulator(cross))
    topo = load_topology("testbed16")
    res = replay_graph(_bursts(2, 256 * KIB, 0, True), topo, FlowSimulator(topo))
    handed = sorted(c.end_ns for c in res.completions if c.tag.startswith("r0/handoff"))
    assert handed == [NVL, 2 * NVL], handed


STRICT = """
    import torch, torch.distributed as dist
    dist.init_process_group()
    r = dist.get_rank()
    g1 = dist.new_group([0, 1])
    a, b, c = (torch.ones(1 << 18, device="cuda") for _ in range(3))
    x = torch.full((1 << 16,), 7.0, device="cuda")
    side = torch.cuda.Stream()
    e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    e0.record()
    if r == 0:
        q = dist.all_reduce(a, group=g1, async_op=True)  # Q: the send's kernel starts at its end
        with torch.cuda.stream(side):
            q.wait()
            dist.isend(x, 1).wait()  # S: a lone send within its buffer, after Q on the side stream
            xw = dist.all_reduce(b, group=g1, async_op=True)  # X: after S on the side stream
        dist.all_reduce(c)  # Y: the world, waited on the default stream
        torch.cuda.current_stream().wait_stream(side)
        xw.wait()
    elif r == 1:
        dist.all_reduce(c)  # Y before Q: rank 0 issues Y only after Q, S and X
        dist.all_reduce(a, group=g1)  # Q
        dist.all_reduce(b, group=g1)  # X
        box = torch.zeros(1 << 16, device="cuda")
        dist.recv(box, 0)
        assert float(box[0]) == 7.0
    else:
        dist.all_reduce(c)
    e1.record()
    print("TIMES", e0.t_ns, e1.t_ns, flush=True)
    dist.destroy_process_group()
"""


def _record(tmp_path: Path, network: str):
    from phantora.egraph.live import record_run

    script = tmp_path / "strict.py"
    script.write_text(textwrap.dedent(STRICT))
    topo = leaf_spine(1, 3, 1, nic_rate="100Gbps")
    cfg = RunConfig(str(script), [], topo, nproc=3, timeout_s=240)
    cfg.engine = EngineSpec(network=network)
    rep, graph = record_run(cfg, tmp_path / "g")
    assert graph.recorded is not None
    return topo, rep, graph


def test_a_call_after_a_handed_send_is_issued_at_once_in_replay_as_live(tmp_path: Path):
    """`STRICT` on three one-GPU hosts: rank 0 issues Q (an all-reduce on ranks 0-1), S (a 256 KiB send after Q on a
    side stream), X (an all-reduce after S there) and Y (on all three ranks, waited); rank 1 does Y before Q. Live,
    rank 0 reaches Y at once and everything runs. The old replay held rank 0 at X until Q launched, while rank 1 (and
    2) waited in Y for rank 0: "the graph deadlocks". Now it replays to the live run's ends, exported to Chakra and
    read back too (S's hand-off is node type 7's, its marker after Q's flows)."""
    from phantora.egraph.chakra import export_chakra, read_chakra

    topo, rep, graph = _record(tmp_path, "flow")
    live = graph.recorded["end_ns"]
    for me in range(3):
        t0, t1 = (int(v) for v in next(x for x in rep.logs[f"rank {me}"].splitlines() if "TIMES" in x).split()[1:])
        assert t1 <= live[me], (t1, live)
    res = replay_graph(graph, topo, FlowSimulator(topo))
    assert res.rank_end_ns == live, (res.rank_end_ns, live)
    handed = [c for c in res.completions if c.tag.startswith("r0/handoff")]
    ar = max(c.end_ns for c in res.completions if c.size and c.size != 256 * KIB and {c.src, c.dst} <= {0, 1})
    assert len(handed) == 1 and handed[0].start_ns >= min(c.end_ns for c in res.completions if c.size), handed
    assert handed[0].end_ns < ar  # X's all-reduce ran after S's hand-off
    export_chakra(graph, tmp_path / "chakra")
    back = replay_graph(read_chakra(tmp_path / "chakra"), topo, FlowSimulator(topo))
    assert back.rank_end_ns == live, (back.rank_end_ns, live)


@pytest.mark.slow
def test_the_strict_program_replays_as_live_in_packet_mode(tmp_path: Path):
    """`STRICT` recorded on ns-3 and replayed on a fresh ns-3 fabric: no deadlock, the live ends."""
    from phantora.netsim.factory import make_engine

    topo, _, graph = _record(tmp_path, "ns3")
    sim = make_engine(EngineSpec(network="ns3"), topo)
    try:
        res = replay_graph(graph, topo, sim)
    finally:
        sim.close()
    assert res.rank_end_ns == graph.recorded["end_ns"], (res.rank_end_ns, graph.recorded)


AHEAD = """
    import torch, torch.distributed as dist
    dist.init_process_group()
    r = dist.get_rank()
    k = 10
    if r == 0:
        x = torch.ones(1 << 16, device="cuda")  # 256 KiB: one NVLink slot on each of 4 channels
        e = [torch.cuda.Event(enable_timing=True) for _ in range(k + 1)]
        e[0].record()
        for i in range(k):
            dist.send(x, 1)  # all ahead of their receives
            e[i + 1].record()
        print("SENT", *(ev.t_ns for ev in e), flush=True)
    else:
        box = torch.zeros(1 << 16, device="cuda")
        a = torch.ones(2048, 2048, device="cuda")
        for _ in range(4):
            a = a @ a  # the receiver is late
        p = torch.cuda.Event(enable_timing=True)
        p.record()
        for _ in range(k):
            dist.recv(box, 0)
        print("POST", p.t_ns, flush=True)
    dist.destroy_process_group()
"""


TRANSFER = 14_982  # ns: NCCL's lone p2p of 256 KiB over 4 NVLink channels, 11.8 us + 3,181.4 ns, as the flows end


@pytest.mark.parametrize("registered", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_sends_ahead_of_their_receives_replay_and_export_to_the_live_events(tmp_path: Path, registered: bool):
    """`AHEAD` on testbed16's GPUs 0 and 1: rank 0 sends ten 256 KiB (one slot on each of 4 channels) before rank 1,
    late, posts its receives at POST. Unregistered, the first eight hand off back to back from the first's issue at
    max(e_0, h), once the host has launched it (e_i = max(e_0, h) + i x 14,981 ns; the later launches hide), and
    the ninth and tenth once the first and second flows have ended (POST + k x 14,982) and the receiver's flag is
    back (the NVLink path's propagation), plus their own 14,981;
    under PHANTORA_NCCL_REGISTER=1 each is zero-copy and ends with its flow, POST + k x 14,982. The recording
    replays to the live ends with the live hand-offs, also after a Chakra export and read-back; the unregistered
    recording replayed under registration hands none off. Both runs end at the last flow's end, POST + 10 x 14,982."""
    from phantora.egraph.chakra import export_chakra, read_chakra
    from phantora.egraph.live import record_run
    from phantora.egraph.replay import algo_from_meta

    script = tmp_path / "ahead.py"
    script.write_text(textwrap.dedent(AHEAD))
    topo = load_topology("testbed16")
    env = {"PHANTORA_NCCL_REGISTER": "1"} if registered else {}
    cfg = RunConfig(str(script), [], topo, nproc=2, timeout_s=240, tensors="phantom", dedup="off", env=env)
    rep, graph = record_run(cfg, tmp_path / "g")
    e = [int(v) for v in next(x for x in rep.logs["rank 0"].splitlines() if x.startswith("SENT")).split()[1:]]
    post = int(next(x for x in rep.logs["rank 1"].splitlines() if x.startswith("POST")).split()[1])
    if registered:
        assert e[1:] == [post + k * TRANSFER for k in range(1, 11)], (e, post)
    else:
        assert e[1:9] == [max(e[0], H) + k * NVL for k in range(1, 9)], e
        back = topo.path_latency_ns(topo.route(topo.node_of_rank(1), topo.node_of_rank(0)))
        assert e[9:] == [post + TRANSFER + back + NVL, post + 2 * TRANSFER + back + NVL], (e, post)
    assert graph.recorded["end_ns"] == [post + 10 * TRANSFER] * 2  # both end at the last flow's end (destroy syncs)
    export_chakra(graph, tmp_path / "chakra")
    for g in (graph, read_chakra(tmp_path / "chakra")):
        res = replay_graph(g, topo, FlowSimulator(topo))
        assert res.rank_end_ns == graph.recorded["end_ns"], (res.rank_end_ns, graph.recorded)
        handed = sorted(c.end_ns for c in res.completions if c.tag.startswith("r0/handoff"))
        assert handed == ([] if registered else e[1:]), handed
    if not registered:
        reg = dataclasses.replace(algo_from_meta(graph), nccl_env=(("PHANTORA_NCCL_REGISTER", "1"),))
        res = replay_graph(graph, topo, FlowSimulator(topo), reg)
        assert not [c for c in res.completions if c.tag.startswith("r0/handoff")]
        assert res.rank_end_ns == graph.recorded["end_ns"], res.rank_end_ns
