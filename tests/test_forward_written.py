"""A forwarding GPU frees its upstream slot once it has written the step on, as NCCL's kernel does.

prims_simple.h `genericOp` (NCCL v2.30.7-1; a tree's or chain's ProtoSimple<1, 1>: one slice a step) waits for the
send slot, copies the received step into the send buffer, and only then posts the receive's head upstream
(`postPeer<Recv, Send>`), step after step. Inside a host the send buffer is the downstream GPU's slot (P2P), so the
upstream's step k + NCCL_STEPS cannot start before the middle's copy of step k has landed in the downstream's slot
and the head's flag is back (the path's propagation). Closed forms written out here on one host of 3 GPUs on a
switch whose last GPU's link runs at a quarter; no rate caps, so the links alone set the pace.
"""

from __future__ import annotations

import pytest

from phantora.collectives.back_pressure import credit_latency
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.tree import tree_flows
from phantora.netsim.base import Flow
from phantora.topology import Topology
from tests.engine_pair import start_end_ns
from tests.test_back_pressure import G, MiB, sends
from tests.test_tree_sweep_slots import LINK_NS, one_host_star  # (a GPU's link to the switch: a path of two links)

NCCL_STEPS = 8  # src/include/device.h
FLAG_NS = 2 * LINK_NS  # the head's flag from the middle GPU back to the root: the path's propagation
RATES = [100 * G, 100 * G, 25 * G]  # GPU 2's link at a quarter: the chain's last hop is the slow one


def chain(steps: int, step: int) -> tuple[Topology, list[Flow], list[list[Flow]]]:
    """The broadcast chain 0 -> 1 -> 2 inside one host, `steps` steps of `step` bytes, NCCL_STEPS in flight a hop:
    the topology, its flows and each GPU's sends in order."""
    topo, gpus = one_host_star(RATES)
    b = DagBuilder(gpus, tuple(range(3)), 0, "", comm=communicator_id("chain", range(3)))
    b.host_of = dict.fromkeys(gpus, 0)
    b.credit_ns = credit_latency(topo, gpus)
    tree_flows(b, [None, 0, 1], steps * step, 0, up=False, down=True, chunked=True, chunk_bytes=step,
               step_delay_ns=0, name="chain", window=NCCL_STEPS)  # fmt: skip
    flows = b.finish().flows
    return topo, flows, [sends(flows, g) for g in gpus[:2]]


def test_the_upstream_waits_for_the_middle_to_have_written_the_step() -> None:
    """64 steps of 1 MiB. Every root step k + 8 starts no sooner than the middle's step k has landed in GPU 2's
    slot plus the flag's 2,000 ns; once the slots are full (from step 16 on) exactly then, the root idle
    between: its steps take 1 MiB / 100 Gbit/s = 83,886 ns, the slow hop's 335,544 ns. The middle then holds at
    most a window received and not yet written on. Freed as the middle's forward was released (behind up to 7 of
    its earlier steps on the slow hop; phantora before 2026-12-05), the root ran up to 8 slow steps ahead (its last
    step done at 16.28 ms, now 18.97; the chain's end 21.56 ms both ways) and the middle held 16 steps."""
    topo, flows, (root, mid) = chain(64, MiB)
    done = start_end_ns("flow", topo, flows)
    assert len(root) == len(mid) == 64
    for k in range(64 - NCCL_STEPS):
        assert done[root[k + NCCL_STEPS].id][0] >= done[mid[k].id][1] + FLAG_NS
    for k in range(16, 64 - NCCL_STEPS):
        assert done[root[k + NCCL_STEPS].id][0] == pytest.approx(done[mid[k].id][1] + FLAG_NS, abs=2)
    slow = MiB * 8e9 / RATES[2]
    gaps = [done[mid[k + 1].id][1] - done[mid[k].id][1] for k in range(16, 63)]
    assert gaps == pytest.approx([slow] * len(gaps), abs=2)
    # what the middle holds received but not yet written on, at the root's last step: at most the window
    last = done[root[-1].id][1]
    held = sum(1 for k in range(64) if done[root[k].id][1] <= last < done[mid[k].id][1])
    assert held <= NCCL_STEPS


def test_both_engines_carry_the_same_wait() -> None:
    """The same chain, 24 steps of 256 KiB, on ns-3 (DCQCN): the same flows, so the same rule holds there (each
    start after the middle's step k + the flag; ns-3's packets and headers set the times)."""
    topo, flows, (root, mid) = chain(24, 256 * 1024)
    for network in ("flow", "ns3"):
        done = start_end_ns(network, topo, flows)
        for k in range(24 - NCCL_STEPS):
            assert done[root[k + NCCL_STEPS].id][0] >= done[mid[k].id][1] + FLAG_NS, network
