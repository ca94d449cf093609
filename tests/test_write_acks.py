"""An isend completes at its sender once its RDMA write is acknowledged (`back_pressure.Credits.acked`). NCCL's
sending proxy moves `done` when `ncclNet->test` reports the isend complete (net.cc `sendProxyProgress`, v2.29.7-1),
which for an IB reliable-connection write is when its ACK is back: the write's arrival plus the reverse path's
propagation. `done` frees two things: the proxy's next isend of the slot (`transmitted < done + NCCL_STEPS`) and
the kernel's slot (`sendHead`, or `posted < done + maxDepth` on a shared buffer). The first never binds here: the
isend of step s + window also needs the receiver's CTS for that slot, released once the receiver has consumed
step s (after it landed) and sent over the same reverse path, so it is in no earlier than the ACK. The second does:
the kernel's write of step s + window into its staging slot (a ring's forward, which frees the slot upstream) and a
PXN sender's NVLink step s + window into the relay's buffer wait for it. Times against closed forms written here."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import ACK, CREDIT, is_cts
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.base import Flow
from phantora.topology import rail_optimized
from tests.engine_pair import start_end_ns

MiB = 1 << 20
WINDOW = 8  # a p2p connection's steps in flight (NCCL_STEPS slots, one a step)


def is_ack(f: Flow) -> bool:
    """Whether `f` is a write's ACK on its way back (a zero-byte flow at the sender)."""
    return f.tag.endswith(f"/{ACK}/{CREDIT}")


@pytest.mark.parametrize("network", ["flow", "ns3"])
def test_the_cts_of_step_s_plus_window_lands_after_step_ss_ack(network: str) -> None:
    """A chunked 16 MiB send/recv between the hosts of 2 x 2 H100 on one rail (32 steps of 128 KiB on each of 4
    channels, 8 in flight): the CTS that frees step s + 8's slot depends on step s (its receiver consumed it as it
    landed) and goes from the receiver to the sender, so it lands no earlier than step s's end + the reverse path's
    propagation, when step s's ACK is back: the proxy's wait for `done` never holds the isend back. Checked on
    every step past the first window, in both engines."""
    topo = rail_optimized(2, 2, gpu="h100")
    coll = Collective("send_recv", (0, 2), 16 * MiB, "fp32")
    flows = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env({}))).flows
    by_id = {f.id: f for f in flows}
    steps: dict[int | None, list[Flow]] = {}
    for f in flows:
        if f.size > 0 and not is_cts(f) and f.src != f.dst:
            steps.setdefault(f.conn, []).append(f)
    done = start_end_ns(network, topo, flows)
    checked = 0
    for conn in steps.values():
        assert len(conn) == 32
        for s in range(len(conn) - WINDOW):
            later = conn[s + WINDOW]
            (cts,) = [by_id[d] for d in later.deps if is_cts(by_id[d])]
            assert conn[s].id in cts.deps and (cts.src, cts.dst) == (later.dst, later.src)
            back = topo.path_latency_ns(topo.route(later.dst, later.src))
            assert done[cts.id][1] >= done[conn[s].id][1] + back
            checked += 1
    assert checked == 4 * 24


def test_a_rings_forward_waits_for_its_staging_slots_ack() -> None:
    """A chunked Ring/Simple all-reduce over 2 hosts of 2 H100: every rank sending across hosts writes its step into
    its proxy's staging slot once the write of the step a window back is acknowledged: each such step's
    consumption upstream (the credit it frees) waits for an ACK, a zero-byte flow at the sender released the
    reverse path's propagation (to the sending GPU: a ring that leaves its node by another GPU's NIC, NCCL's
    channel NIC, sends from there) after that earlier step, and only steps across hosts have one."""
    topo = rail_optimized(2, 2, gpu="h100")
    env = nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
    coll = Collective("all_reduce", (0, 1, 2, 3), 64 * MiB, "fp32")
    flows = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=env)).flows
    by_id = {f.id: f for f in flows}
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    acks = [f for f in flows if is_ack(f)]
    assert acks
    for a in acks:
        (step,) = (by_id[d] for d in a.deps)
        assert a.size == 0 and a.src == a.dst and host[a.src] == host[step.src] != host[step.dst]
        assert a.delay_ns == topo.path_latency_ns(topo.route(step.dst, a.src)) > 0
    used = {d for f in flows for d in f.deps}
    assert all(a.id in used for a in acks)
