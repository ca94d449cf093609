"""A PXN relay's slot frees when the relay's proxy has sent its step on across the network, not when the step lands
at the relay, and the relay's network step goes only once its NVLink step has landed (`collectives/relay_steps.py`).
Under PXN the sender's kernel writes each step over NVLink into the relay GPU's proxy buffer (NCCL's shared p2p
buffer), and the relay's proxy posts the network send from it; net.cc `sendProxyProgress` (NCCL v2.29.7-1, shared
buffers) hands the kernel step s + window's slot only once its isend of step s is done (`posted < done + maxDepth`,
`done` raised by `ncclNet->test`), and that isend itself waits for the receiver's clear-to-send and for step s in
its buffer (the tail past it). So a slow network leg holds the sender's NVLink steps to a window ahead of it, and a
slow NVLink leg holds the network steps behind it. Closed forms written out here: GPU 1 of host 0 sends to GPU 0 of
host 1 on a 4-GPU communicator (rank 0 relays: its GPU sits on the receiver's rail), over NICs of 25 Gbit/s, NVLink
far faster (or NVLink of 25 Gbit/s, NICs of 400)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import NCCL_STEPS, is_credit, is_cts
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.p2p import send_recv
from phantora.collectives.relay_steps import is_tail
from phantora.netsim.base import Flow
from phantora.topology import rail_optimized
from phantora.topology.model import Topology
from tests.engine_pair import start_end_ns
from tests.test_back_pressure import builder, star

MiB = 1 << 20
NIC_BPS = 25 * 10**9
P2P_NET_CHUNK = 128 * 1024  # NCCL_P2P_NET_CHUNKSIZE's default: a step of the transfer across hosts
TURN_NS = 600  # a proxy's progress turn (nccl/proxy.py PROXY_STEP_US): the relay's proxy polls the tail once a turn
SENDER, RELAY, RECEIVER = 1, 0, 2  # ranks: host 0 rail 1, host 0 rail 0, host 1 rail 0


def relayed_send(nbytes: int, topo: Topology | None = None) -> tuple[Topology, list[Flow], list[Flow], list[Flow]]:
    """The chunked send's topology (default: 2 x 2 H100 with NICs of 25 Gbit/s), flows, NVLink steps (sender ->
    relay) and network steps (relay -> receiver)."""
    topo = topo or rail_optimized(2, 2, spines=2, nic_rate=NIC_BPS, gpu="h100")
    coll = Collective("send_recv", (SENDER, RECEIVER), nbytes, "fp32", None, (0, 1, 2, 3))
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env({})))
    s, v, d = (topo.node_of_rank(r) for r in (SENDER, RELAY, RECEIVER))
    nvlink = [f for f in dag.flows if (f.src, f.dst) == (s, v) and not is_credit(f)]
    net = [f for f in dag.flows if (f.src, f.dst) == (v, d) and not is_credit(f)]
    return topo, dag.flows, nvlink, net


def run(network: str, topo: Topology, flows: list[Flow]) -> dict[int, tuple[int, int]]:
    """Flow id -> (start, end) ns, every flow submitted at 0."""
    return start_end_ns(network, topo, flows)


@pytest.mark.parametrize("network", ["flow", "ns3"])
def test_the_senders_step_waits_for_the_relays_network_send_a_window_back(network: str) -> None:
    """4 MiB in 32 steps of 128 KiB, 8 in flight (NCCL_STEPS: a p2p step takes one slot). Every NVLink step past
    the first window starts when the relay's network send of the step a window back is done, its ACK back at the
    relay (the network path's propagation from the receiver, `Credits.acked`), and the slot's credit has crossed
    back to the sender (the NVLink path's propagation, a flag's store), to the ns, in both engines; the sender's
    first window goes at once (the relay's proxy posts it with the op)."""
    topo, flows, nvlink, net = relayed_send(4 * MiB)
    assert len(nvlink) == len(net) == 4 * MiB // P2P_NET_CHUNK
    assert {f.size for f in nvlink + net} == {P2P_NET_CHUNK}
    s, v = topo.node_of_rank(SENDER), topo.node_of_rank(RELAY)
    credit_ns = topo.path_latency_ns(topo.route(v, s))
    ack_ns = topo.path_latency_ns(topo.route(topo.node_of_rank(RECEIVER), v))
    assert 0 < credit_ns < 1000 < ack_ns
    done = run(network, topo, flows)
    first = done[nvlink[0].id][0]
    assert all(done[f.id][0] <= first + NCCL_STEPS * 400 for f in nvlink[:NCCL_STEPS])  # not held by the network
    for c in range(NCCL_STEPS, len(nvlink)):
        want = done[net[c - NCCL_STEPS].id][1] + ack_ns + credit_ns
        assert done[nvlink[c].id][0] == pytest.approx(want, abs=1)


def test_a_slow_network_leg_paces_the_sender_a_window_ahead() -> None:
    """Flow engine: the relay's network leg moves a step per 128 KiB / 25 Gbit/s = 41,943.04 ns (its NIC is the
    bottleneck; the receiver's clear-to-sends are back long before the window runs out), so the sender's NVLink
    steps past the first window go at that pace too, where freed on arrival at the relay they went at NVLink's
    (all 32 within a few µs). The sender's last step goes a window of network steps before the transfer ends:
    8 x 41,943.04 ns less the ACK's way back to the relay and the credit's to the sender."""
    topo, flows, nvlink, net = relayed_send(4 * MiB)
    done = run("flow", topo, flows)
    step_ns = P2P_NET_CHUNK * 8e9 / NIC_BPS
    ends = [done[f.id][1] for f in net]
    assert (ends[-1] - ends[1]) / (len(ends) - 2) == pytest.approx(step_ns, abs=1)
    starts = [done[f.id][0] for f in nvlink]
    for c in range(NCCL_STEPS + 1, len(nvlink)):
        assert starts[c] - starts[c - 1] == pytest.approx(step_ns, abs=2)
    s, v = topo.node_of_rank(SENDER), topo.node_of_rank(RELAY)
    credit_ns = topo.path_latency_ns(topo.route(v, s))
    ack_ns = topo.path_latency_ns(topo.route(topo.node_of_rank(RECEIVER), v))
    assert ends[-1] - starts[-1] == pytest.approx(NCCL_STEPS * step_ns - credit_ns - ack_ns, abs=NCCL_STEPS)


def test_one_slot_frees_when_the_relay_has_sent_the_step_before() -> None:
    """A relayed connection of one step in flight (NCCL's shared buffer split among more than NCCL_SHARED_STEPS / 2
    transfers of the relay's proxy: `maxDepth` 1): on a star of 1 µs links whose receiver's link runs at 25 of 100
    Gbit/s, the sender's step c goes when the relay's network send of step c - 1 is done (it has ended and its ACK
    has crossed the 2 µs path back to the relay), and the relay's network send of step c when step c has landed in
    its buffer and the tail's store has crossed the 2 µs path. So the steps go one per 128 KiB at 100 Gbit/s + 2
    µs, + 2 µs, + 128 KiB at 25 Gbit/s + 2 µs + 2 µs = 60,428.8 ns (each hop one flow at its link's rate)."""
    topo, gpus = star([100 * 10**9, NIC_BPS, 100 * 10**9])  # the sender, the receiver, the relay
    b = builder(topo, gpus, "p2p")
    sizes = 16
    send_recv(b, sizes * P2P_NET_CHUNK, 1, 0, "p2p", relay=lambda s, d: 2, chunk=lambda s, d, n: P2P_NET_CHUNK)
    flows = b.finish().flows
    done = run("flow", topo, flows)
    nvlink = [f for f in flows if (f.src, f.dst) == (gpus[0], gpus[2])]
    net = [f for f in flows if (f.src, f.dst) == (gpus[2], gpus[1])]
    assert len(nvlink) == len(net) == sizes
    path_ns = 2 * 1000
    for c in range(sizes):
        assert done[net[c].id][0] == done[nvlink[c].id][1] + path_ns
        if c:
            assert done[nvlink[c].id][0] == done[net[c - 1].id][1] + path_ns
    cycle = P2P_NET_CHUNK * 8e9 / 10**11 + P2P_NET_CHUNK * 8e9 / NIC_BPS + 4 * path_ns
    assert done[net[-1].id][1] - done[net[0].id][1] == pytest.approx((sizes - 1) * cycle, abs=3 * sizes)


def slow_nvlink_send(nbytes: int) -> tuple[Topology, list[Flow], list[Flow], list[Flow]]:
    """`relayed_send` on hosts whose NVLink runs at 25 Gbit/s, NICs at 400: NVLink is the slow leg."""
    return relayed_send(nbytes, rail_optimized(2, 2, spines=2, nic_rate=400 * 10**9, nvlink_rate=NIC_BPS, gpu="h100"))


@pytest.mark.parametrize("network", ["flow", "ns3"])
def test_the_relays_network_step_goes_once_its_nvlink_step_has_landed(network: str) -> None:
    """NCCL's relay proxy posts the isend of step s only once the sender's kernel has written step s into its
    buffer and raised the tail past it (net.cc `sendProxyProgress`: `connFifo[buffSlot].size != -1 && *recvTail >
    tail`, v2.29.7-1). With NVLink the slow leg (25 Gbit/s, NICs of 400) each of the 32 network steps (4 channels of
    8 steps of 128 KiB) starts at its NVLink step's end + the tail's store across the NVSwitch (50 ns) + the relay
    proxy's turn that polls it (600 ns, nccl/proxy.py PROXY_STEP_US), to the ns in both engines. On the flow engine
    the 4 channels' NVLink steps share the link: each takes 4 x 128 KiB / 25
    Gbit/s + 50 ns, back to back on its channel (the fast network frees every slot long before it is needed)."""
    topo, flows, nvlink, net = slow_nvlink_send(4 * MiB)
    assert len(nvlink) == len(net) == 4 * MiB // P2P_NET_CHUNK
    s, v = topo.node_of_rank(SENDER), topo.node_of_rank(RELAY)
    tail_ns = topo.path_latency_ns(topo.route(s, v))
    assert tail_ns == 50
    done = run(network, topo, flows)
    for a, b in zip(nvlink, net, strict=True):
        assert done[b.id][0] == done[a.id][1] + tail_ns + TURN_NS
    if network == "flow":
        step_ns = 4 * P2P_NET_CHUNK * 8e9 / NIC_BPS + tail_ns
        for f in nvlink:
            assert done[f.id][1] - done[f.id][0] == pytest.approx(step_ns, abs=1)


@pytest.mark.parametrize("network", ["flow", "ns3"])
def test_no_relayed_network_step_of_an_all_to_all_starts_before_its_nvlink_step_ends(network: str) -> None:
    """A chunked 16 MiB all-to-all over 2 x 4 H100 on rails (NCCL's choice, PXN relaying every cross-rail block):
    each NVLink step into a relay has exactly one network step sent from its tail, and that step starts no earlier
    than the NVLink step's end + the tail's store (50 ns) + the relay proxy's turn (600 ns), whatever else the relay's
    NIC and queues carry."""
    topo = rail_optimized(2, 4, spines=2, gpu="h100")
    coll = Collective("all_to_all", tuple(range(8)), 16 * MiB, "fp32", None)
    flows = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env({}))).flows
    by_id = {f.id: f for f in flows}
    nvlink = [f for f in flows if "/pxn/" in f.tag and not is_credit(f)]
    assert len(nvlink) >= 2 * 4 * 3  # every sender relays to the 3 GPUs of the other host off its rail
    sent_on = {}
    for f in flows:
        for d in f.deps:
            t = by_id.get(d)
            if t is not None and is_tail(t) and f.size and f.src != f.dst:
                sent_on[f.id] = t.deps[0]
    assert sorted(sent_on.values()) == sorted(f.id for f in nvlink)
    done = run(network, topo, flows)
    for net_id, nv_id in sent_on.items():
        assert done[net_id][0] >= done[nv_id][1] + 50 + TURN_NS


def test_the_relays_first_step_runs_within_nccls_latency() -> None:
    """The sender's kernel writes its first step into the relay's buffer while NCCL's latency runs, so each part's
    first NVLink step is released its idle time before the call's first delay ends (the delay the receiver's first
    clear-to-send carries; the later ones of its first window go a proxy turn apart): the NVSwitch's 50 ns, 128 KiB at
    its rate (its cap, else the NVLink's), the tail's 50 ns and the relay proxy's turn, 600 ns. The relay's network
    leg then starts when NCCL's latency says, as it did when the hops ran side by side."""
    topo, flows, nvlink, net = relayed_send(4 * MiB)
    delay = min(f.delay_ns for f in flows if is_cts(f) and not f.deps)
    firsts = [f for f in nvlink if f.tag.endswith("/chunk0")]
    assert firsts  # one a channel
    for f in firsts:
        rate = f.rate_bps or min(topo.links[c >> 1].bandwidth_bps for c in topo.route(f.src, f.dst, f.key))
        assert f.delay_ns == delay - (50 + round(P2P_NET_CHUNK * 8e9 / rate) + 50 + TURN_NS)
    assert {f.delay_ns for f in nvlink if not f.deps and f not in firsts} == {delay}  # the rest of the window
