"""Errors of the co-simulation bridge."""

from __future__ import annotations

from phantora.errors import PhantoraError


class BridgeError(PhantoraError):
    """A co-simulation run failed: a peer died, a collective mismatched, a deadlock, a bad message.

    `code` is the protocol error code when the error came over the wire (see `bridge.protocol`);
    `rank` the rank whose process died, when a rank's did.
    """

    def __init__(self, message: str, *, code: str = "bridge", rank: int | None = None) -> None:
        self.code = code
        self.rank = rank  # the rank that failed, when one did
        super().__init__(message)


class ProtocolError(BridgeError):
    """A message that cannot be accepted: malformed, oversized, wrong version, wrong token, unknown type."""


class WaitTimedOut(Exception):  # noqa: N818 - a wait the program bounded, not a failed run
    """A rank's wait with a wall-clock deadline (torch's `Work.wait(timeout)`) passed it before the coordinator
    answered; the answer is still owed (`RankClient` takes it before its next request)."""


class RunFailed(Exception):  # noqa: N818 - the coordinator's verdict on a run, not a programming error
    """The run cannot continue; `text` is the diagnostic every peer gets."""

    def __init__(self, code: str, text: str) -> None:
        self.code = code
        self.text = text
        super().__init__(text)
