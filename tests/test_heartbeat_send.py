"""Heartbeats never block their sender (bridge.transport.send_heartbeat): a peer inside one long call (a network
server in a long ns-3 run) reads nothing, and a DEALER blocks once that peer leaves its high-water mark of
messages unread; a coordinator or supervisor blocked there could keep no silence limit (a hang seen once)."""

from __future__ import annotations

import time

import zmq

from bridge.transport import bind_router, connect_dealer, send_heartbeat


def test_heartbeats_to_a_peer_that_reads_nothing_are_dropped_not_blocked_on(tmp_path) -> None:
    ctx = zmq.Context()
    try:
        server, endpoint = bind_router(ctx, f"ipc://{tmp_path}/s.sock")
        client = connect_dealer(ctx, endpoint, connect=False)
        hwm = 8
        client.setsockopt(zmq.SNDHWM, hwm)
        server.setsockopt(zmq.RCVHWM, hwm)
        client.connect(endpoint)
        time.sleep(0.2)  # connected: messages queue toward the peer
        t0 = time.monotonic()
        sent = [send_heartbeat(client, b"beat") for _ in range(10 * hwm)]
        assert time.monotonic() - t0 < 2.0  # a blocking send would wait forever here
        assert sent[0] and not sent[-1]  # the first ones go; once the queues are full, the rest are dropped
        assert 0 < sum(sent) <= 4 * hwm  # at most both ends' high-water marks (and ZeroMQ's batching slack)
        server.close()
        client.close()
    finally:
        ctx.term()
