"""A registered zero-copy send does not hand off: it waits for its receiver (collectives/handoff.py, `Slots.zero_copy`).

NCCL 2.24+ (enqueue.cc `addP2pToPlan`, read at v2.24.3-1 and v2.29.7-1) moves a Simple send between registered
buffers with no copy through its slots where `register.p2p_zero_copy` says so: inside a host over a P2P connection
the sender writes into the receiver's buffer once the receiver's kernel has posted its address (prims_simple.h
`setDataPtrs`: the send side spins on `ptrExchange`); across hosts, without PXN, its proxy sends from the user buffer
and the kernel waits until it has (`~Primitives`, NetRegMode). So such a send ends with its transfer, which starts
when its receiver is posted. PXN (on by default when the communicator has more than one GPU on a host of NVLink
GPUs: under eager init the lone send runs on the group's communicator) rules NET registration out, so there the send
still hands off; NCCL_PXN_DISABLE=1 brings it back.

Closed forms on testbed16 (H100, 16 NVLink channels between GPUs 0 and 1, 4 network channels from GPU 0 to 8 on
400 Gbps NICs), 1 MiB:
- hand-off inside a host: 8.4 + 3.4 us + 1 MiB / (16 x 20.6 GB/s) = 14,981 ns (tests/test_handoff_transports.py);
  the transfer is NCCL's lone p2p, the same 14,981.4 ns, which the flows end at (rounded up: 14,982);
- hand-off across hosts: 8.4 us + 4 proxy ops of 1.0 us + 1 MiB / (4 x 20.6 GB/s) = 25,125 ns; the transfer:
  8.4 us + 14 us network + 4 channels x 2 proxy ops of 1.0 us = 30.4 us, then 1 MiB at the NIC's 50 GB/s:
  51,371.5 ns (51,372).
The sender's first send is its first NCCL call: issued at max(its CUDA event, h), once its host (from 0) has
launched it (runtime/nccl_launch.py); its second one's launch hides behind the first's hand-off.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from phantora.collectives.handoff import handoff_ns, send_slots
from phantora.collectives.nccl.host_launch import DEFAULT_BATCHES, host_launch_us
from phantora.collectives.spec import AlgoOptions
from phantora.egraph import replay_graph
from phantora.egraph.builder import ProgramBuilder
from phantora.egraph.format import EAGER_STREAM, P2P, Program, Wait, assemble
from phantora.errors import InputError
from phantora.launcher import RunConfig, launch
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology

KIB = 1024
MIB = 1024 * KIB
NVL_HANDOFF = round(8_400 + 3_400 + MIB / (16 * 20.6))  # 14,981 ns
NVL_TRANSFER = 14_982  # NCCL's lone p2p inside the host, 14,981.4 ns, as the flows end (whole ns, rounded up)
NET_HANDOFF = round(8_400 + 4 * 1_000 + MIB / (4 * 20.6))  # 25,125 ns
NET_TRANSFER = 51_372  # 30,400 ns + 1 MiB / 50 GB/s = 51,371.5 ns, rounded up
H = round(host_launch_us(DEFAULT_BATCHES) * 1000)  # the host's launch of a call
REG = (("PHANTORA_NCCL_REGISTER", "1"),)
WORLD = tuple(range(16))


def _algo(env: tuple[tuple[str, str], ...] = ()) -> AlgoOptions:
    return dataclasses.replace(AlgoOptions(), nccl_env=env)


def test_the_closed_forms():
    assert (NVL_HANDOFF, NET_HANDOFF) == (14_981, 25_125)
    assert NVL_TRANSFER == math.ceil(11_800 + MIB / (16 * 20.6))
    assert NET_TRANSFER == math.ceil(30_400 + MIB / 50)


def test_the_slots_say_zero_copy_where_nccl_registers_the_send():
    topo = load_topology("testbed16")
    plain = send_slots(topo, _algo(), {}, 0, 1, MIB)
    reg = send_slots(topo, _algo(REG), {}, 0, 1, MIB)
    assert plain is not None and plain.fits and not plain.zero_copy
    assert reg is not None and reg.zero_copy and not reg.fits and reg.steps == plain.steps
    assert handoff_ns(topo, _algo(REG), {}, 0, 1, MIB) == NVL_HANDOFF  # the time is the same; only the wait changes
    small = send_slots(topo, _algo(REG), {}, 0, 1, 4 * KIB)  # LL: copied through the receiver's slots
    assert small is not None and small.fits
    old = send_slots(topo, _algo((*REG, ("PHANTORA_NCCL_VERSION", "2.23"))), {}, 0, 1, MIB)  # before sendrecv_reg.cc
    assert old is not None and old.fits
    off = send_slots(topo, _algo((*REG, ("NCCL_LOCAL_REGISTER", "0"))), {}, 0, 1, MIB)
    assert off is not None and off.fits


@pytest.mark.parametrize(
    ("env", "comm", "zero_copy"),
    [
        (REG, (), True),  # the pair's own communicator: one GPU a host, no PXN
        (REG, WORLD, False),  # the world's (eager init): 8 GPUs a NVLink host, PXN in use
        ((*REG, ("NCCL_PXN_DISABLE", "1")), WORLD, True),
        ((), WORLD, False),
    ],
)
def test_across_hosts_pxn_on_the_communicator_keeps_the_hand_off(env, comm, zero_copy: bool):
    topo = load_topology("testbed16")
    slots = send_slots(topo, _algo(env), {}, 0, 8, MIB, comm)
    assert slots is not None and slots.zero_copy == zero_copy and slots.fits == (not zero_copy)
    assert handoff_ns(topo, _algo(env), {}, 0, 8, MIB, comm) == NET_HANDOFF


LONE = """
    import os, sys, torch, torch.distributed as dist
    src, dst, n, eager = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "eager"
    dist.init_process_group(device_id=torch.device("cuda", 0) if eager else None)
    r = dist.get_rank()

    def exchange(group):
        if r == src:
            x = torch.ones(n, dtype=torch.uint8, device="cuda")
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            dist.send(x, dst, group=group)
            e1.record()
            print("SEND", e0.t_ns, e1.t_ns, flush=True)
        elif r == dst:
            box = torch.zeros(n, dtype=torch.uint8, device="cuda")
            a = torch.ones(2048, 2048, device="cuda")
            for _ in range(4):
                a = a @ a  # the receiver is late
            e = torch.cuda.Event(enable_timing=True)
            e.record()  # the receive starts here, after the matmuls on its stream
            dist.recv(box, src, group=group)
            print("POST", e.t_ns, flush=True)

    exchange(None)
    for kv in sys.argv[5:]:  # NCCL variables of a second group's communicator (runtime/program_env.py)
        k, v = kv.split("=")
        os.environ[k] = v
    exchange(dist.new_group(list(range(dist.get_world_size()))))
    dist.destroy_process_group()
