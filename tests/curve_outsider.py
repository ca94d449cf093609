"""What the CurveZMQ partition-worker tests share (test_cut_ray.py, test_cut_peers_close.py): a run directory and
a ZMQ context, a worker's published endpoint, and an outsider that dials it with a fresh key (not a run key)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from bridge.curve import ClientCurve, HandshakeWatch, KeyPair
from bridge.transport import connect_dealer, endpoint_file, make_run_dir, read_server_key, remove_run_dir


@contextmanager
def run_dir_and_context() -> Iterator[tuple[Path, zmq.Context]]:
    """A fresh run directory and a ZMQ context; afterwards the context is destroyed (linger 0) and the
    directory removed. Leave it after the workers' threads are joined and their peers closed."""
    root = make_run_dir()
    ctx = zmq.Context()
    try:
        yield root, ctx
    finally:
        ctx.destroy(linger=0)
        remove_run_dir(root)


def published_endpoint(root: Path, name: str, timeout_s: float = 20.0) -> tuple[str, bytes]:
    """The endpoint and CurveZMQ server key the worker `name` (e.g. "cut0") published, waiting up to timeout_s."""
    path = endpoint_file(root, name)
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), f"{name} published no endpoint ({path}) within {timeout_s} s"
    endpoint, server_key = path.read_text().strip(), read_server_key(root, name)
    assert server_key is not None, f"{name} published no CurveZMQ key"
    return endpoint, server_key


def dial_as_outsider(ctx: zmq.Context, endpoint: str, server_key: bytes) -> tuple[zmq.Socket, HandshakeWatch]:
    """A dealer with a fresh key (not a run key) connected to `endpoint`, and the watch on its handshake."""
    outsider = connect_dealer(ctx, endpoint, curve=ClientCurve(KeyPair.new(), server_key), connect=False)
    watch = HandshakeWatch(outsider, endpoint, curve=True)
    outsider.connect(endpoint)
    return outsider, watch
