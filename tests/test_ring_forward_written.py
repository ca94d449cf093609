"""A chunked ring's forwarding GPU frees a one-slot step (LL, LL128) once it has written it on, as NCCL's kernel does.

prims_ll.h / prims_ll128.h (NCCL v2.30.7-1): an LL / LL128 ring step takes one of a connection's NCCL_STEPS = 8
slots, and the receiver posts its head upstream (`postRecv`) only after it has read the step and stored its lines
into the send buffer; inside a host that buffer is the next GPU's slot (P2P), so the store is the forward itself.
The upstream's step k + NCCL_STEPS cannot start before the forwarding GPU's write of step k has landed downstream
and the head's flag is back (the path's propagation). Checked here on an all-reduce ring 0 -> 1 -> 2 -> 3 -> 0 in
one host on a switch whose GPU 3's link runs at a quarter, 16 passes of 1 MiB steps (6 steps a pass); no rate
caps, so the links alone set the pace.
"""

from __future__ import annotations

from phantora.collectives.back_pressure import credit_latency
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.ring import ring_flows
from phantora.netsim.base import Flow
from phantora.topology import Topology
from tests.engine_pair import start_end_ns
from tests.test_back_pressure import G, MiB, sends
from tests.test_tree_sweep_slots import LINK_NS, one_host_star

NCCL_STEPS = 8  # src/include/device.h: an LL / LL128 step takes one slot, so 8 steps in flight a connection
P = 2 * LINK_NS  # a path between two GPUs: two links; the flag's way back
RATES = [100 * G, 100 * G, 100 * G, 25 * G]  # GPU 3's link at a quarter: hops 2 -> 3 and 3 -> 0 are slow
STEPS = 6  # an all-reduce pass: 2 (4 - 1) steps, the last one's step copied out, not forwarded


def all_reduce(passes: int, step: int) -> tuple[Topology, list[Flow], list[list[Flow]]]:
    """The chunked ring all-reduce inside one host, slices of `passes` steps of `step` bytes, each rank's passes in
    turn, NCCL_STEPS in flight a connection: the topology, its flows and each GPU's sends in order."""
    topo, gpus = one_host_star(RATES)
    b = DagBuilder(gpus, tuple(range(4)), 0, "", comm=communicator_id("ring", range(4)))
    b.host_of = dict.fromkeys(gpus, 0)
    b.credit_ns = credit_latency(topo, gpus)
    ring_flows(b, "all_reduce", [0, 1, 2, 3], [passes * step] * 4, 0, chunked=True, chunk_bytes=step,
               step_delay_ns=0, in_turn=True, window=NCCL_STEPS)  # fmt: skip
    flows = b.finish().flows
    return topo, flows, [sends(flows, g) for g in gpus]


def slack_ns(done: dict[int, tuple[int, int]], ranks: list[list[Flow]]) -> list[int]:
    """For each rank i and each step k it sends that its successor forwards (not a pass's last), with a step
    k + NCCL_STEPS after it: the start of that step less (the landing of the successor's forward of step k + P)."""
    out = []
    for i, mine in enumerate(ranks):
        ahead = ranks[(i + 1) % len(ranks)]
        for k in range(len(mine) - NCCL_STEPS):
            if k % STEPS != STEPS - 1:
                out.append(done[mine[k + NCCL_STEPS].id][0] - (done[ahead[k + 1].id][1] + P))
    return out


def test_the_upstream_waits_for_the_forward_to_have_landed() -> None:
    """Every step k + 8 of a rank starts no sooner than its successor's forward of step k has landed in the next
    GPU's slot plus the flag's 2,000 ns, and some start exactly then (the window binds: GPU 1's steps 46, 70 and
    94, behind GPU 2's forwards on the slow hop). Freed as the forward was released (phantora before 2026-12-05),
    4 of the 296 such steps started before the forward had landed, GPU 2's step 47 by 673,090 ns = 2 (1 MiB /
    25 Gbit/s) + P: two slow steps ahead."""
    topo, flows, ranks = all_reduce(16, MiB)
    done = start_end_ns("flow", topo, flows)
    assert [len(r) for r in ranks] == [16 * STEPS] * 4
    slack = slack_ns(done, ranks)
    assert len(slack) == 296
    assert min(slack) >= -1  # the ns rounding of a flow's end
    assert [k for k, ns in enumerate(slack) if abs(ns) <= 1] != []


def test_both_engines_carry_the_same_wait() -> None:
    """The same ring, 12 passes of 256 KiB, on ns-3 (DCQCN): the same flows, so the same rule holds there (ns-3's
    packets and headers set the times)."""
    topo, flows, ranks = all_reduce(12, 256 * 1024)
    for network in ("flow", "ns3"):
        done = start_end_ns(network, topo, flows)
        assert min(slack_ns(done, ranks)) >= -1, network
