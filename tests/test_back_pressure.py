"""NCCL's back-pressure (`collectives/back_pressure.py`): a connection's slot frees when its receiver's kernel has
consumed the step in it (prims_simple.h `waitPeer` / `postPeer`: the sender waits for the connection's head, which
the receiver raises after its copy), and the credit then takes the path's propagation back to the sender (the
proxy's clear-to-send across the network, net.cc / net_ib; a flag store inside a host). Closed forms written out
here, on small star topologies with one GPU a host (every hop NCCL's net transport) and no rate caps, so the links
alone set the pace."""

from __future__ import annotations

import pytest

from phantora.collectives.back_pressure import credit_latency, is_credit
from phantora.collectives.dag import DagBuilder, communicator_id
from phantora.collectives.ring import ring_flows
from phantora.collectives.tree import tree_flows
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology

G = 10**9
MiB = 1 << 20
LINK_NS = 1000  # each GPU's link to the switch: a path between two GPUs is 2 links, 2,000 ns


def star(rates: list[int], latency_ns: int = LINK_NS) -> tuple[Topology, list[int]]:
    """One switch, GPU i (a host of its own) on a link of `rates[i]` bit/s; the topology and the GPUs' nodes."""
    t = Topology()
    gpus = [t.add_node("gpu", host=i) for i in range(len(rates))]
    sw = t.add_node("switch")
    for g, rate in zip(gpus, rates, strict=True):
        t.add_link(g, sw, rate, latency_ns)
    return t.validate(), gpus


def builder(topo: Topology, gpus: list[int], family: str) -> DagBuilder:
    """A builder over `gpus` with NCCL's connections and the credits' way back from the topology."""
    b = DagBuilder(gpus, tuple(range(len(gpus))), 0, "", comm=communicator_id(family, range(len(gpus))))
    b.host_of = {g: i for i, g in enumerate(gpus)}
    b.credit_ns = credit_latency(topo, gpus)
    return b


def run(topo: Topology, flows: list[Flow]) -> dict[int, tuple[int, int]]:
    """Flow id -> (start, end) ns on the flow network."""
    sim = FlowSimulator(topo)
    sim.submit(flows, at=0)
    return {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}


def sends(flows: list[Flow], node: int) -> list[Flow]:
    """The data messages `node` sends, in order (not the credits: clear-to-sends across hosts)."""
    return [f for f in flows if f.src == node and f.dst != node and not is_credit(f)]


def spacing_ns(done: dict[int, tuple[int, int]], steps: list[Flow], lo: int, hi: int) -> float:
    """Mean ns between the ends of consecutive messages `lo` .. `hi`."""
    return (done[steps[hi].id][1] - done[steps[lo].id][1]) / (hi - lo)


CHAIN_RATES = [100 * G, 100 * G, 100 * G, 25 * G]  # the chain's last hop, into GPU 3, at a quarter
CHUNK = MiB
CHUNKS = 64
WINDOW = 8  # NCCL_STEPS slots of one step each (a chain's steps, broadcast.h)


def chain_without_back_pressure(b: DagBuilder) -> list[Flow]:
    """The broadcast chain 0 -> 1 -> 2 -> 3 as before back-pressure: chunk c on a hop once it has arrived at the
    sender and chunk c - WINDOW of the hop has arrived at the receiver (a slot freed on arrival)."""
    got: list[int] = [0] * CHUNKS
    for v in range(3):
        mine: list[int] = []
        for c in range(CHUNKS):
            deps = ((got[c],) if v else ()) + ((mine[c - WINDOW],) if c >= WINDOW else ())
            mine.append(b.add(v, v + 1, CHUNK, f"chain/{v}/chunk{c}", 0, deps, ordered=True))
        got = mine
    return b.finish().flows


def test_a_slow_hop_paces_every_sender_upstream_of_it() -> None:
    """A 64 MiB broadcast chain in 1 MiB steps, 8 in flight a hop, whose last hop runs at 25 of 100 Gbit/s. With
    back-pressure every sender upstream sends a step per 1 MiB / 25 Gbit/s = 335,544 ns once the slots between it
    and the slow hop are full (the last 16 steps: GPU 1 from step 20, the root from step 41), and the root's last
    step goes only once the slow hop has delivered step 63 - 4 x 8; without it the root and GPU 1 send all 64 steps
    at their own 100 Gbit/s (83,886 ns a step) and finish 2.1x sooner than the slow hop."""
    topo, gpus = star(CHAIN_RATES)
    b = builder(topo, gpus, "chain")
    tree_flows(b, [None, 0, 1, 2], CHUNKS * CHUNK, 0, up=False, down=True, chunked=True, chunk_bytes=CHUNK,
               step_delay_ns=0, name="chain", window=WINDOW)  # fmt: skip
    flows = b.finish().flows
    done = run(topo, flows)
    slow, fast = CHUNK * 8e9 / (25 * G), CHUNK * 8e9 / (100 * G)
    root, mid, last = (sends(flows, gpus[v]) for v in range(3))
    assert [len(s) for s in (root, mid, last)] == [CHUNKS] * 3
    for steps in (root, mid, last):
        assert spacing_ns(done, steps, CHUNKS - 17, CHUNKS - 1) == pytest.approx(slow, rel=1e-4)
    assert done[root[-1].id][0] >= done[last[CHUNKS - 1 - 4 * WINDOW].id][1]
    before = chain_without_back_pressure(builder(topo, gpus, "chain"))
    old = run(topo, before)
    root, mid, last = (sends(before, gpus[v]) for v in range(3))
    for steps in (root, mid):
        assert spacing_ns(old, steps, 1, CHUNKS - 1) == pytest.approx(fast, rel=1e-4)
    assert spacing_ns(old, last, 1, CHUNKS - 1) == pytest.approx(slow, rel=1e-4)
    assert old[last[-1].id][1] / old[root[-1].id][1] > 2.0


