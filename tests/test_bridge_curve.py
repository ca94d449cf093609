"""CurveZMQ on bridge sockets beyond loopback (`bridge.curve`), exercised on loopback tcp with real sockets.

A real network server (`python -m bridge.netserver`, flow engine) is started as a CURVE server that lets in
one client key. Through a byte-recording tcp relay we check what crosses the wire: the run's token in clear
without CURVE, nowhere with it. Peers without the server key, with the wrong server key, or with a foreign
client key get nothing through, and the driver's error names the endpoint and the reason within seconds.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from bridge.curve import CLIENTS_ENV, ClientCurve, KeyPair, parse_key
from bridge.errors import BridgeError
from bridge.remote import RemoteSimulator
from bridge.runspec import RunSpec
from bridge.transport import (
    NETWORK_OPT_IN,
    bind_router,
    connect_dealer,
    key_file,
    make_run_dir,
    new_token,
    read_server_key,
    remove_run_dir,
)
from phantora.netsim.base import Flow
from phantora.topology.generators import rail_optimized

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="this libzmq has no CURVE")

ROOT = Path(__file__).resolve().parents[1]
SIZE = 1_000_000  # one flow of 1 MB over a 100 Gb/s NIC


@dataclass
class Server:
    endpoint: str
    key: bytes
    client: KeyPair
    token: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_netserver(run_dir: Path, clients: str | None, bind: str = "127.0.0.1") -> subprocess.Popen[bytes]:
    topo = rail_optimized(2, 1, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="pair")
    setup = run_dir / "setup.msgpack"
    setup.write_bytes(RunSpec(topology=topo, world=topo.num_ranks).to_bytes())
    env = {**os.environ, "PHANTORA_TOKEN": (run_dir / "token").read_text(), "PYTHONPATH": str(ROOT)}
    env.pop(CLIENTS_ENV, None)
    if clients is not None:
        env[CLIENTS_ENV] = clients
    argv = [sys.executable, "-m", "bridge.netserver", "--setup", str(setup), "--transport", "tcp", "--bind", bind]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=(run_dir / "log").open("wb"))


def wait_for_endpoint(run_dir: Path, proc: subprocess.Popen[bytes]) -> Path:
    """The server's endpoint file, once it has published it (the server's log if it died first)."""
    path = run_dir / "net.endpoint"
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (run_dir / "log").read_text()
        time.sleep(0.02)
    return path


@pytest.fixture
def server() -> Iterator[Server]:
    run_dir = make_run_dir()
    token = new_token()
    (run_dir / "token").write_text(token)
    client = KeyPair.new()
    proc = start_netserver(run_dir, client.public.decode())
    try:
        path = wait_for_endpoint(run_dir, proc)
        key = read_server_key(run_dir, "net")
        assert key is not None
        assert key_file(run_dir, "net").stat().st_mode & 0o777 == 0o600
        yield Server(path.read_text(), key, client, token, proc, run_dir / "log")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        remove_run_dir(run_dir)


def remote(ctx: zmq.Context, endpoint: str, token: str, curve: ClientCurve | None) -> RemoteSimulator:
    return RemoteSimulator(ctx, endpoint, token, startup_timeout_s=20, call_timeout_s=20, curve=curve)


class Relay:
    """A tcp relay on loopback that forwards one connection to `target` and keeps every byte it saw."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen = bytearray()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        a, _ = self.listener.accept()
        b = socket.create_connection(self.target)
        peer = {a: b, b: a}
        while not self.stop:
            ready, _, _ = select.select([a, b], [], [], 0.1)
            for s in ready:
                data = s.recv(65536)
                if not data:
                    self.stop = True
                    break
                self.seen += data
                peer[s].sendall(data)
        a.close()
        b.close()

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        self.listener.close()


def run_one_flow(sim: RemoteSimulator) -> int:
    sim.submit([Flow(0, 0, 1, SIZE)], 0)
    (done,) = sim.drain()
    return done.end_ns


def test_the_run_peer_talks_and_nothing_readable_crosses_the_wire(server: Server) -> None:
    """With CURVE the token (in the hello) never appears on the wire; a plain server's wire shows it, so the
    relay does see what it claims to see."""
    ctx = zmq.Context()
    relay = Relay(server.endpoint)
    try:
        sim = remote(ctx, relay.endpoint, server.token, ClientCurve(server.client, server.key))
        end = run_one_flow(sim)
        assert end >= SIZE * 8 // 100  # 1 MB at 100 Gb/s: at least 80 us
        sim.close()
    finally:
        relay.close()
        ctx.term()
    assert len(relay.seen) > 200 and server.token.encode() not in relay.seen

    ctx = zmq.Context()  # the same exchange with a plain server: the token crosses in clear
    sock, endpoint = bind_router(ctx, "tcp://127.0.0.1:*")
    relay = Relay(endpoint)
    try:
        dealer = connect_dealer(ctx, relay.endpoint)
        dealer.send(server.token.encode())
        assert sock.poll(5000) and sock.recv_multipart()[1] == server.token.encode()
        dealer.close(0)
    finally:
        relay.close()
        sock.close(0)
        ctx.term()
    assert server.token.encode() in relay.seen


