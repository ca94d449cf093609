"""Lone sends share their connection's slots only on one communicator (runtime/session.py `_windows`, egraph replay's
`windows`, both keyed by (communicator, peer)).

ProcessGroupNCCL keeps its communicators and their streams per process group (ProcessGroupNCCL.hpp:
`devNCCLCommMap_` and `ncclStreams_` are members, an unbatched send/recv's key the "low:high" pair of ranks), so two
groups over the same two ranks have two 2-rank communicators, each with its own channels, NCCL_STEPS slots and proxy
ops. A send that alone fills its window on one of them does not hold a send on the other.

Closed forms (tests/test_handoff_transports.py): 64 MiB over H100 NVLink fills 16 channels x 8 slots x 512 KiB and
hands off at 8.4 + 3.4 us + 64 MiB / (16 x 20.6 GB/s) = 215,407 ns; 1 MiB across one network channel fills its
8 x 128 KiB and hands off at 8.4 us + one 1 us proxy op + 1 MiB / 20.6 GB/s = 60,302 ns.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from bridge.errors import BridgeError
from phantora.collectives.handoff import send_slots
from phantora.collectives.spec import AlgoOptions
from phantora.egraph import replay_graph
from phantora.egraph.builder import ProgramBuilder
from phantora.egraph.format import P2P, Program, assemble
from phantora.errors import InputError
from phantora.launcher import RunConfig, launch
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology
from phantora.topology.generators import leaf_spine

KIB = 1024
MIB = 1024 * KIB
NVL_64M = round(11_800 + 64 * MIB / (16 * 20.6))  # 215,407 ns
NET_1M = round(9_400 + MIB / 20.6)  # 60,302 ns


def _cross() -> object:
    return leaf_spine(1, 2, 1, nic_rate="100Gbps")


def test_each_send_alone_fills_its_window():
    """The sizes below are each their connection's whole window: a second such send on one connection waits."""
    nvl = send_slots(load_topology("testbed16"), AlgoOptions(), {}, 0, 1, 64 * MIB)
    net = send_slots(_cross(), AlgoOptions(), {}, 0, 1, MIB)
    assert nvl is not None and nvl.steps == (8,) * 16 and not nvl.one_op
    assert net is not None and net.steps == (8,) and net.one_op


SENDS = """
    import sys, torch, torch.distributed as dist
    groups, n, eager = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "eager"
    dist.init_process_group(device_id=torch.device("cuda", 0) if eager else None)
    r = dist.get_rank()
    peer = 1 - r
    other = dist.new_group([0, 1]) if groups == "two" else None  # None: the world's communicator again
    x, y = (torch.ones(n, dtype=torch.uint8, device="cuda") for _ in range(2))
    bx, by = (torch.zeros(n, dtype=torch.uint8, device="cuda") for _ in range(2))
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    ev[0].record()
    dist.send(x, peer)  # the world's pair communicator (its own under eager init)
    ev[1].record()
    dist.send(y, peer, group=other)
    ev[2].record()
    dist.recv(bx, peer)
    dist.recv(by, peer, group=other)
    print("TIMES", *[e.t_ns for e in ev], flush=True)
    dist.destroy_process_group()
"""


def _config(tmp_path: Path, topo: object, groups: str, nbytes: int, eager: bool, network: str) -> RunConfig:
    script = tmp_path / "sends.py"
    script.write_text(textwrap.dedent(SENDS))
    args = [groups, str(nbytes), "eager" if eager else "lazy"]
    cfg = RunConfig(str(script), args, topology=topo, nproc=2, trace="none", timeout_s=240, tensors="phantom")
    cfg.engine = EngineSpec(network=network)
    cfg.out_dir = str(tmp_path / f"run-{groups}-{network}")
    return cfg


def _run(tmp_path: Path, topo: object, groups: str, nbytes: int, eager: bool = False, network: str = "flow"):
    return launch(_config(tmp_path, topo, groups, nbytes, eager, network))


