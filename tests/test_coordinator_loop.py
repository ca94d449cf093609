"""The coordinator's socket loop answers every request it has read before it sleeps again.

A rank's request can arrive while the coordinator finishes a round (sending results, heartbeats). The
loop reads it then, so the next round must run at once: the socket is empty, and a poll would sleep
for a whole heartbeat interval (1 s) before the rank hears back. Real sockets; the core behind the
loop is a stand-in that records when each round runs.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import zmq

from bridge.coordinator import Coordinator
from bridge.protocol import encode
from bridge.transport import HEARTBEAT_S


class RoundRecorder:
    """A coordinator core that, during its first round, has a rank send one request; it finishes once a
    later round has seen that request."""

    def __init__(self, rank: zmq.Socket) -> None:
        self.rank = rank
        self.rounds: list[float] = []
        self.arrived: float | None = None
        self.seen_in_round: float | None = None
        self.ranks: list[Any] = []
        self.engine = SimpleNamespace(now=lambda: 0, keepalive=lambda: None)

    def on_message(self, rank: int, msg: Any) -> None:
        self.arrived = time.monotonic()

    def progress(self) -> list[tuple[int, int]]:
        self.rounds.append(time.monotonic())
        if len(self.rounds) == 1:
            self.rank.send(encode("clock", 5, block=False))  # arrives while this round is still running
            time.sleep(0.05)
        elif self.arrived is not None and self.seen_in_round is None:
            self.seen_in_round = time.monotonic()
        return []

    def all_finished(self) -> bool:
        return self.seen_in_round is not None

    def finalize(self) -> dict[str, Any]:
        return {}


def test_a_request_read_after_a_round_is_answered_without_a_poll(zmq_pair: Any) -> None:
    router, dealer = zmq_pair("coord", b"rank0")
    spec = SimpleNamespace(peer_timeout_s=30.0, max_message_bytes=1 << 20)
    coord = Coordinator(spec, router, token="t")  # type: ignore[arg-type]
    coord.rank_of[b"rank0"] = 0
    coord.ident_of[0] = b"rank0"
    coord.supervisor = b"launcher"  # a launcher that has said hello: the run's outcome goes to it
    core = RoundRecorder(dealer)
    coord.core = core  # type: ignore[assignment]
    coord.last_beat = 0.0  # the first round's heartbeat is due: the loop reads the socket right after it
    done: list[int] = []
    loop = threading.Thread(target=lambda: done.append(coord.serve()), daemon=True)
    loop.start()
    loop.join(timeout=10 * HEARTBEAT_S)
    assert done == [0] and core.arrived is not None and core.seen_in_round is not None
    # the round after the request ran at once, not after a heartbeat-long poll
    assert core.seen_in_round - core.arrived < HEARTBEAT_S / 4
