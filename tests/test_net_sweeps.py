"""LL / LL128 trees and chains across hosts: the NVLink hops inside each host forward a chunk sweep by sweep, as
the kernel's warps send each line on once it lands (prims_ll.h, prims_ll128.h `GenericOp`). The hop between hosts
sends whole steps: the sender's proxy posts a step only once every line of it carries its flag (net.cc
`sendProxyProgress`, NCCL v2.29.7-1), one RDMA write; but the receiving GPU polls each line's flag, so it forwards
the step's lines as the NIC lands them: the step crosses as the receiver's sweeps, one after another on the
connection, all released with the whole step. Closed forms written out on hosts of GPUs on one switch (each GPU a
link of LINK_NS: a path of P = 2 x LINK_NS between any two), no rate caps, so the links alone set the pace."""

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
SIX = (0, 0, 0, 1, 1, 1)  # each GPU's host: GPU 0 (host 0) -> 1 -> 2 -> 3 (host 1) -> 4 -> 5
X = SWEEP * 8e9 / (100 * G)  # a sweep's time on a 100 Gbit/s link: 3,072 ns
CTS_BYTES = 64  # a clear-to-send: one ncclIbSendFifo entry (net_ib/common.h)


def hosts_topology(hosts: tuple[int, ...]) -> tuple[Topology, list[int]]:
    """GPU i in host hosts[i], each on a 100 Gbit/s link to one switch."""
    t = Topology()
    gpus = [t.add_node("gpu", host=h) for h in hosts]
    sw = t.add_node("switch")
    for g in gpus:
        t.add_link(g, sw, 100 * G, LINK_NS)
    return t.validate(), gpus


def chain(
    chunks: int, sweeps: bool, *, up: bool = False, hosts: tuple[int, ...] = SIX, qps: int = 1, split: bool = False
) -> tuple[Topology, list[Flow], list[list[Flow]]]:
    """A broadcast (or, `up`, a reduce) along GPUs 0 -> 1 -> ... of `chunks` chunks of PER_CHUNK sweeps,
    NCCL_STEPS (8) slots an edge; with `sweeps` False each hop carries whole chunks. `qps` / `split`:
    NCCL_IB_QPS_PER_CONNECTION / NCCL_IB_SPLIT_DATA_ON_QPS. The topology, its flows and each hop's pieces, in order
    from the root."""
    topo, gpus = hosts_topology(hosts)
    n = len(hosts)
    b = DagBuilder(gpus, tuple(range(n)), 0, "", comm=communicator_id("chain", range(n)), qps=qps, split_qps=split)
    b.host_of = {g: h for g, h in zip(gpus, hosts, strict=True)}
    b.credit_ns = credit_latency(topo, gpus)
    parent = [None if v == n - 1 else v + 1 for v in range(n)] if up else [None, *range(n - 1)]
    tree_flows(b, parent, chunks * PER_CHUNK * SWEEP, 0, up=up, down=not up, chunked=True,
               chunk_bytes=PER_CHUNK * SWEEP, step_delay_ns=0, name="chain",
               sweeps=(SWEEP, SWEEP) if sweeps else None, window=8)  # fmt: skip
    flows = b.finish().flows
    edges = [
        [f for f in flows if (f.src, f.dst) == (gpus[v], gpus[v + 1]) and not is_credit(f) and f.size]
        for v in range(n - 1)
    ]
    return topo, flows, edges


@pytest.mark.parametrize("up", [False, True])
def test_every_hop_sweeps_the_host_hop_after_its_whole_step(up: bool) -> None:
    """Three chunks: every hop carries 4 sweeps a chunk (12 each), the hop 2 -> 3 between the hosts too; each sweep
    of the host hop's chunk c waits for the last sweep of chunk c on hop 1 -> 2 (the proxy sends a whole step), and
    sweep i of chunk c on hop 3 -> 4 for the host hop's sweep i (its lines, as they land), not its last."""
    _, flows, edges = chain(3, True, up=up)
    assert [len(e) for e in edges] == [12] * 5
    assert all(f.size == SWEEP for e in edges for f in e)
    for c in range(3):
        last_in = edges[1][PER_CHUNK * c + PER_CHUNK - 1].id
        for i in range(PER_CHUNK):
            net = edges[2][PER_CHUNK * c + i]
            assert last_in in net.deps
            assert not any(edges[1][PER_CHUNK * c + j].id in net.deps for j in range(PER_CHUNK - 1))
            fwd = edges[3][PER_CHUNK * c + i].deps
            assert net.id in fwd
            assert not any(edges[2][PER_CHUNK * c + j].id in fwd for j in range(PER_CHUNK) if j != i)
    assert sweep_pieces(3 * PER_CHUNK * SWEEP, PER_CHUNK * SWEEP, SWEEP) == [SWEEP] * 12


