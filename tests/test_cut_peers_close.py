"""A partition worker that fails while reading its peers' files (bridge/cut_peers.py, 4601602) while a CurveZMQ
handshake waits in its ZAP handler for the run's keys (a `LateAllowList` not set yet): its `close` refuses that
handshake and returns at once, so the error comes out within seconds, not when the ZAP wait (the start-up
timeout, 60 s here) ends."""

from __future__ import annotations

import threading
import time

import zmq

from bridge.curve import ClientCurve, HandshakeWatch, KeyPair
from bridge.cut_peers import ZmqPeers
from bridge.transport import (
    connect_dealer,
    endpoint_file,
    make_run_dir,
    new_token,
    read_server_key,
    remove_run_dir,
    write_endpoint_file,
)

WAIT_S = 60.0  # the start-up timeout, and the ZAP handler's wait for the keys


def test_a_worker_failing_before_its_keys_does_not_sit_out_a_pending_handshake() -> None:
    root = make_run_dir()
    ctx = zmq.Context()
    failed: list[tuple[BaseException, float]] = []

    def worker() -> None:
        try:
            ZmqPeers(root, 0, 2, new_token(), transport="tcp", curve=True, startup_timeout_s=WAIT_S).close()
        except BaseException as exc:  # noqa: BLE001 - the failure under test
            failed.append((exc, time.monotonic()))

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        path = endpoint_file(root, "cut0")
        deadline = time.monotonic() + 20
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        endpoint, server_key = path.read_text().strip(), read_server_key(root, "cut0")
        assert server_key is not None
        outsider = connect_dealer(ctx, endpoint, curve=ClientCurve(KeyPair.new(), server_key), connect=False)
        watch = HandshakeWatch(outsider, endpoint, curve=True)
        outsider.connect(endpoint)
        outsider.send(b"hello")
        time.sleep(0.5)  # the handshake reaches the ZAP handler, which waits for the keys
        t0 = time.monotonic()
        write_endpoint_file(root, "cut1", "tcp://127.0.0.1:9", None)  # a peer without a key: the worker fails
        thread.join(timeout=WAIT_S + 10)
        assert failed and "published no CurveZMQ key" in str(failed[0][0])
        assert failed[0][1] - t0 < 5.0
        watch.close()
    finally:
        thread.join(timeout=WAIT_S + 10)
        ctx.destroy(linger=0)
        remove_run_dir(root)
