"""What the coordinator and the network server do first: parse their flags, check the run's token, read its
setup and bind their socket."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import zmq

from bridge.errors import BridgeError
from bridge.runspec import RunSpec
from bridge.transport import bind_address, bind_router


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


def start_server(setup: str, transport: str, name: str, host: str = "127.0.0.1") -> ServerStart:
    """Read the setup and bind socket `name` ("coord", "net"); BridgeError if PHANTORA_TOKEN is not set."""
    token = os.environ.get("PHANTORA_TOKEN", "")
    if not token:
        raise BridgeError("PHANTORA_TOKEN is not set")
    spec = RunSpec.read(setup)
    run_dir = Path(setup).parent
    ctx = zmq.Context()
    sock, endpoint = bind_router(ctx, bind_address(transport, run_dir, name, host), spec.max_message_bytes)
    return ServerStart(spec, run_dir, token, ctx, sock, endpoint)