"""


def _lone(tmp_path: Path, src: int, dst: int, nproc: int, eager: bool, second: list[str], env: dict[str, str]):
    script = tmp_path / "lone.py"
    script.write_text(textwrap.dedent(LONE))
    args = [str(src), str(dst), str(MIB), "eager" if eager else "lazy", *second]
    cfg = RunConfig(
        str(script), args, topology=load_topology("testbed16"), nproc=nproc, trace="none", timeout_s=240,
        tensors="phantom", dedup="off", env=env,
    )  # fmt: skip
    cfg.out_dir = str(tmp_path / "run")
    rep = launch(cfg)
    sends = [[int(v) for v in x.split()[1:]] for x in rep.logs[f"rank {src}"].splitlines() if x.startswith("SEND")]
    posts = [int(x.split()[1]) for x in rep.logs[f"rank {dst}"].splitlines() if x.startswith("POST")]
    assert len(sends) == len(posts) == 2, (sends, posts)
    return sends, posts


def test_inside_a_host_a_registered_send_ends_at_its_receivers_post_plus_its_transfer(tmp_path: Path):
    """testbed16 GPU 0 -> 1, 1 MiB to a late receiver: unregistered it hands off at 14,981 ns; on a second group
    created under PHANTORA_NCCL_REGISTER=1 it ends at the receiver's post + 14,982 ns, long after."""
    sends, posts = _lone(tmp_path, 0, 1, 2, False, ["PHANTORA_NCCL_REGISTER=1"], {})
    (s0, e0), (s1, e1) = sends
    assert e0 - max(s0, H) == NVL_HANDOFF and e0 < posts[0], (sends, posts)
    assert e1 - posts[1] == NVL_TRANSFER and posts[1] > s1 + NVL_HANDOFF, (sends, posts)


@pytest.mark.slow
def test_across_hosts_a_registered_send_hands_off_under_pxn_and_waits_without(tmp_path: Path):
    """testbed16 GPU 0 -> 8 under eager init (the lone sends run on their group's 16-rank communicator, 8 GPUs a
    host) and PHANTORA_NCCL_REGISTER=1: PXN is in use, so NCCL does not register the send and it hands off at
    25,125 ns; on a second group created under NCCL_PXN_DISABLE=1 it ends at the receiver's post + 51,372 ns."""
    env = {"PHANTORA_NCCL_REGISTER": "1"}
    sends, posts = _lone(tmp_path, 0, 8, 16, True, ["NCCL_PXN_DISABLE=1"], env)
    (s0, e0), (s1, e1) = sends
    assert e0 - max(s0, H) == NET_HANDOFF and e0 < posts[0], (sends, posts)
    assert e1 - posts[1] == NET_TRANSFER and posts[1] > s1 + NET_HANDOFF, (sends, posts)


