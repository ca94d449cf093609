"""A lone send's hand-off counts from when its kernel starts on its stream: behind the work its CUDA stream had in
flight, and waited from a side stream.

NCCL's send kernel starts once the stream it is launched on reaches it (ProcessGroupNCCL's syncStream makes the
NCCL stream wait for the caller's current stream) and ends at its hand-off: the closed form of tests/test_eager_send.py,
22,125 ns for 256 KiB between two hosts, from that start. Before, such a send ended at its flow's
end, so two ranks that both send first deadlocked.

Each rank's host launches its NCCL calls h apart from 0 (runtime/nccl_launch.py): its first call is issued at
max(t0, h), its second at max(the lane, 2 h), and the default stream's event after two launches is at max(t0, 2 h),
as a GPU cannot run what the host has not launched yet.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from bridge.errors import BridgeError
from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.topology import load_topology
from phantora.topology.generators import leaf_spine

KIB = 1024
HANDOFF = 22_125  # ns: 8.4 + 1.0 us + 262,144 B at 20.6 GB/s (tests/test_eager_send.py, test_handoff_transports.py)
NVL = 14_981  # ns: the same 256 KiB between two H100 over NVLink, 8.4 + 3.4 us + 4 channels at 20.6 GB/s
H = round(host_launch_us(DEFAULT_BATCHES) * 1000)  # the host's launch of a call

STREAMS = """
    import sys, torch, torch.distributed as dist
    mode, n = sys.argv[1], int(sys.argv[2])
    dist.init_process_group()
    r = dist.get_rank()
    peer = 1 - r
    x = torch.full((n,), float(r + 1), device="cuda")
    boxes = [torch.zeros(n, device="cuda") for _ in range(2)]
    ones = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    e0, mid, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(4))
    e0.record()
    if mode == "behind":  # a sync all-reduce on the side stream is still running there when the send is issued
        with torch.cuda.stream(side):
            dist.all_reduce(ones)
            dist.send(x, peer)
        sends = 1
    elif mode == "coll_after":  # a send, then a sync all-reduce queued behind it on the side stream
        with torch.cuda.stream(side):
            dist.send(x, peer)
            dist.all_reduce(ones)
        sends = 1
    else:  # "two": an isend waited from the side stream, then a second send queued behind it there
        w = dist.isend(x, peer)
        with torch.cuda.stream(side):
            w.wait()
            dist.send(x, peer)
        sends = 2
    mid.record()  # the default stream: not held by the side stream's sends
    torch.cuda.current_stream().wait_stream(side)
    e1.record()
    for box in boxes[:sends]:
        dist.recv(box, peer)
    e2.record()
    assert all(float(b[0]) == peer + 1 and float(b[-1]) == peer + 1 for b in boxes[:sends]), boxes
    print("TIMES", e0.t_ns, mid.t_ns, e1.t_ns, e2.t_ns, flush=True)
    dist.destroy_process_group()
