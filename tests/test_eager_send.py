"""A lone send NCCL finishes into its peer's buffer does not hold its stream: two ranks that both send first run.

NCCL's sender kernel waits only for a free slot of its connection's NCCL_STEPS buffer slots, so a send of at most
NCCL_STEPS p2p steps a channel ends before the matching receive starts, and a program whose two ranks both isend, then
irecv, runs (a larger send really does hang, and the coordinator reports the deadlock). Here one net channel of
128 KiB steps: 1 MiB (tests/test_handoff_eager_limit.py has the limit per transport).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import msgpack
import pytest

from bridge.errors import BridgeError
from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from phantora.launcher import RunConfig, launch
from phantora.topology.generators import leaf_spine

KIB = 1024
HANDOFF = 22_125  # ns: a 256 KiB send's hand-off between two hosts (the closed form below)
H = round(host_launch_us(DEFAULT_BATCHES) * 1000)  # the host's launch of a call (runtime/nccl_launch.py)

SEND_FIRST = """
    import sys, torch, torch.distributed as dist
    n = int(sys.argv[1])
    dist.init_process_group()
    r = dist.get_rank()
    peer = 1 - r
    box = torch.zeros(n)
    reqs = [dist.isend(torch.full((n,), float(r + 1)), peer), dist.irecv(box, peer)]  # both ranks send first
    for q in reqs:
        q.wait()
    assert float(box[0]) == peer + 1 and float(box[-1]) == peer + 1, box[:4]
    print("EXCHANGED", flush=True)
    dist.destroy_process_group()
"""


def _run(tmp_path: Path, floats: int):
    script = tmp_path / "send_first.py"
    script.write_text(textwrap.dedent(SEND_FIRST))
    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    return launch(RunConfig(str(script), [str(floats)], topology=topo, nproc=2, trace="none", timeout_s=240))


def test_two_ranks_sending_a_small_tensor_first_both_finish(tmp_path: Path):
    rep = _run(tmp_path, 64 * KIB)  # 256 KiB: within the 1 MiB a connection buffers
    assert "EXCHANGED" in rep.logs["rank 0"] and "EXCHANGED" in rep.logs["rank 1"]


def test_two_ranks_sending_past_the_buffer_first_deadlock_as_on_nccl(tmp_path: Path):
    with pytest.raises(BridgeError) as info:
        _run(tmp_path, 1024 * KIB)  # 4 MiB: past the buffer, NCCL's sender waits for the receiver too
    assert str(info.value).startswith("deadlock"), str(info.value)


SEND_THEN_RECV = """
    import sys, torch, torch.distributed as dist
    n = int(sys.argv[1])
    dist.init_process_group()
    r = dist.get_rank()
    peer = 1 - r
    box = torch.zeros(n, device="cuda")
    x = torch.full((n,), float(r + 1), device="cuda")
    e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    e0.record()
    dist.send(x, peer)  # both ranks send first, synchronously: isend + wait on the default stream
    e1.record()
    x.fill_(-1.0)  # the send's bytes sit in its connection: overwriting the tensor now changes nothing sent
    dist.recv(box, peer)
    e2.record()
    assert float(box[0]) == peer + 1 and float(box[-1]) == peer + 1, box[:4]
    print("TIMES", e0.t_ns, e1.t_ns, e2.t_ns, flush=True)
    dist.destroy_process_group()
"""


def _sync_config(tmp_path: Path, floats: int) -> RunConfig:
    script = tmp_path / "send_then_recv.py"
    script.write_text(textwrap.dedent(SEND_THEN_RECV))
    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    cfg = RunConfig(str(script), [str(floats)], topology=topo, nproc=2, trace="none", timeout_s=240)
    cfg.out_dir = str(tmp_path / "run")  # a kept run records its flows
    return cfg


@pytest.fixture(scope="module")
def sync_256k(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(report, graph): SEND_THEN_RECV with 256 KiB run live once with `--record` (the recorder wraps the ranks; the
    report is the live run's), shared by the live hand-off check and the replay's."""
    from phantora.egraph.live import record_run

    tmp = tmp_path_factory.mktemp("sync")
    return record_run(_sync_config(tmp, 64 * KIB), tmp / "g")


def _times(log: str) -> tuple[int, int, int]:
    line = next(x for x in log.splitlines() if x.startswith("TIMES"))
    t0, t1, t2 = (int(v) for v in line.split()[1:])
    return t0, t1, t2


def test_synchronous_sends_first_run_and_end_at_their_hand_off(sync_256k: tuple[Any, Any]):
    """`dist.send` then `dist.recv` on both ranks, 256 KiB: each send's wait returns at its hand-off, when NCCL's send
    kernel has copied its bytes into its proxy's buffer (collectives/handoff.py, NET): Simple's ring base latency
    8.4 us + its own proxy op of 1 us (one channel, Intel host), then 262,144 B at one channel's 20.6 GB/s (Hopper);
    not the network's 14.0 us, the receiving proxy's op or the NIC's 12.5 GB/s (45,372 ns, the lone transfer). The
    send is the rank's first NCCL call: issued at max(t0, h), once the host (from 0) has launched it. Each receive
    ends with its flow, which runs once both ends are in (the receive is issued at the hand-off; its launch, at 2 h,
    hides behind it)."""
    nbytes = 64 * KIB * 4
    rep, _ = sync_256k
    handoff = round((8.4 + 1.0) * 1000 + nbytes / 20.6)
    assert handoff == HANDOFF == 22_125
    flows = {(c.src, c.dst): c for c in rep.cosim.completions}
    for me in (0, 1):
        t0, t1, t2 = _times(rep.logs[f"rank {me}"])
        assert t1 - max(t0, H) == handoff, (t0, t1)
        mine = flows[(1 - me, me)]  # the peer's send to me
        assert t1 < mine.start_ns and t2 == mine.end_ns, (mine, t1, t2)  # it ran after the receive was issued


