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
from phantora.topology import Topology, rail_optimized
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


def reverse_burst_tree() -> tuple[list[Flow], list[Flow], list[Flow], list[Flow], Topology]:
    """`bench/bench_cts.py tree`'s loaded case: the 2-GPU chunked tree (GPU 1 the leaf, GPU 0 the root, 64 steps of
    64 KiB up and down, 8 in flight) on a star of 5 GPUs, 100 Gbit/s links of 1 µs, and 3 x 4 MiB from GPUs 2-4
    into the leaf: its flows, the leaf's steps up, the root's steps down, the root's CTSs to the leaf, and the
    topology."""
    from phantora.collectives.tree import tree_flows
    from tests.test_back_pressure import G, builder, sends, star

    topo, gpus = star([100 * G] * 5)
    b = builder(topo, gpus, "tree")
    tree_flows(b, [None, 0, None, None, None], 64 * 64 * 1024, 0, up=True, down=True, chunked=True,
               chunk_bytes=64 * 1024, step_delay_ns=0, name="tree", window=WINDOW)  # fmt: skip
    flows = b.finish().flows
    first = max(f.id for f in flows) + 1
    flows += [Flow(first + i, gpus[2 + i], gpus[1], 4 * MiB, tag=f"reverse{i}") for i in range(3)]
    up, down = sends(flows, gpus[1]), sends(flows, gpus[0])
    cts = [f for f in flows if is_cts(f) and (f.src, f.dst) == (gpus[0], gpus[1])]
    return flows, up, down, cts, topo


def ns3_run(
    topo: Topology, flows: list[Flow], seed: int, step_bytes: int = 0
) -> tuple[dict[int, tuple[int, int]], dict[str, object]]:
    """Flow id -> (start, end) ns on ns-3 (DCQCN, switches' ECN draw seeded `seed`; `step_bytes`: marking as a step
    at that queue, kmin = kmax, pmax 1, no draw), and the engine's stats."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import PacketConfig

    rate = 100 * 10**9
    marks = {"kmin_map": {rate: step_bytes}, "kmax_map": {rate: step_bytes}, "pmax_map": {rate: 1.0}}
    sim = make_engine(EngineSpec("ns3", PacketConfig(cc="dcqcn", seed=seed, **(marks if step_bytes else {}))), topo)
    try:
        sim.submit(flows, at=0)
        done = {c.flow_id: (c.start_ns, c.end_ns) for c in sim.drain()}
        stats = sim.stats()
    finally:
        sim.close()
    assert len(done) == len(flows)
    return done, stats


@pytest.mark.ns3
def test_ns3_a_trees_acks_gate_the_roots_cts_and_put_no_packet_on_the_wire(ns3_lib) -> None:
    """The root's forward of up step c into down step c waits for its staging slot, the write of down step c - 8
    acknowledged: the root's CTS for up step c + 8 leaves at max(up step c's end, down step c - 8's end + 2,000 ns,
    the ACK's way back over 2 links of 1 µs), for c = 8 .. 55 (48 ACKs), to the ns in ns-3 under the reverse burst.
    The ACKs are timers at the root, not packets: ns-3 sends exactly the data's and the CTSs' packets (1,000 B of
    payload each): 128 x 66 + 128 x 1 + 3 x 4,195 = 21,161."""
    flows, up, down, cts, topo = reverse_burst_tree()
    by_id = {f.id: f for f in flows}
    acks = [f for f in flows if is_ack(f)]
    assert len(acks) == 48 and len(cts) == len(up) == len(down) == 64
    done, stats = ns3_run(topo, flows, seed=1)
    for a in acks:
        (write,) = a.deps
        assert by_id[write] in down[:48] and a.src == a.dst == by_id[write].src
        assert done[a.id][0] == done[a.id][1] == done[write][1] + 2000
    for k in range(16, 64):
        assert done[cts[k].id][0] == max(done[up[k - 8].id][1], done[down[k - 16].id][1] + 2000)
    assert stats["data_packets"] == 128 * 66 + 128 + 3 * 4195 == 21161
    assert stats["payload_bytes_delivered"] == 2 * 64 * 64 * 1024 + 128 * 64 + 3 * 4 * MiB
    assert stats["drops"] == stats["pfc_pause"] == 0


@pytest.mark.ns3
def test_ns3_the_trees_end_under_the_burst_is_a_sample_of_the_ecn_draw(ns3_lib) -> None:
    """The same flows, the same packets: under RED marking (DCQCN's kmin .. kmax, a random draw a packet in between,
    one stream a switch) the seed alone moves the tree's end by more than 1%, the CE marks with it; marked as a
    step (kmin = kmax, no draw) the seed moves nothing. A change that shifts packets in time (the ACKs move the
    root's CTSs 2 µs) re-deals the draw as a new seed does: bench_cts.py tree's ns-3 end at 1 µs links is one
    sample (docs/collectives.md, "A write completes when its ACK is back")."""
    flows, _, down, _, topo = reverse_burst_tree()
    red = [ns3_run(topo, flows, seed) for seed in (1, 2)]
    step = [ns3_run(topo, flows, seed, step_bytes=400_000) for seed in (1, 2)]
    ends = [done[down[-1].id][1] for done, _ in red]
    assert abs(ends[0] - ends[1]) > 0.01 * min(ends)
    assert red[0][1]["data_packets"] == red[1][1]["data_packets"] and red[0][1]["ecn_marks"] != red[1][1]["ecn_marks"]
    assert step[0][0] == step[1][0] and step[0][1]["ecn_marks"] == step[1][1]["ecn_marks"]
