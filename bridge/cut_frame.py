"""The per-window report between partition workers as a fixed binary frame (issue 38), not msgpack.

A frame is a little-endian header of fixed size, the report's key (a lockstep round's next event, 0-4 ints) and
its batch of cut-cable messages as raw bytes (`PhantoraNetwork::CutDeliver`'s)::

    u64 length of the rest | i64 seq, next, arr, release later, release same, sample from, react bound, react stop |
    u8 busy | u8 ints in the key | i64 key[...] | batch bytes

Every time is an ns, NEVER (`phantora.netsim.cut_windows.NEVER`) for none. `decode` checks the sizes and names the
peer on a malformed frame.
"""

from __future__ import annotations

import struct

from phantora.netsim.cut_windows import NEVER, PeerReport

LENGTH = struct.Struct("<Q")
HEAD = struct.Struct("<8qBB")
MAX_KEY = 8


class FrameError(ValueError):
    """A frame that does not parse."""


def encode(
    seq: int,
    next_ns: int,
    min_arrival: int,
    batch: bytes,
    releases: tuple[int, int] = (NEVER, NEVER),
    key: tuple[int, ...] = (),
    sampling: tuple[int, bool] = (NEVER, True),
    react: tuple[int, int] = (NEVER, NEVER),
) -> bytes:
    """One report as a frame, its length first."""
    if len(key) > MAX_KEY:
        raise FrameError(f"a window report's key has {len(key)} ints (at most {MAX_KEY})")
    head = HEAD.pack(seq, next_ns, min_arrival, releases[0], releases[1], sampling[0], react[0], react[1],
                     1 if sampling[1] else 0, len(key))  # fmt: skip
    body = head + struct.pack(f"<{len(key)}q", *key)
    return LENGTH.pack(len(body) + len(batch)) + body + batch


def decode(group: int, body: bytes | bytearray | memoryview) -> tuple[int, PeerReport]:
    """(seq, report) of one frame's body (what follows its length) from worker `group`."""
    if len(body) < HEAD.size:
        raise FrameError(f"partition worker {group}: a window report of {len(body)} bytes (header {HEAD.size})")
    seq, nxt, arr, later, same, samp, bound, stop, busy, nkey = HEAD.unpack_from(body)
    end = HEAD.size + 8 * nkey
    if nkey > MAX_KEY or len(body) < end:
        raise FrameError(f"partition worker {group}: a window report with a key of {nkey} ints in {len(body)} bytes")
    key = struct.unpack_from(f"<{nkey}q", body, HEAD.size)
    rep = PeerReport(group, nxt, arr, bytes(body[end:]), later, same, key, samp, bool(busy), bound, stop)
    return seq, rep
