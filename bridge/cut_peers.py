"""The peer-to-peer exchange of partition workers (issue 38): `phantora.netsim.cut_windows.Peers` over ZeroMQ.

Every worker binds a ROUTER (ipc in the run's private directory, or loopback tcp) and publishes its endpoint there;
it connects a DEALER to every other worker's. A peer is let in by its hello, which must show the run's token
(`bridge.transport.token_ok`) and another worker's group; anything else from an identity not let in is dropped and
counted. Peers are known by the group they declare, not by their socket identity (a peer that reconnects gets a new
identity and says hello again). Every message is msgpack: the hello ``{"k": "hello", "token", "group"}``, then at each
barrier ``{"k": "win", "seq", "next", "arr", "batch", "rel", "key", "samp"}`` to every other worker (the batch may be
empty). A barrier waits for every other worker's message of its sequence number, at most `timeout_s` of silence (the
first barrier, which follows every worker's set-up and flows, the startup timeout), then raises naming the workers it
still waits for (a dead or stuck worker takes the run down, named).

With ``curve`` (tcp; required beyond loopback, as Ray places workers on other machines, `bridge.cut_ray`) every
worker makes its own CURVE key pair (the secret never leaves it), binds its ROUTER as a CURVE server and publishes
its public key beside its endpoint (`bridge.transport.write_endpoint_file`); it connects to each other worker as a
CURVE client with that worker's published key, and lets in only the other workers' keys (a `LateAllowList`: a
handshake that comes before every key is read waits for them). The token is still checked in the hello.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bridge.curve import ClientCurve, KeyPair, LateAllowList, ServerCurve, start_authenticator
from bridge.errors import BridgeError
from bridge.protocol import E_TIMEOUT
from bridge.transport import (
    HEARTBEAT_S,
    LOOPBACK,
    bind_address,
    bind_router,
    connect_dealer,
    endpoint_file,
    process_log,
    read_server_key,
    token_ok,
    write_endpoint_file,
)
from phantora.netsim.cut_windows import NEVER, PeerReport

PEER_TIMEOUT_S = 60.0  # silence from a peer inside a run after which it is taken for dead
MAX_BATCH_BYTES = 1 << 30


def peer_name(group: int) -> str:
    """The name of a worker's endpoint (and key) file: ``cutG``."""
    return f"cut{group}"