@pytest.fixture(scope="module")
def cross_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(report, graph): `SENDS` with two groups, 1 MiB across one network channel, run live once with `--record`
    (the recorder wraps the ranks; the report is the live run's), shared by the live hand-off check and the
    recording's."""
    from phantora.egraph.live import record_run

    tmp = tmp_path_factory.mktemp("cross-two")
    return record_run(_config(tmp, _cross(), "two", MIB, False, "flow"), tmp / "g")


def _gaps(log: str) -> tuple[int, int]:
    t0, t1, t2 = (int(v) for v in next(x for x in log.splitlines() if x.startswith("TIMES")).split()[1:])
    return t1 - t0, t2 - t1


@pytest.mark.parametrize("eager", [False, True], ids=["pair-comms", "eager-init"])
def test_two_groups_each_send_64_mib_first_over_nvlink_and_both_hand_off(tmp_path: Path, eager: bool):
    """testbed16 GPU 0 <-> 1: each rank sends 64 MiB on the world, then 64 MiB on a second group, then receives both.
    Each send fills its own communicator's 16 x 8 slots, so both hand off at 215,407 ns, before either receive (with
    one window per peer the second waited for the first's flow, whose receive comes after it: a deadlock). Under
    eager init (device_id) the lone sends run on each group's own communicator: the same."""
    rep = _run(tmp_path, load_topology("testbed16"), "two", 64 * MIB, eager)
    for me in (0, 1):
        assert _gaps(rep.logs[f"rank {me}"]) == (NVL_64M, NVL_64M) == (215_407, 215_407)


def test_the_same_two_sends_in_one_group_still_deadlock(tmp_path: Path):
    """Both 64 MiB sends on the world's communicator: the second needs the first's slots, which the peer frees only
    after its own second send: NCCL hangs, and so does the run (the report names the held send)."""
    with pytest.raises(BridgeError) as info:
        _run(tmp_path, load_topology("testbed16"), "one", 64 * MIB)
    text = str(info.value)
    assert text.startswith("deadlock") and "send#0" in text, text


def test_two_groups_each_send_1_mib_first_across_one_network_channel_and_both_hand_off(
    cross_two: tuple[Any, Any], tmp_path: Path
):
    """Two one-GPU hosts: 1 MiB fills the one channel's 8 x 128 KiB; each communicator has its own proxy, so the
    second send does not queue behind the first: both hand off at 60,302 ns. In one group the second waits behind the
    first in the proxy (tests/test_handoff_slots.py): a deadlock."""
    rep, _ = cross_two
    for me in (0, 1):
        assert _gaps(rep.logs[f"rank {me}"]) == (NET_1M, NET_1M) == (60_302, 60_302)
    with pytest.raises(BridgeError, match="^deadlock"):
        _run(tmp_path, _cross(), "one", MIB)


@pytest.mark.slow
def test_two_groups_across_one_network_channel_hand_off_on_ns3(tmp_path: Path):
    """The same on the packet network: a hand-off is its sender's kernel, so the same 60,302 ns."""
    rep = _run(tmp_path, _cross(), "two", MIB, network="ns3")
    for me in (0, 1):
        assert _gaps(rep.logs[f"rank {me}"]) == (NET_1M, NET_1M)


def _program(conns: tuple[int, int], nbytes: int):
    """Each rank sends `nbytes` on communicator conns[0], then on conns[1] (each waited at its hand-off), then
    receives both."""
    parts = []
    for me in (0, 1):
        b = ProgramBuilder(me)
        for c in conns:
            b.wait([b.p2p(1 - me, True, nbytes, tag=c, conn=c)], handoff=True)
        for c in conns:
            b.wait([b.p2p(1 - me, False, nbytes, tag=c, conn=c)])
        prog, groups = b.build()
        parts.append((Program.decode(prog.encode()), groups))
    return assemble(parts)


def test_a_replay_keys_the_windows_by_communicator_and_chakra_keeps_it(tmp_path: Path):
    """The program above across one channel: sends on communicators 0 and 1 both hand off, at 60,302 and 120,604 ns,
    the same after a Chakra export and read-back (`phantora_conn`); on one communicator the replay deadlocks."""
    from phantora.egraph.chakra import export_chakra, read_chakra

    topo = _cross()
    graph = _program((0, 1), MIB)
    sends = [n for n in graph.programs[0].nodes if isinstance(n, P2P) and n.is_send]
    assert [n.conn for n in sends] == [0, 1]
    export_chakra(graph, tmp_path / "chakra")
    back = read_chakra(tmp_path / "chakra")
    assert [n.conn for n in back.programs[0].nodes if isinstance(n, P2P) and n.is_send] == [0, 1]
    for g in (graph, back):
        res = replay_graph(g, topo, FlowSimulator(topo))
        handed = sorted(c.end_ns for c in res.completions if c.tag.startswith("r0/handoff"))
        assert handed == [NET_1M, 2 * NET_1M], handed
    with pytest.raises(InputError, match="deadlocks"):
        replay_graph(_program((0, 0), MIB), topo, FlowSimulator(topo))


def test_a_p2p_on_a_later_communicator_is_node_type_8_and_a_bad_one_is_named():
    graph = _program((0, 1), MIB)
    prog = graph.programs[0]
    again = Program.decode(prog.encode())
    assert again.nodes == prog.nodes
    import msgpack

    rows = msgpack.unpackb(prog.encode())["nodes"]
    assert [r[0] for r in rows if r[0] in (2, 6, 8)] == [2, 8, 2, 8]  # each rank's second communicator: type 8
    bad = msgpack.unpackb(prog.encode())
    bad["nodes"][[r[0] for r in rows].index(8)][7] = 0
    with pytest.raises(InputError, match="communicator 0"):
        Program.decode(msgpack.packb(bad), "p0.msgpack")


def test_a_recorded_run_keeps_each_sends_communicator_and_replays_to_its_ends(cross_two: tuple[Any, Any]):
    """`SENDS` with two groups across one channel, recorded live: the second send is on communicator 1, and the
    graph replays to the live run's ends (with one window per peer it deadlocked)."""
    rep, graph = cross_two
    topo = _cross()
    for me in (0, 1):
        assert _gaps(rep.logs[f"rank {me}"]) == (NET_1M, NET_1M)
        sends = [n for n in graph.program_of(me).nodes if isinstance(n, P2P) and n.is_send]
        assert [n.conn for n in sends] == [0, 1], sends
    res = replay_graph(graph, topo, FlowSimulator(topo))
    assert res.rank_end_ns == graph.recorded["end_ns"], (res.rank_end_ns, graph.recorded)
