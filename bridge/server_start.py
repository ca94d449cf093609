"""What the coordinator and the network server do first: parse their flags, check the run's token, read its
setup and bind their socket (a CURVE server when given the run's client keys: `bridge.curve`)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from bridge.curve import KeyPair, ServerCurve, start_authenticator
from bridge.errors import BridgeError
from bridge.runspec import RunSpec
from bridge.transport import bind_address, bind_router, process_log


def server_arguments(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The flags both servers take: the run's setup file and the transport."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--setup", required=True, help="the run's setup.msgpack")
    p.add_argument("--transport", default="ipc", choices=("ipc", "tcp"))
    p.add_argument("--bind", default="127.0.0.1", help="tcp: the interface to bind (beyond loopback: opt-in)")
    return p


@dataclass
class ServerStart:
    """A server's run: its spec and directory, the token peers must show, and its bound socket."""

    spec: RunSpec
    run_dir: Path
    token: str
    ctx: zmq.Context
    sock: zmq.Socket
    endpoint: str
    curve_public: bytes | None = None  # a CURVE server's public key, published beside the endpoint
    auth: ThreadAuthenticator | None = None

    def close(self) -> None:
        """Close the socket, stop the ZAP handler, end the context."""
        self.sock.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def start_server(
    setup: str, transport: str, name: str, host: str = "127.0.0.1", curve_clients: frozenset[bytes] | None = None
) -> ServerStart:
    """Read the setup and bind socket `name` ("coord", "net"); BridgeError if PHANTORA_TOKEN is not set.

    With `curve_clients` the socket is a CURVE server with a fresh key pair that lets in those client keys only.
    """
    token = os.environ.get("PHANTORA_TOKEN", "")
    if not token:
        raise BridgeError("PHANTORA_TOKEN is not set")
    spec = RunSpec.read(setup)
    run_dir = Path(setup).parent
    address = bind_address(transport, run_dir, name, host)
    if curve_clients is not None and transport != "tcp":
        raise BridgeError("CurveZMQ is for tcp: an ipc socket is private to its run directory")
    ctx = zmq.Context()
    curve = auth = None
    try:
        if curve_clients is not None:
            curve = ServerCurve(KeyPair.new(), curve_clients)
            auth = start_authenticator(ctx, curve_clients, process_log(f"{name} zap"))
        sock, endpoint = bind_router(ctx, address, spec.max_message_bytes, curve)
    except BaseException:
        if auth is not None:
            auth.stop()
        ctx.term()
        raise
    public = curve.keys.public if curve is not None else None
    return ServerStart(spec, run_dir, token, ctx, sock, endpoint, public, auth)