class ZmqPeers:
    """One worker's links to the other workers of its partition."""

    def __init__(
        self,
        run_dir: Path,
        group: int,
        groups: int,
        token: str,
        *,
        transport: str = "ipc",
        host: str = LOOPBACK,
        curve: bool = False,
        startup_timeout_s: float = 180.0,
        timeout_s: float = PEER_TIMEOUT_S,
    ) -> None:
        self.group, self.groups, self.timeout_s = group, groups, timeout_s
        self.curve = curve
        self._first_timeout_s = max(timeout_s, startup_timeout_s)  # the first barrier follows each one's set-up
        self._token = token
        self._ctx = zmq.Context()
        self._auth: Any = None
        self._keys: KeyPair | None = None
        self._allow: LateAllowList | None = None
        server: ServerCurve | None = None
        if curve:
            self._keys = KeyPair.new()
            self._allow = LateAllowList(process_log(f"cut{group} zap"), startup_timeout_s)
            self._auth = start_authenticator(self._ctx, self._allow)
            server = ServerCurve(self._keys, frozenset())  # who is let in: `self._allow`, once the keys are read
        address = bind_address(transport, run_dir, peer_name(group), host)
        try:
            self._router, endpoint = bind_router(self._ctx, address, MAX_BATCH_BYTES, server)
        except BaseException:
            self.close()
            raise
        write_endpoint_file(run_dir, peer_name(group), endpoint, self._keys.public if self._keys else None)
        self._peers: dict[int, zmq.Socket] = {}
        # ROUTER identity -> the group its hello declared, once the hello showed the token. A peer that reconnects
        # comes back with a new identity and a new hello: both identities are its; the start waits for every
        # other group's hello, not for so many identities.
        self._known: dict[bytes, int] = {}
        self._early: dict[tuple[int, int], PeerReport] = {}  # (seq, group) arrived before we asked for it
        self.rejected = 0
        try:
            self._connect(run_dir, startup_timeout_s)
        except BaseException:
            self.close()
            raise

    def _connect(self, run_dir: Path, startup_timeout_s: float) -> None:
        """Connect to every other worker and say hello; wait (at most the startup timeout) until every other
        worker's hello has come in."""
        deadline = time.monotonic() + startup_timeout_s
        hello = msgpack.packb({"k": "hello", "token": self._token, "group": self.group})
        found: dict[int, tuple[str, bytes | None]] = {}
        for g in range(self.groups):
            if g == self.group:
                continue
            path = endpoint_file(run_dir, peer_name(g))
            while not path.exists():
                if time.monotonic() > deadline:
                    raise BridgeError(f"partition worker {g} did not start within {startup_timeout_s:.0f} s",
                                      code=E_TIMEOUT)  # fmt: skip
                time.sleep(0.01)
            key = read_server_key(run_dir, peer_name(g))  # written before the endpoint
            if self._keys is not None and key is None:
                raise BridgeError(f"partition worker {g} published no CurveZMQ key (this worker runs CurveZMQ)")
            found[g] = (path.read_text().strip(), key)
        if self._allow is not None:
            self._allow.set(frozenset(key for _, key in found.values() if key is not None))
        for g, (endpoint, key) in found.items():
            client = ClientCurve(self._keys, key) if self._keys is not None and key is not None else None
            sock = connect_dealer(self._ctx, endpoint, MAX_BATCH_BYTES, client)
            sock.send(hello)
            self._peers[g] = sock
        while missing := sorted(set(self._peers) - set(self._known.values())):
            self._receive(deadline, f"hello (partition worker(s) {missing})")

    def _receive(self, deadline: float, waiting: str) -> None:
        """Take one message off the ROUTER (or raise on the deadline): a hello lets a peer in, a window report
        is kept for its barrier."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BridgeError(f"partition worker {self.group}: no word from {waiting}", code=E_TIMEOUT)
            if self._router.poll(int(min(left, HEARTBEAT_S) * 1000) + 1, zmq.POLLIN):
                break
        frames = self._router.recv_multipart()
        ident, raw = frames[0], frames[-1]
        try:
            msg: Any = msgpack.unpackb(raw, raw=False)
            kind = msg["k"]
        except Exception:  # noqa: BLE001 - anything malformed is dropped and counted
            self.rejected += 1
            return
        if kind == "hello":
            g = msg.get("group")
            ok = isinstance(g, int) and 0 <= g < self.groups and g != self.group
            if ok and token_ok(str(msg.get("token", "")), self._token):
                self._known[ident] = g
            else:
                self.rejected += 1
            return
        g = self._known.get(ident)
        if g is None or kind != "win":
            self.rejected += 1
            return
        try:
            rel = msg.get("rel", (NEVER, NEVER))
            key = tuple(int(x) for x in msg.get("key", ()))
            samp = msg.get("samp", (NEVER, NEVER))
            react = msg.get("react", (NEVER, NEVER))
            fin = msg.get("fin", (0, -1))
            rep = PeerReport(g, int(msg["next"]), int(msg["arr"]), bytes(msg["batch"]), int(rel[0]), int(rel[1]), key,
                             int(samp[0]), int(samp[1]), int(react[0]), int(react[1]),
                             int(msg.get("out", 0)), int(fin[0]), int(fin[1]))  # fmt: skip
            self._early[(int(msg["seq"]), g)] = rep
        except (KeyError, TypeError, ValueError):  # a malformed report, even from a known peer, is dropped and counted
            self.rejected += 1

    def exchange(
        self,
        seq: int,
        next_ns: int,
        min_arrival: int,
        batches: Mapping[int, bytes],
        releases: tuple[int, int] = (NEVER, NEVER),
        key: tuple[int, ...] = (),
        sampling: tuple[int, int] = (NEVER, NEVER),
        react: tuple[int, int] = (NEVER, NEVER),
        output: int = 0,
        finish: tuple[int, int] = (0, -1),
    ) -> list[PeerReport]:
        """`phantora.netsim.cut_windows.Peers.exchange` over the sockets."""
        for g, sock in self._peers.items():
            sock.send(msgpack.packb({"k": "win", "seq": seq, "next": next_ns, "arr": min_arrival,
                                     "batch": batches.get(g, b""), "rel": list(releases), "key": list(key),
                                     "samp": [sampling[0], sampling[1]], "react": list(react),
                                     "out": output, "fin": list(finish)}))  # fmt: skip
        out: list[PeerReport] = []
        waiting = [g for g in self._peers]
        limit = self._first_timeout_s if seq == 0 else self.timeout_s
        deadline = time.monotonic() + limit
        while waiting:
            g = waiting[0]
            rep = self._early.pop((seq, g), None)
            if rep is not None:
                out.append(rep)
                waiting.pop(0)
                deadline = time.monotonic() + limit
                continue
            self._receive(deadline, f"partition worker(s) {waiting} at barrier {seq} (dead or stuck)")
        return out

    def close(self) -> None:
        if self._allow is not None and not self._allow.known():
            self._allow.set(frozenset())  # a handshake waiting for the keys is refused now, not at its timeout
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self._ctx.destroy(linger=0)