@pytest.mark.parametrize(
    ("who", "why"),
    [
        ("no key", "requires CurveZMQ and we hold no server key"),
        ("foreign client key", "refused our CURVE key: this process is not one of the run's peers"),
        ("wrong server key", "the server key we hold is not that server's"),
    ],
)
def test_a_peer_without_the_run_keys_gets_nothing_through(server: Server, who: str, why: str) -> None:
    ctx = zmq.Context()
    try:
        curve = {
            "no key": None,
            "foreign client key": ClientCurve(KeyPair.new(), server.key),
            "wrong server key": ClientCurve(server.client, KeyPair.new().public),
        }[who]
        t0 = time.monotonic()
        with pytest.raises(BridgeError) as err:
            remote(ctx, server.endpoint, server.token, curve)
        assert why in str(err.value) and server.endpoint in str(err.value)
        assert time.monotonic() - t0 < 5.0  # told within seconds, not after the 20 s start-up timeout
        assert err.value.code == "auth"
        # the run's own peer still works, and the server never saw a message from the intruder
        sim = remote(ctx, server.endpoint, server.token, ClientCurve(server.client, server.key))
        assert run_one_flow(sim) > 0
        assert sim.stats()["server_rejected_messages"] == 0
        sim.close()
    finally:
        ctx.term()
    server.proc.wait(10)
    if who == "foreign client key":
        assert "refused a CURVE client" in server.log.read_text()


def test_beyond_loopback_the_bridge_refuses_to_run_without_curve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NETWORK_OPT_IN, "1")
    ctx = zmq.Context()
    try:
        with pytest.raises(BridgeError, match="refusing to bind tcp://192.0.2.1:\\* without CurveZMQ"):
            bind_router(ctx, "tcp://192.0.2.1:*")
        with pytest.raises(BridgeError, match="refusing to connect to tcp://192.0.2.1:5555 without its CurveZMQ"):
            connect_dealer(ctx, "tcp://192.0.2.1:5555")
    finally:
        ctx.term()
    run_dir = make_run_dir()
    try:
        (run_dir / "token").write_text(new_token())
        proc = start_netserver(run_dir, None, bind="192.0.2.1")
        assert proc.wait(60) == 2
        assert "without CurveZMQ" in (run_dir / "log").read_text()
    finally:
        remove_run_dir(run_dir)


def test_a_bad_client_key_in_the_environment_is_named() -> None:
    with pytest.raises(ValueError, match="PHANTORA_CURVE_CLIENTS: a CURVE public key is 40 z85 characters, got 5"):
        parse_key("abcde", CLIENTS_ENV)


def test_a_damaged_key_file_is_named(tmp_path: Path) -> None:
    key_file(tmp_path, "net").write_bytes(b"short\n")
    with pytest.raises(BridgeError, match=f"{tmp_path}/net.key: a CURVE public key is 40 z85 characters, got 5"):
        read_server_key(tmp_path, "net")


def this_host_address() -> str | None:
    """This machine's address on its default route (not loopback), or None."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("198.51.100.1", 9))  # no packet is sent: this only picks the outgoing interface
        addr: str = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if addr.startswith("127.") else addr


def test_beyond_loopback_a_curve_server_serves_the_run_peer_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real thing: a network server bound to this machine's network address, as a Ray worker on another
    node binds; the driver needs the opt-in and the server's key, and then runs a flow through it."""
    host = this_host_address()
    if host is None:
        pytest.skip("no network interface besides loopback")
    monkeypatch.setenv(NETWORK_OPT_IN, "1")
    run_dir = make_run_dir()
    token = new_token()
    (run_dir / "token").write_text(token)
    client = KeyPair.new()
    proc = start_netserver(run_dir, client.public.decode(), bind=host)
    ctx = zmq.Context()
    try:
        path = wait_for_endpoint(run_dir, proc)
        endpoint = path.read_text()
        key = read_server_key(run_dir, "net")
        assert endpoint.startswith(f"tcp://{host}:") and key is not None
        with pytest.raises(BridgeError, match=f"refusing to connect to {endpoint} without its CurveZMQ server key"):
            remote(ctx, endpoint, token, None)
        monkeypatch.delenv(NETWORK_OPT_IN)
        with pytest.raises(BridgeError, match="the bridge uses 127.0.0.1 unless PHANTORA_BRIDGE_NETWORK=1"):
            remote(ctx, endpoint, token, ClientCurve(client, key))
        monkeypatch.setenv(NETWORK_OPT_IN, "1")
        sim = remote(ctx, endpoint, token, ClientCurve(client, key))
        assert run_one_flow(sim) >= SIZE * 8 // 100
        sim.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        ctx.term()
        remove_run_dir(run_dir)


def test_ray_beyond_this_machine_needs_the_network_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    from bridge.ray_workers import RayPlacement
    from phantora.errors import PhantoraError

    monkeypatch.delenv(NETWORK_OPT_IN, raising=False)
    with pytest.raises(PhantoraError, match="ray=192.0.2.1:6379: .* set PHANTORA_BRIDGE_NETWORK=1"):
        RayPlacement("192.0.2.1:6379", 2)
