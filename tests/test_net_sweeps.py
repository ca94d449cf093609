"""LL / LL128 trees and chains across hosts: the NVLink hops inside each host forward a chunk sweep by sweep, as
the kernel's warps send each line on once it lands (prims_ll.h, prims_ll128.h `GenericOp`), while the hop between
hosts carries whole chunks: the sender's proxy posts a step only once every line of it carries its flag (net.cc
`sendProxyProgress`, NCCL v2.29.7-1), and the receiving GPU forwards the step's lines once it has landed. Closed
forms written out on two hosts of three GPUs on one switch (each GPU a link of LINK_NS: a path of P = 2 x LINK_NS
between any two), no rate caps, so the links alone set the pace."""

from __future__ import annotations

import pytest

from phantora.collectives.back_pressure import credit_latency, is_credit
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.tree import sweep_pieces, tree_flows
from phantora.netsim.base import Flow
from phantora.topology import Topology
from tests.test_back_pressure import G, run

LINK_NS = 1000
P = 2 * LINK_NS
SWEEP = 640 * 60  # an LL128 chain's sweep: the ring kernel's 640 threads x 60 data bytes, 38,400 B
PER_CHUNK = 4
CHAIN = [None, 0, 1, 2, 3, 4]  # GPU 0 (host 0) -> 1 -> 2 -> 3 (host 1) -> 4 -> 5
X = SWEEP * 8e9 / (100 * G)  # a sweep's time on a 100 Gbit/s link: 3,072 ns


def two_hosts() -> tuple[Topology, list[int]]:
    """GPUs 0-2 in host 0, 3-5 in host 1, each on a 100 Gbit/s link to one switch."""
    t = Topology()
    gpus = [t.add_node("gpu", host=i // 3) for i in range(6)]
    sw = t.add_node("switch")
    for g in gpus:
        t.add_link(g, sw, 100 * G, LINK_NS)
    return t.validate(), gpus


def chain(chunks: int, sweeps: bool, *, up: bool = False) -> tuple[Topology, list[Flow], list[list[Flow]]]:
    """A broadcast (or, `up`, a reduce) along CHAIN of `chunks` chunks of PER_CHUNK sweeps, NCCL_STEPS (8) slots an
    edge; with `sweeps` False each hop carries whole chunks. The topology, its flows and each hop's pieces, in
    order from the root."""
    topo, gpus = two_hosts()
    b = DagBuilder(gpus, tuple(range(6)), 0, "", comm=communicator_id("chain", range(6)))
    b.host_of = {g: i // 3 for i, g in enumerate(gpus)}
    b.credit_ns = credit_latency(topo, gpus)
    parent = [None if v == 5 else v + 1 for v in range(6)] if up else CHAIN
    tree_flows(b, parent, chunks * PER_CHUNK * SWEEP, 0, up=up, down=not up, chunked=True,
               chunk_bytes=PER_CHUNK * SWEEP, step_delay_ns=0, name="chain",
               sweeps=(SWEEP, SWEEP) if sweeps else None, window=8)  # fmt: skip
    flows = b.finish().flows
    hops = [(v, v + 1) for v in range(5)] if not up else [(v, v + 1) for v in range(5)]
    edges = [[f for f in flows if (f.src, f.dst) == (gpus[s], gpus[d]) and not is_credit(f)] for s, d in hops]
    return topo, flows, edges


@pytest.mark.parametrize("up", [False, True])
def test_nvlink_hops_sweep_the_host_hop_sends_whole_chunks(up: bool) -> None:
    """Three chunks: the hops inside hosts carry 4 sweeps a chunk (12 each), the hop 2 -> 3 between the hosts 3
    whole chunks; the host hop's chunk c waits for the last sweep of chunk c on hop 1 -> 2, and every sweep of
    chunk c on hop 3 -> 4 for the host hop's chunk c (not its first bytes)."""
    _, flows, edges = chain(3, True, up=up)
    assert [len(e) for e in edges] == [12, 12, 3, 12, 12]
    assert all(f.size == SWEEP for i in (0, 1, 3, 4) for f in edges[i])
    assert [f.size for f in edges[2]] == [PER_CHUNK * SWEEP] * 3
    for c in range(3):
        net = edges[2][c]
        assert edges[1][PER_CHUNK * c + PER_CHUNK - 1].id in net.deps
        assert not any(edges[1][PER_CHUNK * c + i].id in net.deps for i in range(PER_CHUNK - 1))
        for i in range(PER_CHUNK):
            assert net.id in edges[3][PER_CHUNK * c + i].deps
    assert sweep_pieces(3 * PER_CHUNK * SWEEP, PER_CHUNK * SWEEP, SWEEP) == [SWEEP] * 12


def test_one_chunk_crosses_two_hosts_in_14_sweep_times() -> None:
    """One chunk of 4 sweeps (x = 3,072 ns each at 100 Gbit/s): over the two NVLink hops of host 0 the sweeps
    pipeline, the last landing at GPU 2 at 5x + 2P; the host hop's whole chunk then takes 4x + P; over host 1's
    two hops again 5x + 2P: GPU 5 has it at 14x + 5P = 53,008 ns. Whole chunks on every hop (the model before
    2026-12-05): 5 x (4x + P) = 20x + 5P = 71,440 ns."""
    for sweeps, want in ((True, 14 * X + 5 * P), (False, 20 * X + 5 * P)):
        topo, flows, edges = chain(1, sweeps)
        done = run(topo, flows)
        assert done[edges[1][-1].id][1] == pytest.approx((5 * X + 2 * P) if sweeps else 2 * (4 * X + P), abs=2)
        assert done[edges[4][-1].id][1] == pytest.approx(want, abs=3)


def test_many_chunks_go_at_a_chunk_per_4x() -> None:
    """48 chunks: past the fill every hop moves a chunk per 4x (the links' pace; 8 slots an edge keep the host
    hop busy), so GPU 5's last sweep lands 47 x 4x after the first chunk's, both in the sweeps and the whole-chunk
    model; sweeping saves the fill only (6x, 18,432 ns)."""
    ends = {}
    for sweeps in (True, False):
        topo, flows, edges = chain(48, sweeps)
        done = run(topo, flows)
        last = edges[4]
        first_chunk = done[last[PER_CHUNK - 1 if sweeps else 0].id][1]
        ends[sweeps] = done[last[-1].id][1]
        assert ends[sweeps] - first_chunk == pytest.approx(47 * 4 * X, rel=1e-3)
    assert ends[False] - ends[True] == pytest.approx(6 * X, rel=1e-2)


@pytest.mark.ns3
def test_ns3_forwards_the_host_hops_chunk_after_it_lands(ns3_lib) -> None:
    """Through ns-3 the same three-chunk chain: the flows are the flow engine's, no sweep on host 1 leaves before
    the host hop's chunk has landed, and GPU 5 has the data no sooner than 14x + 5P plus the chunks behind it."""
    from tests.engine_pair import start_end_ns

    topo, flows, edges = chain(3, True)
    done = start_end_ns("ns3", topo, flows)
    for c in range(3):
        for i in range(PER_CHUNK):
            assert done[edges[3][PER_CHUNK * c + i].id][0] >= done[edges[2][c].id][1]
    assert done[edges[4][-1].id][1] >= 14 * X + 5 * P + 2 * 4 * X