@pytest.mark.parametrize(("kind", "steps"), [("all_gather", 3), ("reduce_scatter", 3), ("all_reduce", 6)])
def test_a_ring_runs_at_its_slow_hop(kind: str, steps: int) -> None:
    """A 4-GPU ring (16 x 1 MiB chunks a slice, Simple's 2 in flight) whose GPU 3 has a 25 of 100 Gbit/s link: each
    rank runs a pass (3 steps, all-reduce 6) per `steps` x 1 MiB / 25 Gbit/s + 2,000 ns (the pass waits for the
    arrival of the rank's last step before, a path's propagation), the slow hop's rate. A ring is paced by its slow
    hop with or without back-pressure: each rank's steps forward what came round through it."""
    topo, gpus = star(CHAIN_RATES)
    b = builder(topo, gpus, "ring")
    ring_flows(b, kind, [0, 1, 2, 3], [16 * CHUNK] * 4, 0, chunked=True, chunk_bytes=CHUNK, step_delay_ns=0,
               in_turn=True, window=2)  # fmt: skip
    flows = b.finish().flows
    done = run(topo, flows)
    period = steps * CHUNK * 8e9 / (25 * G) + 2 * LINK_NS
    cts = 2 * 64 * 8e9 / (25 * G / 2)  # a Simple chunk's clear-to-send (2 receives) at half the slow link, each step
    for g in gpus:
        sent = sends(flows, g)
        assert len(sent) == 16 * steps
        got = spacing_ns(done, sent, 2 * steps - 1, 14 * steps - 1) * steps
        assert period < got <= period + steps * (cts + 1)  # + a clear-to-send's transfer (and its ns rounding) a step


def p2p(latency_ns: int, window: int, steps: int, step_bytes: int) -> tuple[list[Flow], dict[int, tuple[int, int]]]:
    """A send of `steps` steps from GPU 0 to GPU 1 on one connection over 100 Gbit/s links of `latency_ns` each
    (a path of two), `window` in flight; its messages and their times."""
    topo, gpus = star([100 * G, 100 * G], latency_ns)
    b = builder(topo, gpus, "p2p")
    b.add_chunks(0, 1, [step_bytes] * steps, "p2p", 0, window=window)
    flows = b.finish().flows
    return flows, run(topo, flows)


def test_credits_cross_the_network_back() -> None:
    """One connection with 2 slots of 128 KiB over 50 µs links (RTT 2 x 2 x 50 µs): window-bound, it moves
    2 x 128 KiB per RTT + 128 KiB / 100 Gbit/s + the clear-to-send's 64 B / 100 Gbit/s (slots x slot bytes /
    (RTT + slot bytes / rate + CTS bytes / rate)), 9.96 Gbit/s, not the 2 steps per one-way trip (100 µs + transfer)
    of a slot freed on arrival. Each credit is a clear-to-send of sizeof(ncclIbSendFifo) = 64 bytes from the
    receiver to the sender; so is each of the first window's, posted at the start (no dependencies), which its step
    waits for: the two go in turn on the receiver's CTS queue pair, in after 100 µs and 1 and 2 x 64 B / 100 Gbit/s.
    With 8 slots of 128 KiB over 1 µs links the credits are back long before the window runs out: it moves at the
    link's 100 Gbit/s."""
    step = 128 * 1024
    flows, done = p2p(50_000, 2, 20, step)
    msgs = [f for f in flows if not is_credit(f)]
    cts = [f for f in flows if is_credit(f)]
    assert len(cts) == 20  # one a step: the first window's two, then one for every step past the window
    assert {(f.src, f.dst, f.size, f.delay_ns) for f in cts} == {(msgs[0].dst, msgs[0].src, 64, 0)}
    rtt, xfer, back = 2 * 2 * 50_000, step * 8e9 / (100 * G), 64 * 8e9 / (100 * G)
    first = [f for f in cts if not f.deps]
    assert len(first) == 2 and [msgs[s].deps for s in range(2)] == [(f.id,) for f in first]
    assert [done[f.id][1] for f in first] == pytest.approx([rtt / 2 + back, rtt / 2 + 2 * back], abs=2)  # ns ends
    assert done[msgs[0].id][0] == done[first[0].id][1]  # step 1 then goes on the wire behind step 0
    gbps = 2 * step * 8 / (rtt + xfer + back)
    assert gbps == pytest.approx(9.96, abs=0.005)
    assert spacing_ns(done, msgs, 4, 18) == pytest.approx(step * 8 / gbps, abs=1)
    assert done[msgs[-1].id][1] == pytest.approx(done[msgs[1].id][1] + 9 * (rtt + xfer + back), abs=18)  # ns rounding
    for f in (f for f in cts if f.deps):  # each on the idle reverse path: its propagation and its own transfer
        assert done[f.id][1] - done[f.id][0] == pytest.approx(rtt / 2 + back, abs=1)
    flows, done = p2p(1000, 8, 64, step)
    msgs = [f for f in flows if not is_credit(f)]
    assert spacing_ns(done, msgs, 8, 63) == pytest.approx(xfer, abs=1)