def test_two_host_chain_is_the_network_step_and_one_sweep() -> None:
    """GPU 0 (host 0) -> GPU 1 (host 1) -> GPU 2, one chunk of 4 sweeps (x = 3,072 ns each at 100 Gbit/s): the step
    leaves once its receive's clear-to-send is in (64 B: C = P + 5.12 ns), takes 4x + P, its last sweep landing
    then, and GPU 1 forwards that sweep in x + P: GPU 2 has it all at C + 5x + 2P = 21,365 ns, the network step and
    one sweep's NVLink hop. Forwarded once the whole step had landed (the model before 2026-12-05): its 4 sweeps after
    it, C + 8x + 2P = 30,581 ns."""
    cts = P + CTS_BYTES * 8 / 100  # ns
    _, flows, edges = chain(1, True, hosts=(0, 1, 1))
    topo, _ = hosts_topology((0, 1, 1))
    done = run(topo, flows)
    assert done[edges[0][-1].id][1] == pytest.approx(cts + 4 * X + P, abs=2)
    assert done[edges[1][-1].id][1] == pytest.approx(cts + 5 * X + 2 * P, abs=2)
    _, whole, hops = chain(1, False, hosts=(0, 1, 1))
    assert run(topo, whole)[hops[1][-1].id][1] == pytest.approx(cts + 8 * X + 2 * P, abs=2)


def test_one_chunk_crosses_two_hosts_in_11_sweep_times() -> None:
    """One chunk of 4 sweeps over GPUs 0-2 (host 0) and 3-5 (host 1): over host 0's two NVLink hops the sweeps
    pipeline, the last landing at GPU 2 at 5x + 2P; the host hop's 4 sweeps leave then, one after another, sweep k
    landing at 6x + 3P + kx, and over host 1's two hops each follows its own landing: GPU 5 has the last at
    11x + 5P = 43,792 ns (until 2026-12-05 host 1 waited for the whole step: 14x + 5P; whole chunks on every hop
    20x + 5P = 71,440 ns)."""
    for sweeps, want in ((True, 11 * X + 5 * P), (False, 20 * X + 5 * P)):
        topo, flows, edges = chain(1, sweeps)
        done = run(topo, flows)
        assert done[edges[1][-1].id][1] == pytest.approx((5 * X + 2 * P) if sweeps else 2 * (4 * X + P), abs=2)
        if sweeps:
            for k in range(PER_CHUNK):
                assert done[edges[2][k].id][1] == pytest.approx(6 * X + 3 * P + k * X, abs=3)
        assert done[edges[4][-1].id][1] == pytest.approx(want, abs=3)


def test_many_chunks_go_at_a_chunk_per_4x() -> None:
    """48 chunks: past the fill every hop moves a chunk per 4x (the links' pace; 8 slots an edge keep the host
    hop busy), so GPU 5's last sweep lands 47 x 4x after the first chunk's, both in the sweeps and the whole-chunk
    model; sweeping saves the fill only (20x - 11x = 9x, 27,648 ns)."""
    ends = {}
    for sweeps in (True, False):
        topo, flows, edges = chain(48, sweeps)
        done = run(topo, flows)
        last = edges[4]
        first_chunk = done[last[PER_CHUNK - 1 if sweeps else 0].id][1]
        ends[sweeps] = done[last[-1].id][1]
        assert ends[sweeps] - first_chunk == pytest.approx(47 * 4 * X, rel=1e-3)
    assert ends[False] - ends[True] == pytest.approx(9 * X, rel=1e-2)


def test_a_step_stays_on_its_queue_pair() -> None:
    """NCCL_IB_QPS_PER_CONNECTION=2: net_ib posts message k of a connection on queue pair k mod 2, a step one
    message, so the host hop's 4 sweeps of chunk c are all on queue pair c mod 2 (3 chunks: 0, 1, 0). With
    NCCL_IB_SPLIT_DATA_ON_QPS every step is spread over both side by side, its lines landing in two places at once
    (not modelled): the host hop then carries whole chunks, split in two parts of 76,800 B."""
    _, flows, edges = chain(3, True, qps=2)
    pairs = [f.key >> 56 for f in edges[2]]
    assert pairs == [0] * PER_CHUNK + [1] * PER_CHUNK + [0] * PER_CHUNK
    assert len({f.conn for f in edges[2][:PER_CHUNK]}) == 1
    _, flows, edges = chain(3, True, qps=2, split=True)
    assert [f.size for f in edges[2]] == [PER_CHUNK * SWEEP // 2] * 6
    assert [len(e) for i, e in enumerate(edges) if i != 2] == [12] * 4


@pytest.mark.ns3
def test_ns3_forwards_the_host_hops_lines_as_they_land(ns3_lib) -> None:
    """Through ns-3 the same three-chunk chain: the flows are the flow engine's; host 1's sweep i of a chunk leaves
    once the host hop's sweep i has landed, the first ones before the chunk's last has; GPU 5 has the data no
    sooner than 11x + 5P plus the chunks behind it."""
    from tests.engine_pair import start_end_ns

    topo, flows, edges = chain(3, True)
    done = start_end_ns("ns3", topo, flows)
    for c in range(3):
        net = edges[2][PER_CHUNK * c : PER_CHUNK * (c + 1)]
        for i in range(PER_CHUNK):
            assert done[edges[3][PER_CHUNK * c + i].id][0] >= done[net[i].id][1]
        assert done[edges[3][PER_CHUNK * c].id][0] < done[net[-1].id][1]
    assert done[edges[4][-1].id][1] >= 11 * X + 5 * P + 2 * 4 * X
