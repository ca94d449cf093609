"""`RemoteSimulator`: the coordinator's view of an engine hosted by the network server.

It implements the `NetworkSimulator` protocol (plus ``advance_watching``, run on the server side)
over one DEALER socket, one request at a time. Each reply carries now / in_flight / next event,
so the cheap queries cost no round trip. While it waits, `on_wait` is called about once a second
(the coordinator uses it to keep its own peers' heartbeats going). Over tcp a failed handshake (a CurveZMQ key
that does not match, `bridge.curve`) ends the wait within a second, naming the endpoint and why. With `beat` S > 0,
its run calls ask the server for its progress from inside them, at most every S seconds (`progress` messages before
the reply, each handed to `on_beat`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import zmq

from bridge.curve import ClientCurve, HandshakeWatch
from bridge.errors import BridgeError, ProtocolError
from bridge.liveness import Silence
from bridge.protocol import E_AUTH, E_TIMEOUT, Message, completion_from_wire, decode, encode, flows_to_wire
from bridge.transport import HEARTBEAT_S, beyond_loopback, connect_dealer, send_heartbeat
from phantora.netsim.base import Completion, Flow
from phantora.progress import Beat


class RemoteSimulator:
    """A `NetworkSimulator` whose engine lives in the network server process."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        token: str,
        *,
        startup_timeout_s: float,
        call_timeout_s: float,
        on_wait: Callable[[], None] | None = None,
        curve: ClientCurve | None = None,
        silence_s: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.sock = connect_dealer(ctx, endpoint, curve=curve, connect=False)
        tcp = endpoint.startswith("tcp://")
        # the monitor goes on before connect, so the first handshake's outcome cannot slip past it
        self.watch = HandshakeWatch(self.sock, endpoint, curve is not None) if tcp else None
        self.sock.connect(endpoint)
        self.call_timeout_s = call_timeout_s
        self.silence_s: float | None = None  # (set from the welcome: the hello itself has the start-up timeout)
        self.server_pid: int | None = None
        self.on_wait = on_wait
        self._now = 0
        self._in_flight = 0
        self._next: int | None = None
        self._last_send = time.monotonic()
        self.calls = 0
        self.beat = 0.0  # > 0: ask for `progress` messages from inside run calls (advance, drain), this often (s)
        self.on_beat: Callable[[Beat], None] | None = None  # given each one
        self.last_beat: Beat | None = None
        try:
            welcome = self._call(
                encode("hello", 0, role="coordinator", token=token, rank=None, world=None, pid=os.getpid()),
                startup_timeout_s,
                "welcome",
            )
        except BaseException:
            if self.watch is not None:
                self.watch.close()
            self.sock.close(0)
            raise
        self.info: dict[str, Any] = dict(welcome["info"])
        # a server on this machine that stays silent this long while doing no work (stopped, blocked for good)
        # ends a call; one that works (a long ns-3 call gains CPU time) is waited for up to call_timeout_s
        pid = self.info.get("pid")
        local = isinstance(pid, int) and not beyond_loopback(endpoint)
        self.silence_s = silence_s if local else None
        self.server_pid = pid if local else None

    # ----- transport -------------------------------------------------------------------------
    def _call(self, raw: bytes, timeout_s: float, want: str) -> Message:
        self.send(raw)
        deadline = waited = time.monotonic()
        deadline += timeout_s
        silence = Silence(self.server_pid) if self.silence_s is not None else None
        while True:
            if self.sock.poll(int(HEARTBEAT_S * 1000)):
                if silence is not None:
                    silence.heard()
                if (msg := self.take(want)) is not None:
                    break
            if silence is not None and self.silence_s is not None and silence.silent_s() > self.silence_s:
                raise BridgeError(
                    f"the network server (pid {self.server_pid}) has been silent for {self.silence_s:.0f} s without "
                    "working (no message, no CPU time): stopped or blocked",
                    code=E_TIMEOUT,
                )
            if self.watch is not None and (why := self.watch.failure()) is not None:
                raise BridgeError(f"cannot talk to the network server: {why}", code=E_AUTH)
            now = time.monotonic()
            if self.on_wait is not None and now - waited >= HEARTBEAT_S:  # (`progress` messages wake the poll)
                waited = now
                self.on_wait()
            if now > deadline:
                raise BridgeError(
                    f"the network server at {self.endpoint} did not answer within {timeout_s:.0f} s", code=E_TIMEOUT
                )
        if self.watch is not None:
            self.watch.close()  # the handshake is done: nothing more to watch
        return msg

    def send(self, raw: bytes) -> None:
        """One request, its reply to be taken with `reply` (callers that drive several servers at once)."""
        self.sock.send(raw)
        self._last_send = time.monotonic()
        self.calls += 1

    def take(self, want: str) -> Message | None:
        """The waiting message: the reply to the last request (its now / in_flight / next kept), or None after a
        `progress` message (given to `on_beat`: the reply is still to come); BridgeError on an error or another
        message."""
        try:
            msg = decode(self.sock.recv())
        except ProtocolError as exc:
            raise BridgeError(f"bad reply from the network server: {exc}", code=exc.code) from None
        if msg.type == "progress":
            self.last_beat = Beat.from_fields(msg.fields)
            if self.on_beat is not None:
                self.on_beat(self.last_beat)
            return None
        if msg.type == "error":
            raise BridgeError(f"network server: {msg['text']}", code=msg["code"])
        if msg.type != want:
            raise BridgeError(f"the network server answered {msg.type!r} where {want!r} was expected")
        if "now" in msg.fields:
            self._now, self._in_flight, self._next = msg["now"], msg["in_flight"], msg["next"]
        return msg

    def _beat(self) -> dict[str, float]:
        """A run call's extra field: `beat` when progress is asked for (the server runs the call in chunks)."""
        return {"beat": self.beat} if self.beat > 0 else {}

    def keepalive(self) -> None:
        """A heartbeat if nothing was sent for a while, so the server knows we are alive."""
        if time.monotonic() - self._last_send >= HEARTBEAT_S:
            send_heartbeat(self.sock, encode("heartbeat", self._now))
            self._last_send = time.monotonic()

    def completions(self, msg: Message) -> list[Completion]:
        return [completion_from_wire(r) for r in msg["done"]]

    # ----- NetworkSimulator --------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        self._call(encode("submit", at, flows=flows_to_wire(flows), at=at), self.call_timeout_s, "state")

    def advance(self, until: int) -> list[Completion]:
        return self.advance_watching(until, ())

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        raw = encode("advance", self._now, until=until, watch=sorted(watch), earliest=earliest, **self._beat())
        msg = self._call(raw, self.call_timeout_s, "completions")
        return self.completions(msg)

    def next_event_time(self) -> int | None:
        return self._next

    def now(self) -> int:
        return self._now

    def in_flight(self) -> int:
        return self._in_flight

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        return self.completions(
            self._call(encode("drain", self._now, limit=limit_ns, **self._beat()), self.call_timeout_s, "completions")
        )

    def channels(self) -> None:
        """Observed on the server, which writes links.csv itself."""
        return None

    def fabric(self) -> None:
        """Observed on the server, which writes the packet traces itself."""
        return None

    def flow_transport_rows(self) -> list[list[int]]:
        """The server's per-flow transport counters (`bridge.wire.transport_row`), empty for an engine without."""
        return list(self._call(encode("get_transport", self._now), self.call_timeout_s, "transport")["rows"])

    def stats(self) -> dict[str, object]:
        return dict(self._call(encode("get_stats", self._now), self.call_timeout_s, "stats")["stats"])

    def scenario_outcome(self) -> dict[str, Any]:
        """What the server's scenario engine did (`phantora.results.scenario.engine_outcome`); {} without one."""
        return dict(self._call(encode("get_scenario", self._now), self.call_timeout_s, "scenario")["scenario"])

    def close(self) -> None:
        try:
            self.sock.send(encode("shutdown", self._now, reason="run over"), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        if self.watch is not None:
            self.watch.close()
        self.sock.close(linger=500)
