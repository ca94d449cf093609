"""A chunked Simple ring moves each chunk as its 2 slices, each freed upstream once written on, as NCCL's kernel does.

prims_simple.h `genericOp` (NCCL v2.30.7-1) under ProtoSimple<CHUNKSTEPS = 4, SLICESTEPS = 2>: a chunk is 2 slices
of 2 of a connection's NCCL_STEPS = 8 slots each, so W = 4 slices in flight; the kernel waits for slice s's slots,
copies it on and posts it (the tail downstream, the head upstream) before it starts slice s + 1. Inside a host the
copy is the write into the next GPU's slot, so a forwarding GPU frees slice s upstream once its forward of it has
landed. Checked on an all-reduce ring 0 -> 1 -> 2 -> 0 in one host on a switch whose GPU 2's link runs at a quarter
(hops 1 -> 2 and 2 -> 0 slow), 16 passes of 1 MiB chunks (4 steps a pass, 8 slices a rank); no rate caps.
"""

from __future__ import annotations

from phantora.collectives.back_pressure import credit_latency
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.nccl.ring_slices import slice_bytes
from phantora.collectives.ring import ring_flows
from phantora.netsim.base import Flow
from phantora.topology import Topology
from tests.engine_pair import start_end_ns
from tests.test_back_pressure import G, MiB, sends
from tests.test_tree_sweep_slots import LINK_NS, one_host_star

KiB = 1024
W = 4  # NCCL_STEPS / SLICESTEPS: slices in flight a connection
CHUNK_WINDOW = 2  # NCCL_STEPS / CHUNKSTEPS: chunks in flight
P = 2 * LINK_NS  # a path between two GPUs: two links; the flag's way back
RATES = [100 * G, 100 * G, 25 * G]
PER_PASS = 2 * 4  # slices a rank sends a pass: 2 a step, 2 (3 - 1) steps
STEP = 256 * KiB  # the Simple buffer's step: its slice floor is 2 x 256 KiB / 32 = 16 KiB


def test_slices_are_nccls_cut() -> None:
    """`slice_bytes` against genericOp's sliceSize = max(divUp(nelem, 32) x 16, stepSize x 2 / 32) elements, cut to
    what is left: a 2 MiB float chunk in halves; 100,000 B of bf16 (50,000 elements) 25,008 + 24,992 elements; a
    40 KiB float chunk with 512 KiB steps (floor 32 KiB) 32 + 8 KiB; 16 KiB 16 + 0 (an empty slice still runs)."""
    assert slice_bytes(2 * MiB, 4, 512 * KiB) == [MiB, MiB]
    assert slice_bytes(100_000, 2, 512 * KiB) == [50_016, 49_984]
    assert slice_bytes(40 * KiB, 4, 512 * KiB) == [32 * KiB, 8 * KiB]
    assert slice_bytes(16 * KiB, 4, 512 * KiB) == [16 * KiB, 0]


def all_reduce(passes: int, chunk: int, sliced: bool = True) -> tuple[Topology, list[Flow], list[list[Flow]]]:
    """The chunked Simple ring all-reduce inside one host, `passes` chunks of `chunk` bytes a slice, each rank's
    passes in turn, 2 chunks in flight a connection (as slices, 4): the topology, its flows and each GPU's sends."""
    topo, gpus = one_host_star(RATES)
    b = DagBuilder(gpus, tuple(range(3)), 0, "", comm=communicator_id("ring", range(3)))
    b.host_of = dict.fromkeys(gpus, 0)
    b.credit_ns = credit_latency(topo, gpus)
    slicer = (lambda size: slice_bytes(size, 4, STEP)) if sliced else None
    ring_flows(b, "all_reduce", [0, 1, 2], [passes * chunk] * 3, 0, chunked=True, chunk_bytes=chunk,
               step_delay_ns=0, in_turn=True, window=CHUNK_WINDOW, slicer=slicer)  # fmt: skip
    flows = b.finish().flows
    return topo, flows, [sends(flows, g) for g in gpus]


def slack_ns(done: dict[int, tuple[int, int]], ranks: list[list[Flow]]) -> list[int]:
    """For each rank and each slice k it sends that its successor forwards (not of a pass's last step), with a
    slice k + W after it: the start of slice k + W less (the landing of the successor's forward of slice k + P).
    The successor forwards slice k of step s as its slice k + 2 (its step s + 1, the same slice)."""
    out = []
    for i, mine in enumerate(ranks):
        ahead = ranks[(i + 1) % len(ranks)]
        for k in range(len(mine) - W):
            if k % PER_PASS < PER_PASS - 2:
                out.append(done[mine[k + W].id][0] - (done[ahead[k + 2].id][1] + P))
    return out


def test_a_slice_waits_for_the_slice_w_back_to_be_written_on() -> None:
    """Each rank sends 16 x 8 slices of 512 KiB (a 1 MiB chunk in halves), and every slice k + 4 starts no sooner
    than its successor's forward of slice k has landed plus the flag's 2,000 ns; where the window binds (behind
    GPU 2's slow hop), exactly then."""
    topo, flows, ranks = all_reduce(16, MiB)
    assert [len(r) for r in ranks] == [16 * PER_PASS] * 3
    assert {f.size for r in ranks for f in r} == {512 * KiB}
    done = start_end_ns("flow", topo, flows)
    slack = slack_ns(done, ranks)
    assert len(slack) == 3 * (16 * 6 - 2)  # 6 forwarded slices a pass; the last pass's 2 have no slice k + 4
    assert min(slack) >= -1  # the ns rounding of a flow's end
    assert sum(abs(ns) <= 1 for ns in slack) > 0


def test_whole_chunks_freed_at_release_break_the_rule() -> None:
    """The same ring with its chunks whole (no slicer: a chunk consumed as its forward is released, phantora
    before 2026-12-05): a chunk holds 2 slices' slots, so its slice-level rule reads chunk c + 2 against the
    successor's forward of chunk c; some chunks start before that forward has landed, over half a slow 1 MiB
    forward (1 MiB / 25 Gbit/s = 335,544 ns) ahead of it (the earliest by 249,658 ns)."""
    topo, flows, ranks = all_reduce(16, MiB, sliced=False)
    done = start_end_ns("flow", topo, flows)
    early = []
    for i, mine in enumerate(ranks):
        ahead = ranks[(i + 1) % 3]
        for k in range(len(mine) - CHUNK_WINDOW):
            if k % 4 < 3:
                early.append(done[mine[k + CHUNK_WINDOW].id][0] - (done[ahead[k + 1].id][1] + P))
    assert min(early) < -335_544 // 2


def test_both_engines_carry_the_same_wait() -> None:
    """The same ring, 8 passes of 256 KiB chunks (128 KiB slices), on ns-3 (DCQCN): the same flows, so the rule
    holds there too (ns-3's packets and headers set the times)."""
    topo, flows, ranks = all_reduce(8, 256 * KiB)
    for network in ("flow", "ns3"):
        done = start_end_ns(network, topo, flows)
        assert min(slack_ns(done, ranks)) >= -1, network
