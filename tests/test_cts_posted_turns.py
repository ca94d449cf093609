"""The first window's clear-to-sends leave one proxy turn apart (`back_pressure.Credits.posted`). NCCL's receiving
proxy posts a connection's first NCCL_STEPS receives from the call's start, but one per call of
`recvProxyProgress` (net.cc, v2.29.7-1: a group's `posted += sliceSteps` once a call, then return), and its thread
calls each op's progress once a pass (proxy.cc `progressOps`): receive k is posted k turns after the first
(nccl/proxy.py PROXY_STEP_US, 600 ns a turn), and its CTS leaves then. Times against closed forms written here."""

from __future__ import annotations

import math

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit, is_cts, posted_ns
from phantora.collectives.nccl.proxy import PROXY_STEP_US
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.base import Flow
from phantora.topology import rail_optimized
from tests.engine_pair import start_end_ns
from tests.test_back_pressure import G, builder, star

KiB, MiB = 1 << 10, 1 << 20
TURN_NS = 600  # PROXY_STEP_US in ns
STEP, STEPS, WINDOW = 4 * KiB, 8, 8  # one window of steps shorter on the wire (327.68 ns) than a turn


def test_posted_ns_is_one_receive_a_turn() -> None:
    """Message k of a connection posted as r receives (a Simple ring chunk: 2 slices) starts with its first
    receive, k x r turns in; the first message's first receive at once."""
    assert round(PROXY_STEP_US * 1000) == TURN_NS
    assert [posted_ns(k, 1, TURN_NS) for k in range(4)] == [0, 600, 1200, 1800]
    assert [posted_ns(k, 2, TURN_NS) for k in range(2)] == [0, 1200]
    assert posted_ns(5, 1, 0) == 0


def one_window(turn_ns: int) -> tuple[list[Flow], list[int], list[Flow]]:
    """8 steps of 4 KiB from GPU 0 to GPU 1 (a host each) on a star of 100 Gbit/s, 1 µs links, 8 in flight: the
    flows, the steps' ids and the first window's CTSs in step order, with the proxy's turn `turn_ns`."""
    topo, gpus = star([100 * G] * 2, 1000)
    b = builder(topo, gpus, "p2p")
    b.turn_ns = turn_ns
    steps = b.add_chunks(0, 1, [STEP] * STEPS, "p2p", 0, window=WINDOW)
    flows = b.finish().flows
    by_id = {f.id: f for f in flows}
    posted = [by_id[d] for s in steps for d in by_id[s].deps if is_cts(by_id[d])]
    return flows, steps, posted


@pytest.mark.parametrize("network", ["flow", "ns3"])
def test_the_first_windows_ctss_leave_a_turn_apart(network: str) -> None:
    """CTS k leaves k x 600 ns after the start and lands 2 µs (the path) later, 64 B at 100 Gbit/s (5.12 ns) on the
    flow engine; step k waits for it, and, 327.68 ns on the wire, is done before CTS k + 1 lands: so step k starts
    as its CTS lands, k x 600 + 2,005.12 ns, each rounded up to its ns (flow engine). Through ns-3 (DCQCN) every
    CTS starts at k x 600 ns and every step starts once its CTS has landed, one turn after the step before, to 2 ns.
    Without the turn every CTS leaves at 0 and the steps go back to back on the wire."""
    flows, steps, posted = one_window(TURN_NS)
    assert [f.delay_ns for f in posted] == [k * TURN_NS for k in range(STEPS)]
    assert all(not f.deps and (f.src, f.dst, f.size) == (1, 0, 64) for f in posted)
    topo, _ = star([100 * G] * 2, 1000)
    done = start_end_ns(network, topo, flows)
    starts = [done[s][0] for s in steps]
    for k, (cts, start) in enumerate(zip(posted, starts, strict=True)):
        assert done[cts.id][0] == k * TURN_NS
        assert start >= done[cts.id][1]
        if network == "flow":
            assert start == math.ceil(k * TURN_NS + 2000 + 64 * 8e9 / (100 * G))
    assert all(b - a == pytest.approx(TURN_NS, abs=2) for a, b in zip(starts, starts[1:], strict=False))
    flat, steps0, posted0 = one_window(0)
    assert {f.delay_ns for f in posted0} == {0}
    early = start_end_ns("flow", topo, flat)
    assert early[steps0[-1]][0] < 2000 + STEPS * 400  # back to back, not a turn apart


def test_a_chunked_send_recv_posts_its_first_window_a_turn_apart() -> None:
    """A chunked 4 MiB send/recv between the hosts of 2 x 2 H100, on one rail (NCCL's p2p, 128 KiB steps, no relay):
    on each connection the CTSs without dependencies (its first window, 8 steps) carry the call's first delay (the
    first's) plus k turns, k = 0, ..., 7, in the order its steps wait for them; every later CTS waits for a
    consumption and carries no delay of its own."""
    topo = rail_optimized(2, 2, gpu="h100")
    coll = Collective("send_recv", (0, 2), 4 * MiB, "fp32")
    dag = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env({})))
    by_id = {f.id: f for f in dag.flows}
    steps = [f for f in dag.flows if not is_credit(f) and f.size > 0]
    per_conn: dict[int | None, list[int]] = {}
    for f in steps:
        for g in (by_id[d] for d in f.deps if is_cts(by_id[d])):
            if g.deps:
                assert g.delay_ns == 0
            else:
                per_conn.setdefault(f.conn, []).append(g.delay_ns)
    assert per_conn
    for delays in per_conn.values():
        assert [d - delays[0] for d in delays] == [k * TURN_NS for k in range(8)]