def test_synchronous_sends_past_the_buffer_first_deadlock_naming_the_send(tmp_path: Path):
    with pytest.raises(BridgeError) as info:
        launch(_sync_config(tmp_path, 1024 * KIB))  # 4 MiB: NCCL's send kernel waits for the receiver, which waits too
    text = str(info.value)
    assert text.startswith("deadlock") and "send#0" in text, text


def _send_first_graph(handoff: bool):
    """Both ranks: 1 us of compute, send 256 KiB to the other, wait (at the hand-off, or for the flow), receive."""
    from phantora.egraph.builder import ProgramBuilder
    from phantora.egraph.format import Program, assemble

    parts = []
    for me in (0, 1):
        b = ProgramBuilder(me)
        b.compute("work", 1000)
        s = b.p2p(1 - me, True, 256 * KIB)
        b.wait([s], handoff=handoff)
        b.wait([b.p2p(1 - me, False, 256 * KIB)])
        prog, groups = b.build()
        parts.append((Program.decode(prog.encode()), groups))  # through the on-disk rows (type 7)
    return assemble(parts)


def test_a_replayed_hand_off_wait_ends_at_the_hand_off_and_the_receive_at_its_flow():
    """The replay's closed form, as the live test's: the send's wait ends 22,125 ns after its issue (1 us), the
    receive's at its flow's end; waiting for the send's flow instead deadlocks, as the live run did before d44cc74."""
    from phantora.egraph import replay_graph
    from phantora.errors import InputError
    from phantora.netsim.flow import FlowSimulator

    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    res = replay_graph(_send_first_graph(True), topo, FlowSimulator(topo))
    end = {c.tag: c for c in res.completions}
    flows = {(c.src, c.dst): c for c in res.completions if c.size}
    for me in (0, 1):
        assert end[f"r{me}/wait2"].end_ns == 1000 + HANDOFF
        mine = flows[(1 - me, me)]
        assert mine.start_ns >= 1000 + HANDOFF and end[f"r{me}/wait4"].end_ns == mine.end_ns == res.rank_end_ns[me]
    with pytest.raises(InputError, match="deadlocks"):
        replay_graph(_send_first_graph(False), topo, FlowSimulator(topo))


def test_a_hand_off_wait_on_a_receive_is_refused_naming_the_node():
    from phantora.egraph.format import T_WAIT_HANDOFF, Program
    from phantora.errors import InputError

    rows = [[2, 0, 0, 0, 0, 1024, 0], [T_WAIT_HANDOFF, 0, [0]]]  # a recv, then a hand-off wait on it
    data = msgpack.packb({"v": 1, "names": [], "nodes": rows})
    with pytest.raises(InputError, match=r"nodes\[1\].*not a send|not a send.*nodes\[1\]"):
        Program.decode(data, "p0.msgpack")


def test_a_recorded_send_first_program_replays_as_it_ran(sync_256k: tuple[Any, Any]):
    """`phantora run --record` of SEND_THEN_RECV (256 KiB), then replay on the same network: no deadlock, each
    send's wait ends at its hand-off (issue + 22,125 ns, the live CUDA event), the receive's at its live event,
    each rank at the live run's end. The only idle time recorded is the host's launch of the send, h - t0 (its
    compute lane waited for it: the rank's `nccl_host_launch` idle time)."""
    from phantora.egraph import replay_graph
    from phantora.netsim.flow import FlowSimulator

    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    rep, graph = sync_256k
    launch_idle = [max(0, H - _times(rep.logs[f"rank {me}"])[0]) for me in (0, 1)]
    assert graph.recorded is not None and graph.recorded["idle_ns"] == launch_idle
    assert [r["nccl_host_launch"]["idle_ns"] for r in rep.summary["ranks"]] == launch_idle
    res = replay_graph(graph, topo, FlowSimulator(topo))
    end = {c.tag: c.end_ns for c in res.completions}
    for me in (0, 1):
        t0, t1, t2 = _times(rep.logs[f"rank {me}"])
        handed = [t for tag, t in end.items() if tag.startswith(f"r{me}/handoff")]
        assert t1 - max(t0, H) == HANDOFF and handed == [t1], (t0, t1, end)
        waits = {t for tag, t in end.items() if tag.startswith(f"r{me}/wait")}
        assert t2 in waits and res.rank_end_ns[me] == graph.recorded["end_ns"][me], (t2, waits, res.rank_end_ns)


def test_a_hand_off_wait_survives_a_chakra_round_trip(tmp_path: Path):
    """Exported to Chakra and read back, the send's wait still ends at the hand-off (1,000 + 22,125 ns), so the
    read-back graph replays instead of deadlocking (a plain wait there would)."""
    from phantora.egraph import replay_graph
    from phantora.egraph.chakra import export_chakra, read_chakra
    from phantora.netsim.flow import FlowSimulator

    export_chakra(_send_first_graph(True), tmp_path)
    topo = leaf_spine(1, 2, 1, nic_rate="100Gbps")
    res = replay_graph(read_chakra(tmp_path), topo, FlowSimulator(topo))
    end = {c.tag: c for c in res.completions}
    assert [end[f"r{me}/wait2"].end_ns for me in (0, 1)] == [1000 + HANDOFF] * 2