def test_two_ranks_sending_first_registered_inside_a_host_deadlock_as_on_nccl(tmp_path: Path):
    """Both ranks send 1 MiB first (it fits the 16 x 8 slots: unregistered both hand off, tests/test_eager_send.py)
    on registered buffers: each send waits for a receive the peer issues only after its own send, so NCCL hangs and
    the run reports the deadlock naming the send."""
    script = tmp_path / "first.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist
            dist.init_process_group()
            peer = 1 - dist.get_rank()
            x = torch.ones(1 << 20, dtype=torch.uint8, device="cuda")
            box = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
            dist.send(x, peer)
            dist.recv(box, peer)
            print("EXCHANGED", flush=True)
            dist.destroy_process_group()
            """
        )
    )
    base = dict(topology=load_topology("testbed16"), nproc=2, trace="none", timeout_s=240, tensors="phantom")
    rep = launch(RunConfig(str(script), [], **base, out_dir=str(tmp_path / "plain")))
    assert "EXCHANGED" in rep.logs["rank 0"] and "EXCHANGED" in rep.logs["rank 1"]
    env = {"PHANTORA_NCCL_REGISTER": "1"}
    with pytest.raises(BridgeError) as info:
        launch(RunConfig(str(script), [], **base, out_dir=str(tmp_path / "reg"), env=env))
    text = str(info.value)
    assert text.startswith("deadlock") and "send#0" in text, text


def _program(world: int, src: int, dst: int, late_ns: int, comm: tuple[int, ...] | None = None, first: bool = False):
    """Rank `src` sends 1 MiB to `dst` and waits for its hand-off (a lone send as recorded, on communicator `comm`:
    None, the pair's own); `dst` receives it after `late_ns` of compute. `first`: both ranks send first, then
    receive (each send waited at its hand-off)."""
    parts = []
    for me in range(world):
        b = ProgramBuilder(me)
        if me in (src, dst) and first:
            peer = dst if me == src else src
            b.wait([b.p2p(peer, True, MIB, comm=comm)], handoff=True)
            b.wait([b.p2p(peer, False, MIB)])
        elif me == src:
            b.wait([b.p2p(dst, True, MIB, comm=comm)], handoff=True)
        elif me == dst:
            b.compute("late", late_ns)
            b.wait([b.p2p(src, False, MIB)])
        b.step()
        prog, groups = b.build()
        parts.append((Program.decode(prog.encode()), groups))
    return assemble(parts)


def _replay(graph, env: tuple[tuple[str, str], ...]) -> tuple[list[int], int]:
    """The hand-off markers' ends on the sender (rank 0) and its end."""
    topo = load_topology("testbed16")
    res = replay_graph(graph, topo, FlowSimulator(topo), _algo(env))
    handed = sorted(c.end_ns for c in res.completions if c.tag.startswith("r0/handoff"))
    return handed, res.rank_end_ns[0]


LATE = 100_000


def test_a_replay_decides_inside_a_host_as_the_live_run():
    """The lone send recorded with its hand-off wait: unregistered it hands off at 14,981 ns; replayed under
    PHANTORA_NCCL_REGISTER=1 it ends at its receiver's post + 14,982 ns; both ranks sending first deadlocks."""
    graph = _program(2, 0, 1, LATE)
    assert _replay(graph, ()) == ([NVL_HANDOFF], NVL_HANDOFF)
    assert _replay(graph, REG) == ([], LATE + NVL_TRANSFER)
    assert _replay(_program(2, 0, 1, 0, first=True), ())[0] == [NVL_HANDOFF]
    with pytest.raises(InputError, match="deadlocks"):
        _replay(_program(2, 0, 1, 0, first=True), REG)


def test_a_replay_decides_pxn_on_the_recorded_communicator_and_chakra_keeps_it(tmp_path: Path):
    """GPU 0 -> 8 registered: on the world's communicator (P2P.comm, node type 9; Chakra's phantora_comm) PXN is in
    use and the send hands off at 25,125 ns; with NCCL_PXN_DISABLE=1, or on the pair's own communicator, it ends at
    its receiver's post + 51,372 ns."""
    from phantora.egraph.chakra import export_chakra, read_chakra

    graph = _program(16, 0, 8, LATE, WORLD)
    prog = graph.program_of(0)
    send = next(n for n in prog.nodes if isinstance(n, P2P))
    assert send.comm >= 0 and graph.groups[graph.ranks[0].groups[send.comm]] == WORLD
    import msgpack

    assert [r[0] for r in msgpack.unpackb(prog.encode())["nodes"] if r[0] in (2, 6, 8, 9)] == [9]
    assert Program.decode(prog.encode()).nodes == prog.nodes
    export_chakra(graph, tmp_path / "chakra")
    back = read_chakra(tmp_path / "chakra")
    for g in (graph, back):
        assert _replay(g, REG) == ([NET_HANDOFF], NET_HANDOFF)
        assert _replay(g, (*REG, ("NCCL_PXN_DISABLE", "1"))) == ([], LATE + NET_TRANSFER)
    assert _replay(_program(16, 0, 8, LATE), REG) == ([], LATE + NET_TRANSFER)
    assert _replay(_program(16, 0, 8, LATE), ()) == ([NET_HANDOFF], NET_HANDOFF)


def test_a_communicator_that_does_not_hold_its_transfer_is_named():
    b = ProgramBuilder(0)
    b.wait([b.p2p(1, True, MIB, comm=(0, 2, 3))], handoff=True)
    other = [ProgramBuilder(r) for r in (1, 2, 3)]
    other[0].wait([other[0].p2p(0, False, MIB)])
    parts = [x.build() for x in (b, *other)]
    with pytest.raises(InputError, match="communicator does not hold"):
        assemble(parts).check()


def test_a_jobs_handoff_names_its_communicator_in_global_ranks():
    """Several jobs: a job's `handoff` (and `p2p`) names its communicator in job ranks; the coordinator takes it in
    global ones, as it does the peer (bridge/jobs.py)."""
    from bridge.jobs import JobTable
    from bridge.protocol import Message

    table = JobTable([{"name": "a", "offset": 0, "ranks": 4}, {"name": "b", "offset": 4, "ranks": 4}])
    msg = Message("handoff", 0, {"peer": 1, "nbytes": MIB, "comm": [0, 1, 2, 3]})
    table.translate(msg, 1)
    assert msg["peer"] == 5 and msg["comm"] == [4, 5, 6, 7]


@pytest.mark.slow
def test_a_recorded_eager_init_run_keeps_the_communicator_and_replays_to_its_ends(tmp_path: Path):
    """The cross-host run above, recorded: under eager init each lone send runs as a one-op NCCL group on its
    group's communicator (both groups hold the world), as live (the backend opens a p2p group of one; the coordinator
    rates it on that communicator), so both keep the world's communicator (P2P.comm), each its own launch (P2P.launch,
    2a9b03a); the first is handed off under PXN (its hand-off mark), the second, under NCCL_PXN_DISABLE=1, zero-copy,
    is not; and the graph replays to the live ends."""
    from phantora.egraph.live import record_run

    script = tmp_path / "lone.py"
    script.write_text(textwrap.dedent(LONE))
    args = ["0", "8", str(MIB), "eager", "NCCL_PXN_DISABLE=1"]
    cfg = RunConfig(
        str(script), args, load_topology("testbed16"), nproc=16, timeout_s=240, tensors="phantom", dedup="off",
        env={"PHANTORA_NCCL_REGISTER": "1"},
    )  # fmt: skip
    rep, graph = record_run(cfg, tmp_path / "g")
    nodes = list(graph.program_of(0).nodes)
    sends = [n for n in nodes if isinstance(n, P2P) and n.is_send]
    assert len(sends) == 2 and sends[0].comm == sends[1].comm >= 0, sends
    assert 0 <= sends[0].launch != sends[1].launch >= 0, sends
    assert sends[0].nccl_env is None and ("NCCL_PXN_DISABLE", "1") in (sends[1].nccl_env or ()), sends
    marked = [n.refs for n in nodes if isinstance(n, Wait) and n.handoff and n.stream == EAGER_STREAM]
    assert marked == [(nodes.index(sends[0]),)], marked  # the first send alone is handed off
    assert graph.groups[graph.ranks[0].groups[sends[0].comm]] == WORLD
    res = replay_graph(graph, load_topology("testbed16"), FlowSimulator(load_topology("testbed16")))
    assert res.rank_end_ns == graph.recorded["end_ns"], (res.rank_end_ns, graph.recorded)
    handed = sorted(c.end_ns for c in res.completions if c.tag.startswith("r0/handoff"))
    assert len(handed) == 1, handed
