"""A partition worker that fails while reading its peers' files (bridge/cut_peers.py, 4601602) while a CurveZMQ
handshake waits in its ZAP handler for the run's keys (a `LateAllowList` not set yet): its `close` refuses that
handshake and returns at once, so the error comes out within seconds, not when the ZAP wait (the start-up
timeout, 60 s here) ends."""

from __future__ import annotations

import threading
import time

from bridge.cut_peers import ZmqPeers
from bridge.transport import new_token, write_endpoint_file
from tests.curve_outsider import dial_as_outsider, published_endpoint, run_dir_and_context

WAIT_S = 60.0  # the start-up timeout, and the ZAP handler's wait for the keys


def test_a_worker_failing_before_its_keys_does_not_sit_out_a_pending_handshake() -> None:
    failed: list[tuple[BaseException, float]] = []
    with run_dir_and_context() as (root, ctx):

        def worker() -> None:
            try:
                ZmqPeers(root, 0, 2, new_token(), transport="tcp", curve=True, startup_timeout_s=WAIT_S).close()
            except BaseException as exc:  # noqa: BLE001 - the failure under test
                failed.append((exc, time.monotonic()))

        thread = threading.Thread(target=worker)
        thread.start()
        try:
            outsider, watch = dial_as_outsider(ctx, *published_endpoint(root, "cut0"))
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