"""


def _topo(mode: str):
    """Two hosts, except for two sends on one connection: across hosts the second waits in the proxy until the first
    is received (tests/test_handoff_slots.py), so there "two" deadlocks; inside a host both fit the slots."""
    return load_topology("testbed16") if mode == "two" else leaf_spine(1, 2, 1, nic_rate="100Gbps")


def _config(tmp_path: Path, mode: str, network: str = "flow", floats: int = 64 * KIB, topo=None) -> RunConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "streams.py"
    script.write_text(textwrap.dedent(STREAMS))
    topo = topo or _topo(mode)
    cfg = RunConfig(str(script), [mode, str(floats)], topology=topo, nproc=2, trace="none", timeout_s=240)
    cfg.engine = EngineSpec(network=network)
    cfg.out_dir = str(tmp_path / "run")
    return cfg


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """recorded(mode) -> (report, graph): the program in `mode` run live once with `--record`, shared by the live
    checks (its report is the live run's: the recorder wraps the ranks) and the replay check of that mode."""
    from phantora.egraph.live import record_run

    runs: dict[str, Any] = {}

    def get(mode: str) -> Any:
        if mode not in runs:
            tmp = tmp_path_factory.mktemp(mode)
            runs[mode] = record_run(_config(tmp, mode), tmp / "g")
        return runs[mode]

    return get


def _times(log: str) -> tuple[int, ...]:
    line = next(x for x in log.splitlines() if x.startswith("TIMES"))
    return tuple(int(v) for v in line.split()[1:])


def test_a_send_behind_a_side_streams_all_reduce_hands_off_after_it(recorded: Any):
    """Both ranks: on a side stream a sync all-reduce, then a 256 KiB send; the default stream waits for the side
    stream, then receives. The send's kernel starts when the all-reduce ends on the side stream, so the wait
    returns at the all-reduce's end + 22,125 ns (at 2990fe3: a deadlock, each send waiting for its flow)."""
    rep, _ = recorded("behind")
    fabric = [c for c in rep.cosim.completions if c.size]
    sends = {(c.src, c.dst): c for c in fabric if c.size == 256 * KIB}
    for me in (0, 1):
        t0, mid, t1, t2 = _times(rep.logs[f"rank {me}"])
        ar_end = max(c.end_ns for c in fabric if c.size != 256 * KIB and me in (c.src, c.dst))
        assert mid == max(t0, 2 * H) and t1 == ar_end + HANDOFF, (t0, mid, t1, ar_end)
        mine = sends[(1 - me, me)]
        assert t1 < mine.start_ns and t2 == mine.end_ns, (mine, t1, t2)


def test_a_send_queued_behind_another_on_a_side_stream_hands_off_after_its_hand_off(recorded: Any):
    """Both ranks (GPUs 0 and 1 of an H100 host): isend 256 KiB on the default stream, wait for it from a side stream,
    send 256 KiB more there; the default stream runs on (its event right after is the start's), then waits for the
    side stream: the second send's kernel starts at the first's hand-off, so the wait returns 2 x 14,981 ns after
    the first's issue (at 2990fe3: a deadlock)."""
    rep, _ = recorded("two")
    for me in (0, 1):
        t0, mid, t1, _ = _times(rep.logs[f"rank {me}"])
        assert mid == max(t0, 2 * H) and t1 - max(t0, H) == 2 * NVL, (t0, mid, t1)


def test_a_send_queued_behind_another_across_hosts_waits_for_the_first_to_be_received(tmp_path: Path):
    """The same program across two hosts: the second send's proxy op waits behind the first's, which waits for the
    peer's receive, issued after the peer's own second send: NCCL hangs (tests/test_handoff_slots.py); so does the
    run, naming the first send (until this change both sends handed off, at 2 x 22,125 ns)."""
    with pytest.raises(BridgeError) as info:
        launch(_config(tmp_path, "two", topo=leaf_spine(1, 2, 1, nic_rate="100Gbps")))
    text = str(info.value)
    assert text.startswith("deadlock") and "send#0" in text, text


def test_an_all_reduce_queued_behind_a_send_on_a_side_stream_starts_at_its_hand_off(recorded: Any):
    """Both ranks: on a side stream a 256 KiB send, then a sync all-reduce; the default stream waits for the side
    stream, then receives. The all-reduce starts at the send's hand-off (its issue + 22,125 ns), not at its flow's
    end, and takes as long as the same all-reduce issued on the idle network (the first program's); at 28ff30f it
    waited for the send's flow, which waited for the peer's receive, issued after its all-reduce: a deadlock."""
    (alone, _), (rep, _) = recorded("behind"), recorded("coll_after")
    for me in (0, 1):
        a0, _, a1, _ = _times(alone.logs[f"rank {me}"])
        ar_alone = max(c.end_ns for c in alone.cosim.completions if c.size and c.size != 256 * KIB) - max(a0, H)
        t0, mid, t1, t2 = _times(rep.logs[f"rank {me}"])
        ar = [c for c in rep.cosim.completions if c.size and c.size != 256 * KIB]
        issued = max(t0, H)
        assert mid == max(t0, 2 * H) and t1 == issued + HANDOFF + ar_alone == max(c.end_ns for c in ar), (t0, t1)
        assert min(c.start_ns for c in ar) >= issued + HANDOFF and t2 > t1, (ar, t2)


def test_a_send_past_the_buffer_behind_a_side_streams_all_reduce_still_waits_for_its_receiver(tmp_path: Path):
    """The first program with 4 MiB, past the 1 MiB a connection buffers: NCCL's send kernel waits for the
    receiver's credits, which wait for the peer's send: the run deadlocks, naming the send."""
    with pytest.raises(BridgeError) as info:
        launch(_config(tmp_path, "behind", floats=1024 * KIB))
    text = str(info.value)
    assert text.startswith("deadlock") and "send#0" in text, text


@pytest.mark.slow
def test_a_send_queued_behind_another_hands_off_the_same_in_packet_mode(tmp_path: Path):
    """The same program over ns-3: the hand-offs are NCCL's model, not the packets' (only the receives' ends are)."""
    rep = launch(_config(tmp_path, "two", network="ns3"))
    for me in (0, 1):
        t0, mid, t1, t2 = _times(rep.logs[f"rank {me}"])
        assert mid == max(t0, 2 * H) and t1 - max(t0, H) == 2 * NVL and t2 > t1, (t0, mid, t1, t2)


@pytest.mark.parametrize("mode", ["behind", "two", "coll_after"])
def test_recorded_side_stream_sends_replay_at_their_live_hand_offs(recorded: Any, mode: str):
    """`--record` of both programs, replayed on the same network: each send's hand-off marker (egraph node type 7's)
    ends at the live wait's event, after the all-reduce's last flow or the earlier send's own hand-off, and each
    rank ends where it ended live (no deadlock)."""
    from phantora.egraph import replay_graph
    from phantora.netsim.flow import FlowSimulator

    rep, graph = recorded(mode)
    assert graph.recorded is not None
    topo = _topo(mode)
    res = replay_graph(graph, topo, FlowSimulator(topo))
    end = {c.tag: c.end_ns for c in res.completions}
    for me in (0, 1):
        t0, _, t1, t2 = _times(rep.logs[f"rank {me}"])
        handed = sorted(t for tag, t in end.items() if tag.startswith(f"r{me}/handoff"))
        first = max(t0, H)  # the first call's issue
        want = {"behind": [t1], "two": [first + NVL, t1], "coll_after": [first + HANDOFF]}[mode]
        assert handed == want, (handed, want, end)
        assert t2 in end.values(), (t2, end)  # the receive's wait, at its live event
        assert res.rank_end_ns[me] == graph.recorded["end_ns"][me], (res.rank_end_ns, graph.recorded)


ORDER = """
    import sys, torch, torch.distributed as dist
    mode = sys.argv[1]
    dist.init_process_group()
    r = dist.get_rank()
    peer = 1 - r
    x, y = torch.full((1 << 16,), float(r + 1), device="cuda"), torch.full((1 << 16,), float(r + 3), device="cuda")
    boxes = [torch.zeros(1 << 16, device="cuda") for _ in range(2)]
    ones = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    if mode == "recv_first":  # both ranks: a receive, then a send to the same peer, unbatched
        q = dist.irecv(boxes[0], peer)
        w = dist.isend(x, peer)
        w.wait()
        e1.record()
        q.wait()
    elif mode == "one_recv_first":  # rank 0 receives first, rank 1 sends first
        if r == 0:
            q = dist.irecv(boxes[0], 1)
            w = dist.isend(x, 1)  # behind the receive on the pair's stream
            w.wait()
            e1.record()
            q.wait()
        else:
            dist.send(x, 0)
            e1.record()
            dist.recv(boxes[0], 0)
        assert float(boxes[0][0]) == peer + 1
    else:  # "two_streams": a send behind a side stream's all-reduce, then a send from the default stream
        with torch.cuda.stream(side):
            dist.all_reduce(ones)
            a = dist.isend(x, peer)
        b = dist.isend(y, peer)  # the pair's NCCL stream runs it after the first
        b.wait()
        e1.record()
        torch.cuda.current_stream().wait_stream(side)
        for box in boxes:
            dist.recv(box, peer)
        assert float(boxes[0][0]) == peer + 1 and float(boxes[1][0]) == peer + 3, (boxes[0][0], boxes[1][0])
    print("TIMES", e0.t_ns, e1.t_ns, flush=True)
    dist.destroy_process_group()
"""


def _order(tmp_path: Path, mode: str) -> RunConfig:
    script = tmp_path / "order.py"
    script.write_text(textwrap.dedent(ORDER))
    cfg = RunConfig(str(script), [mode], topology=load_topology("testbed16"), nproc=2, trace="none", timeout_s=240)
    cfg.engine = EngineSpec(network="flow")
    cfg.out_dir = str(tmp_path / "run")
    return cfg


def test_a_receive_then_a_send_to_the_same_peer_on_both_ranks_deadlocks_as_on_nccl(tmp_path: Path):
    """Both ranks (GPUs 0 and 1 of an H100 host) irecv, then isend 256 KiB to each other, unbatched: both run on the
    pair's communicator and its one NCCL stream, so each send's kernel waits behind its own receive's, which waits
    for the peer's send: NCCL hangs (hence batch_isend_irecv). Until this change the send, on no stream, handed off
    at t0 + 14,981 ns and the program ran. Now the report names each rank's held receive."""
    with pytest.raises(BridgeError) as info:
        launch(_order(tmp_path, "recv_first"))
    text = str(info.value)
    assert text.startswith("deadlock") and "'recv#0'" in text and "held behind an earlier call" in text, text


def test_a_send_behind_a_receive_on_its_stream_hands_off_after_the_receive(tmp_path: Path):
    """Rank 0 irecv, then isend 256 KiB to rank 1, which sends first, then receives: NCCL runs it, the send's kernel
    after the receive's. Rank 1's send, issued at max(t0, h), hands off 14,981 ns later; rank 0's receive ends with
    that send's flow, NCCL's lone p2p (14,982 ns, rounded up), and rank 0's send hands off 14,981 ns later (14,981 ns
    after its issue before)."""
    rep = launch(_order(tmp_path, "one_recv_first"))
    t0, t1 = _times(rep.logs["rank 1"])
    assert t1 - max(t0, H) == NVL, (t0, t1)
    flow = next(c for c in rep.cosim.completions if c.size and (c.src, c.dst) == (1, 0))
    s0, s1 = _times(rep.logs["rank 0"])
    assert s0 == t0 and flow.end_ns == max(t0, H) + NVL + 1 and s1 == flow.end_ns + NVL, (s0, s1, flow)


def test_sends_to_one_peer_from_two_cuda_streams_hand_off_in_their_nccl_streams_order(tmp_path: Path):
    """Both ranks: on a side stream a sync all-reduce, then isend 256 KiB; then from the default stream isend 256 KiB
    more to the same peer. Both sends run on the pair's NCCL stream in issue order, so the second's kernel starts at
    the first's hand-off (the all-reduce's end + 14,981 ns): its wait returns at the all-reduce's end + 2 x 14,981 ns
    (before: at t0 + 14,981, ahead of the first). Each rank receives both, in order."""
    rep = launch(_order(tmp_path, "two_streams"))
    fabric = [c for c in rep.cosim.completions if c.size]
    for me in (0, 1):
        t0, t1 = _times(rep.logs[f"rank {me}"])
        ar_end = max(c.end_ns for c in fabric if c.size < 64 * KIB and me in (c.src, c.dst))  # not the sends' parts
        assert t1 == ar_end + 2 * NVL, (t0, t1, ar_end)
