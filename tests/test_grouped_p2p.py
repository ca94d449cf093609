"""Grouped p2p as NCCL runs it: the round schedule, the channel of each round, and a grouped send/recv on its
group's communicator (its channels per peer, its queue pairs). Closed forms from NCCL 2.30's init.cc
(`ncclP2pSchedule`), channel.h (`ncclP2pChannelBaseForRound`), device.h (`ncclP2pChannelForPart`), paths.cc and
enqueue.cc (channels per peer, `addP2pToPlan`)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.errors import RunFailed
from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.p2p_schedule import channel_base, group_deltas, send_rounds, transfer_channel_ids
from phantora.collectives.nccl.settings import nccl_env
from phantora.errors import InputError
from tests.test_bridge_core import Harness
from tests.test_nccl_multinode import a100_hosts, hosts

KiB, MiB = 1 << 10, 1 << 20


def test_group_deltas_run_in_nccls_quadratic_order() -> None:
    """init.cc's own example: the group deltas for 16 groups; 10 groups skip those >= 10 of the 16's order."""
    sixteen = [0, 1, 3, 6, 10, 15, 5, 12, 4, 13, 7, 2, 14, 11, 9, 8]
    assert group_deltas(16) == sixteen
    assert group_deltas(10) == [d for d in sixteen if d < 10]


def test_rounds_inside_one_node_send_to_the_next_local_rank() -> None:
    """One node: round k sends to local rank (local + k) mod nLocal."""
    assert send_rounds((0,) * 8, 3) == (3, 4, 5, 6, 7, 0, 1, 2)


def test_rounds_across_nodes_go_group_by_group() -> None:
    """Two nodes of 8 (one group each): rank 3 sends to its own node's ranks first, then to node 1's from 11."""
    nodes = (0,) * 8 + (1,) * 8
    assert send_rounds(nodes, 3) == (3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10)


def test_channel_bases_are_the_rounds_bit_reversed() -> None:
    """32 p2p channels (5 bits): one node, base = reverse(round); across nodes, one base per batch of 8 rounds."""
    assert [channel_base(k, 1, 8, 32) for k in range(8)] == [0, 16, 8, 24, 4, 20, 12, 28]
    assert [channel_base(k, 2, 8, 32) for k in range(16)] == [0] * 8 + [16] * 8
    nodes = (0,) * 8 + (1,) * 8
    assert transfer_channel_ids(nodes, 3, 12, 2, 32) == [16, 17]  # round 9: base 16, parts on 16 and 17


def test_a_grouped_send_takes_its_communicators_channels_per_peer() -> None:
    """80 H100 ranks over 10 hosts, 400G NICs: alone, a send's 2-rank communicator gives the peer
    pow2Up(ceil(50 / 14)) = 4 channels, and 16 MiB (past 4 x the 128 KiB chunk) stripes over all 4; in a group on
    the 80-rank communicator the most halves for the 10 rounds of 8 peers (4 x 10 > 16 -> 2 x 10 > 16 -> 1)."""
    topo = hosts(10)
    alone = choose(Collective("send_recv", (0, 8), 16 * MiB, "bf16"), topo, AlgoOptions())
    grouped = choose(Collective("send_recv", (0, 8), 16 * MiB, "bf16", None, tuple(range(80))), topo, AlgoOptions())
    assert (alone.channels, grouped.channels) == (4, 1)


@pytest.mark.parametrize(("chunk", "channels"), [(None, 1), (32 * KiB, 2)])
def test_p2p_net_chunksize_sets_a_grouped_sends_parts(chunk: int | None, channels: int) -> None:
    """16 A100 ranks on 2 hosts (least 1, most 2 channels a peer): 64 KiB is one part of at most the 128 KiB
    chunk; with NCCL_P2P_NET_CHUNKSIZE=32768 a part is at most 32 KiB, so the transfer doubles to 2 channels. Each
    part crosses the network once (from GPU 4 of host 0, the PXN relay onto the receiver's rail)."""
    env = nccl_env({"NCCL_P2P_NET_CHUNKSIZE": str(chunk)} if chunk else {})
    coll = Collective("send_recv", (3, 12), 64 * KiB, "bf16", None, tuple(range(16)))
    topo = a100_hosts(2)
    dag = decompose(coll, topo, AlgoOptions(nccl_env=env))
    assert dag.choice["channels"] == channels
    net = [f for f in dag.flows if topo.nodes[f.src].host != topo.nodes[f.dst].host]
    assert len(net) == channels and sum(f.size for f in net) == 64 * KiB


def test_a_grouped_send_shares_the_all_to_alls_queue_pairs() -> None:
    """A send 3 -> 11 (one rail: no PXN) grouped on the 16-rank communicator rides the same queue pairs
    (communicator, channel, ends) as an all-to-all over that communicator's block 3 -> 11: 128 KiB a peer, one
    part, on round 8's channel: batch 1 of 8 rounds, bit-reversed over the 16 p2p channels (4 bits) = 8. A lone
    send has its own 2-rank communicator's. GPU 3 also relays (PXN) the blocks of host 0's 7 other GPUs to GPU 11,
    each on a connection of its own, as NCCL's proxy holds one per sender: 8 connections 3 -> 11 in all."""
    topo, comm = a100_hosts(2), tuple(range(16))
    a2a = decompose(Collective("all_to_all", comm, 16 * 128 * KiB, "bf16"), topo, AlgoOptions())
    src, dst = topo.node_of_rank(3), topo.node_of_rank(11)
    want = {f.conn for f in a2a.flows if (f.src, f.dst) == (src, dst)}
    grouped = decompose(Collective("send_recv", (3, 11), 128 * KiB, "bf16", None, comm), topo, AlgoOptions())
    alone = decompose(Collective("send_recv", (3, 11), 128 * KiB, "bf16"), topo, AlgoOptions())
    assert len(want) == 8 and len({f.conn for f in grouped.flows}) == 1 and {f.conn for f in grouped.flows} < want
    assert not {f.conn for f in alone.flows} & want
    assert [f.key >> 48 for f in grouped.flows] == [8]


def test_a_comm_must_hold_both_ends() -> None:
    with pytest.raises(InputError, match="comm"):
        Collective("send_recv", (3, 12), 1, "bf16", None, (0, 1, 2, 3))
    with pytest.raises(InputError, match="comm"):
        Collective("all_reduce", (0, 1), 1, "bf16", None, (0, 1))


def _capture(h: Harness) -> list[Any]:
    calls: list[Any] = []
    plan = h.core.planner.plan

    def spy(call: Any, tag: str) -> Any:
        calls.append(call)
        return plan(call, tag)

    h.core.planner.plan = spy  # type: ignore[method-assign]
    return calls


def test_the_coordinator_plans_a_grouped_pair_on_the_communicator_both_ends_name() -> None:
    """Both ends name the 4-rank communicator: the pair is planned on it; ends that disagree (one grouped, one
    not) each keep their own, so the pair runs on its own communicator."""
    h = Harness(world=4)
    calls = _capture(h)
    comm = [0, 1, 2, 3]
    h.msg(0, "p2p", 1_000, h=1, peer=1, send=True, tag=0, seq=0, nbytes=MiB, name="", comm=comm)
    h.msg(1, "p2p", 1_000, h=1, peer=0, send=False, tag=0, seq=0, nbytes=MiB, name="", comm=comm)
    h.msg(2, "p2p", 1_000, h=1, peer=3, send=True, tag=0, seq=0, nbytes=MiB, name="", comm=comm)
    h.msg(3, "p2p", 1_000, h=1, peer=2, send=False, tag=0, seq=0, nbytes=MiB, name="")
    for r in range(4):
        h.wait(r, 1_000, 1)
    h.core.progress()
    assert sorted((c.group, c.comm) for c in calls) == [((0, 1), (0, 1, 2, 3)), ((2, 3), ())]


def test_a_comm_without_the_peer_fails_naming_it() -> None:
    h = Harness(world=4)
    with pytest.raises(RunFailed, match=r"names comm \[0, 2\]"):
        h.msg(0, "p2p", 1_000, h=1, peer=1, send=True, tag=0, seq=0, nbytes=MiB, name="", comm=[0, 2])


GROUPED = """
    import torch, torch.distributed as dist
    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    box = torch.empty(1024)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((1024,), float(r)), (r + 1) % n),
                                   dist.P2POp(dist.irecv, box, (r - 1) % n)])
    for q in reqs:
        q.wait()
    assert torch.equal(box, torch.full((1024,), float((r - 1) % n))), box
    if r == 0:
        dist.send(torch.ones(8), dst=1)
    elif r == 1:
        dist.recv(torch.empty(8), src=0)
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_batch_isend_irecv_runs_on_the_groups_communicator(tmp_path) -> None:
    """A ring exchange in batch_isend_irecv over 4 ranks: each of its 4 transfers is recorded on the world's
    communicator [0, 1, 2, 3] and moves the right data; the lone send after it runs on its own pair's. Slow: a
    live 4-rank run (about 10 s)."""
    from phantora.launcher import RunConfig, launch
    from tests.test_runtime_e2e import star, write

    script = write(tmp_path, "grouped.py", GROUPED)
    rep = launch(RunConfig(str(script), topology=star(4), nproc=4, trace="none", timeout_s=240))
    sends = [c for c in rep.cosim.collectives if c["kind"] == "send_recv"]
    grouped = sorted(tuple(c["group"]) for c in sends if c.get("comm") == [0, 1, 2, 3])
    assert grouped == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert [c.get("comm") for c in sends if c["nbytes"] == 32] == [None]


def test_a_grouped_send_inside_one_host_takes_the_multi_host_communicators_chunk() -> None:
    """NCCL sizes p2p chunks per communicator (init.cc computeBuffSizes: the 128 KiB net chunk once nNodes > 1)
    and its parts by it (enqueue.cc addP2pToPlan: 64-128 KiB across nodes). 1 MiB between two GPUs of one A100
    host: alone (one node: 512 KiB NVLink chunk, parts of 64 KiB to 16 MiB) it takes the least, 16 channels of
    64 KiB; grouped on the 2-host communicator of 16, its parts are at most 128 KiB, doubling from 1 channel up
    to the most per peer, 2."""
    topo = a100_hosts(2)
    alone = choose(Collective("send_recv", (0, 1), MiB, "bf16"), topo, AlgoOptions())
    grouped = choose(Collective("send_recv", (0, 1), MiB, "bf16", None, tuple(range(16))), topo, AlgoOptions())
    assert (alone.channels, grouped.channels) == (16, 2)


EAGER = """
    import torch, torch.distributed as dist
    dist.init_process_group(device_id=torch.device("cuda", 0))
    r = dist.get_rank()
    if r == 0:
        dist.send(torch.ones(8), dst=1)
    elif r == 1:
        dist.recv(torch.empty(8), src=0)
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_under_eager_init_a_lone_send_runs_on_the_groups_communicator(tmp_path) -> None:
    """init_process_group(device_id=...): ProcessGroupNCCL runs a lone send/recv on the group's communicator, not
    a 2-rank one; the transfer 0 -> 1 is recorded on [0, 1, 2, 3]. Slow: a live 4-rank run (about 10 s)."""
    from phantora.launcher import RunConfig, launch
    from tests.test_runtime_e2e import star, write

    script = write(tmp_path, "eager.py", EAGER)
    rep = launch(RunConfig(str(script), topology=star(4), nproc=4, trace="none", timeout_s=240, tensors="phantom"))
    sends = [c for c in rep.cosim.collectives if c["kind"] == "send_recv"]
    assert [(c["group"], c.get("comm")) for c in sends] == [([0, 1], [0, 1, 2, 3])]
