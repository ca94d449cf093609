"""Steps in flight on NCCL's network p2p connections (`--granularity chunked`): a GPU's shared p2p buffer has
NCCL_SHARED_STEPS = 16 slots a channel, and each of the channel's network transfers in one call (a sub of one proxy
operation) runs at most min(NCCL_STEPS, 16 / nsubs) steps ahead (net.cc `sendProxyProgress` /
`recvProxyProgress`, v2.17.1-1 to v2.30.7-1). Counts against that formula, written out here."""

from __future__ import annotations

from collections import defaultdict

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.nccl.shared_steps import shared_depths, steps_in_flight
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, rail_optimized

MiB = 1 << 20
NCCL_STEPS, NCCL_SHARED_STEPS = 8, 16  # src/include/device.h, src/transport/net.cc
NET_P2P_STEP = 128 * 1024  # the p2p chunk across hosts (enqueue.cc addP2pToPlan) at these sizes
CTS_BYTES = 64  # sizeof(struct ncclIbSendFifo), src/transport/net_ib/common.h (NCCL v2.29.7-1)


def about_coarse(chunked: float, coarse: float) -> bool:
    """Chunked takes coarse's time to 0.01%, plus at most the clear-to-sends' bytes: every GPU sends and receives
    across hosts, so each step's 64 B clear-to-send leaves by the NIC the GPU's own steps leave by (64 B a 128 KiB
    step)."""
    return coarse * (1 - 1e-4) <= chunked <= coarse * (1 + 1e-4 + CTS_BYTES / NET_P2P_STEP)


@pytest.mark.parametrize(("subs", "depth"), [(1, 8), (2, 8), (3, 5), (4, 4), (5, 3), (8, 2), (16, 1), (20, 1)])
def test_a_subs_depth_is_the_shared_slots_over_the_subs(subs: int, depth: int) -> None:
    """min(8, 16 // nsubs); past 16 subs NCCL's figure is 0, which would never post: one step."""
    assert steps_in_flight(subs) == depth
    assert depth == max(1, min(NCCL_STEPS, NCCL_SHARED_STEPS // subs))


def test_the_busier_side_of_a_connection_sets_its_depth() -> None:
    """Sender 0's proxy has 4 transfers on channel 1 (depth 4), receiver 9 has 8 there (depth 2): 0 -> 9 runs 2
    ahead; 0 -> 10 (its receiver has only 0's) runs 4; channel 0 holds one transfer (8)."""
    transfers = [(0, 9, 0, [1]), (0, 10, 0, [1]), (0, 11, 0, [1]), (0, 12, 0, [1]), (0, 13, 0, [0])]
    transfers += [(s, 9, s, [1]) for s in range(1, 8)]
    d = shared_depths(transfers)
    assert d[0, 9, 1] == 2 and d[0, 10, 1] == 4 and d[0, 13, 0] == 8


def test_a_relays_proxy_counts_each_senders_transfers_apart() -> None:
    """PXN: 0's 4 transfers on channel 1 go through 4 relays (1-4), each relay's proxy holds one operation per
    sender (net.cc `localPeers[tpLocalRank]`): one sub each, so 8 ahead where one proxy would run them 4."""
    transfers = [(0, 9 + k, 1 + k, [1]) for k in range(4)]
    assert set(shared_depths(transfers).values()) == {8}
    assert set(shared_depths([(0, 9 + k, 0, [1]) for k in range(4)]).values()) == {4}


def steps_ahead(topo: Topology, size: int, gpus: int) -> tuple[dict[bool, set[int]], float, float]:
    """For the chunked all-to-all on every rank: how far back the slot each step waits for is (by whether the
    transfer goes to another host, on either hop of a PXN relay, or not), and the chunked and coarse times (µs) on
    an idle flow network."""
    coll = Collective("all_to_all", tuple(range(gpus)), size, "fp32")
    times = []
    for g in ("chunked", "coarse"):
        dag = decompose(coll, topo, AlgoOptions(granularity=g, nccl_env=nccl_env({})))
        sim = FlowSimulator(topo)
        sim.submit(dag.flows, at=0)
        times.append(max(c.end_ns for c in sim.drain()) / 1e3)
        if g == "chunked":
            flows = dag.flows
    by_id = {f.id: f for f in flows}
    parts: dict[tuple[int, int, int, str], list] = defaultdict(list)  # one per part and hop (conn: its origin's)
    for f in flows:
        if not is_credit(f):  # the steps, not the credits going back (`back_pressure.py`)
            parts[f.src, f.dst, f.conn, f.tag.rsplit("/chunk", 1)[0]].append(f)
    back: dict[bool, set[int]] = {True: set(), False: set()}
    for (src, dst, _, tag), steps in parts.items():
        remote = topo.nodes[src].host != topo.nodes[dst].host or tag.endswith("/pxn")  # PXN's NVLink hop: a remote's
        index = {f.id: i for i, f in enumerate(steps)}
        for i, f in enumerate(steps):
            waits = {e for d in f.deps for e in (by_id[d].deps if is_credit(by_id[d]) else (d,))}  # through credits
            back[remote] |= {i - index[d] for d in waits if d in index}
            if i >= NCCL_STEPS:  # past the window every step waits for a slot
                assert any(d in index for d in waits)
    return back, times[0], times[1]


def test_an_all_to_all_across_two_hosts_of_8_runs_two_steps_a_remote_peer() -> None:
    """Two hosts of 8 A100 (rail-optimised, 400G: 4 channels a peer, 1 MiB parts of 128 KiB steps at 64 MiB): a GPU's
    8 remote peers share the same channels (`ncclP2pChannelBaseForRound`), 8 subs, 16 // 8 = 2 steps ahead, on
    both hops of a PXN relay; its 7 peers in the host (NVLink, no shared net buffer) run 8 ahead, so none of their
    8 steps waits. The window does not bind on an idle network: chunked takes coarse's time (`about_coarse`)."""
    topo = rail_optimized(2, 8, gpu="a100")
    back, chunked, coarse = steps_ahead(topo, 64 * MiB, 16)
    assert back[True] == {NCCL_SHARED_STEPS // 8}
    assert back[False] == set()
    assert about_coarse(chunked, coarse), (chunked, coarse)


@pytest.mark.parametrize(("hosts", "gpus", "ahead"), [(2, 4, 4), (3, 1, 8)])
def test_the_remote_peers_sharing_a_channel_set_the_depth(hosts: int, gpus: int, ahead: int) -> None:
    """Two hosts of 4 H100: a GPU's 4 remote peers share one channel base, 16 // 4 = 4 steps ahead. Three hosts of
    one: its 2 remote peers' rounds have their own bases (`ncclP2pChannelBaseForRound`: a node's delta times
    ceil(1 / 8)), one sub a channel, NCCL_STEPS ahead."""
    topo = rail_optimized(hosts, gpus, gpu="h100")
    back, chunked, coarse = steps_ahead(topo, 48 * MiB, hosts * gpus)
    assert back[True] == {ahead}
    assert about_coarse(chunked, coarse), (chunked, coarse)
