"""CurveZMQ for bridge sockets that leave loopback: encryption, and a per-run allow-list of peers.

- Keys are made per run (`KeyPair.new`, ``zmq.curve_keypair``); a secret key never leaves the process that
  made it (never written to disk, never sent).
- The binding side is a CURVE server with its own key pair; the connecting side a CURVE client that must know
  the server's public key (it travels with the endpoint: a Ray worker's actor returns both, a file-published
  endpoint has ``NAME.key`` beside it, 0600).
- The server lets in only the clients whose public keys it was given (ZAP, `zmq.auth` ThreadAuthenticator):
  a peer with another key is refused in the handshake, before any message reaches the application. The
  run's token is still checked in the hello.
- `HandshakeWatch` reports a failed handshake on the client side (a socket monitor), so a wrong key ends the
  wait within a second with the endpoint and the reason, instead of a silent timeout.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

ZAP_DOMAIN = "phantora"
CLIENTS_ENV = "PHANTORA_CURVE_CLIENTS"  # the public keys (z85, comma-separated) a CURVE server lets in
KEY_LEN = 40  # a z85 CURVE key


def available() -> bool:
    """True when this libzmq was built with CURVE (pyzmq's wheels are)."""
    return bool(zmq.has("curve"))


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, z85-encoded."""

    public: bytes
    secret: bytes

    @classmethod
    def new(cls) -> KeyPair:
        if not available():
            raise zmq.ZMQError(msg="this libzmq has no CURVE support (needed beyond loopback)")
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


@dataclass(frozen=True)
class ServerCurve:
    """The binding side: its key pair and the client public keys it lets in."""

    keys: KeyPair
    clients: frozenset[bytes]


@dataclass(frozen=True)
class ClientCurve:
    """The connecting side: its key pair and the public key of the server it connects to."""

    keys: KeyPair
    server: bytes


def parse_key(text: str | bytes, what: str) -> bytes:
    """A z85 public key from text, or ValueError naming `what`."""
    key = (text.encode() if isinstance(text, str) else text).strip()
    if len(key) != KEY_LEN:
        raise ValueError(f"{what}: a CURVE public key is {KEY_LEN} z85 characters, got {len(key)}")
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, KeyError):
        raise ValueError(f"{what}: not a z85 CURVE key") from None
    return key


def clients_from_env() -> frozenset[bytes] | None:
    """The allow-list `CLIENTS_ENV` names, or None when it is unset (no CURVE asked for)."""
    text = os.environ.get(CLIENTS_ENV, "")
    if not text:
        return None
    return frozenset(parse_key(k, CLIENTS_ENV) for k in text.split(",") if k.strip())


class _AllowList:
    """ZAP credentials provider: a client key is let in only if it is on the list; refusals are logged."""

    def __init__(self, clients: frozenset[bytes], log: Callable[[str], None] | None) -> None:
        self.clients, self.log, self.refused = clients, log, 0

    def callback(self, domain: str, key: bytes) -> bool:
        ok = domain == ZAP_DOMAIN and key in self.clients
        if not ok:
            self.refused += 1
            if self.log is not None and self.refused <= 20:
                self.log(f"refused a CURVE client whose key is not one of the run's peers ({key[:8].decode()}...)")
        return ok


class LateAllowList(_AllowList):
    """An allow-list whose keys are known only after the server binds (peers that publish their keys with their
    endpoints, `bridge.cut_peers`): a handshake that comes before `set` waits for it, at most `wait_s`."""

    def __init__(self, log: Callable[[str], None] | None, wait_s: float) -> None:
        super().__init__(frozenset(), log)
        self.wait_s = wait_s
        self._known = threading.Event()

    def set(self, clients: frozenset[bytes]) -> None:
        self.clients = clients
        self._known.set()

    def known(self) -> bool:
        return self._known.is_set()

    def callback(self, domain: str, key: bytes) -> bool:
        self._known.wait(self.wait_s)
        return super().callback(domain, key)


def start_authenticator(
    ctx: zmq.Context, clients: frozenset[bytes] | _AllowList, log: Callable[[str], None] | None = None
) -> ThreadAuthenticator:
    """A ZAP handler on `ctx` letting in `clients` only (or what a given allow-list, e.g. a `LateAllowList`,
    lets in); stop it (`.stop()`) before the context terminates."""
    auth = ThreadAuthenticator(ctx)
    auth.start()
    allow = clients if isinstance(clients, _AllowList) else _AllowList(clients, log)
    auth.configure_curve_callback(ZAP_DOMAIN, allow)
    return auth


def make_server(sock: zmq.Socket, curve: ServerCurve) -> None:
    """Before bind: `sock` takes only CURVE clients, checked by the ZAP handler of its context."""
    sock.curve_server = True
    sock.curve_secretkey = curve.keys.secret
    sock.curve_publickey = curve.keys.public
    sock.zap_domain = ZAP_DOMAIN.encode()


def make_client(sock: zmq.Socket, curve: ClientCurve) -> None:
    """Before connect: `sock` talks CURVE to the server whose public key is `curve.server`."""
    sock.curve_serverkey = curve.server
    sock.curve_publickey = curve.keys.public
    sock.curve_secretkey = curve.keys.secret


_WATCHED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class HandshakeWatch:
    """Follows a connecting socket's ZMTP handshakes; `failure()` says why the last one failed, if it did."""

    def __init__(self, sock: zmq.Socket, endpoint: str, curve: bool) -> None:
        self.sock, self.endpoint, self.curve = sock, endpoint, curve
        self.monitor: zmq.Socket | None = sock.get_monitor_socket(_WATCHED)
        self.why: str | None = None

    def failure(self) -> str | None:
        """The reason the handshake with the endpoint failed, or None (not yet known, or it succeeded)."""
        while self.monitor is not None and self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.why = None
                self.close()
            else:
                self.why = self._reason(event)
        return self.why

    def _reason(self, event: int) -> str:
        where = self.endpoint
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return f"{where} refused our CURVE key: this process is not one of the run's peers"
        if not self.curve:
            return f"{where} requires CurveZMQ and we hold no server key for it (plain ZMTP was refused)"
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return f"{where} does not speak CurveZMQ (security mechanism mismatch)"
        return f"the CurveZMQ handshake with {where} failed: the server key we hold is not that server's"

    def close(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.monitor = None
