"""A coordinator that exits with code 0 has sent the run's outcome first; the launcher may see the process gone before
it reads that message (a starved process on a loaded machine), so it reads what is queued before it blames the
coordinator (bridge.run.CosimRun._last_words)."""

from __future__ import annotations

import pytest
import zmq

from bridge import run
from bridge.errors import BridgeError
from bridge.protocol import encode


@pytest.fixture
def pair():
    """The launcher's socket and the coordinator's end, on inproc."""
    ctx = zmq.Context()
    launcher, coordinator = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    launcher.bind("inproc://last-words")
    coordinator.connect("inproc://last-words")
    yield launcher, coordinator
    ctx.destroy(linger=0)


def last_words(sock: zmq.Socket):
    return run.CosimRun._last_words(run.CosimRun.__new__(run.CosimRun), sock)


def test_an_outcome_queued_behind_heartbeats_is_read(pair) -> None:
    launcher, coordinator = pair
    coordinator.send(encode("heartbeat", 0))
    coordinator.send(encode("outcome", 7, outcome={"steps": 3}))
    assert last_words(launcher) == {"steps": 3}


def test_a_coordinator_that_sent_no_outcome_is_answered_none_after_the_grace(pair, monkeypatch) -> None:
    monkeypatch.setattr(run, "LAST_WORDS_S", 0.2)
    launcher, coordinator = pair
    coordinator.send(encode("heartbeat", 0))
    assert last_words(launcher) is None


def test_an_error_among_the_last_words_is_raised(pair) -> None:
    launcher, coordinator = pair
    coordinator.send(encode("error", 0, code="engine", text="ns-3 failed"))
    with pytest.raises(BridgeError, match="ns-3 failed"):
        last_words(launcher)
