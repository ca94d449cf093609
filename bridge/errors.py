"""Errors of the co-simulation bridge."""

from __future__ import annotations

from phantora.errors import PhantoraError

# Exit code of a rank that failed only because a peer's connection dropped (gloo: "Connection reset
# by peer"): the peer died first. The launcher then waits a moment for that peer's own death, so the
# run names the culprit instead of its victim.
PEER_LOST_EXIT = 3


class BridgeError(PhantoraError):
    """A co-simulation run failed: a peer died, a collective mismatched, a deadlock, a bad message.

    `code` is the protocol error code when the error came over the wire (see `bridge.protocol`).
    """

    def __init__(self, message: str, *, code: str = "bridge") -> None:
        self.code = code
        super().__init__(message)


class ProtocolError(BridgeError):
    """A message that cannot be accepted: malformed, oversized, wrong version, wrong token, unknown type."""
