"""The per-window report between partition workers as one length-prefixed msgpack array (issue 38).

A frame is its body's length (little-endian u64), then the body: a msgpack array of the report's fields, every
time an ns (NEVER, `phantora.netsim.cut_windows.NEVER`, for none), the key a list of 0-8 ints (a lockstep round's
next event) and the batch of cut-cable messages a bin (`PhantoraNetwork::CutDeliver`'s raw bytes)::

    [seq, next, arr, release later, release same, sample from, react bound, react stop, output, idle, left, finish,
     key, batch]

A positional array, not a map: the fields are fixed and a barrier's cost is counted in microseconds. `decode`
checks the shape and types and names the peer on a malformed frame; `MAX_FRAME` bounds what a reader buffers.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from phantora.netsim.cut_windows import NEVER, PeerReport

LENGTH = struct.Struct("<Q")
MAX_KEY = 8
MAX_FRAME = (1 << 30) + 4096  # a batch of cut-cable messages (the ZeroMQ path's MAX_BATCH_BYTES) and its fields
FIELDS = 14


class FrameError(ValueError):
    """A frame that does not parse."""


def encode(
    seq: int,
    next_ns: int,
    min_arrival: int,
    batch: bytes,
    releases: tuple[int, int] = (NEVER, NEVER),
    key: tuple[int, ...] = (),
    sampling: tuple[int, int] = (NEVER, NEVER),
    react: tuple[int, int] = (NEVER, NEVER),
    output: int = 0,
    finish: tuple[int, int] = (0, -1),
) -> bytes:
    """One report as a frame, its length first."""
    if len(key) > MAX_KEY:
        raise FrameError(f"a window report's key has {len(key)} ints (at most {MAX_KEY})")
    body = msgpack.packb(
        [
            seq,
            next_ns,
            min_arrival,
            releases[0],
            releases[1],
            sampling[0],
            react[0],
            react[1],
            output,
            sampling[1],
            finish[0],
            finish[1],
            list(key),
            bytes(batch),
        ],  # fmt: skip
        use_bin_type=True,
    )
    return LENGTH.pack(len(body)) + body


def _ints(group: int, what: str, values: Any) -> None:
    if not all(type(v) is int for v in values):
        raise FrameError(f"partition worker {group}: a window report whose {what} is not all ints")


def decode(group: int, body: bytes | bytearray | memoryview) -> tuple[int, PeerReport]:
    """(seq, report) of one frame's body (what follows its length) from worker `group`."""
    try:
        f = msgpack.unpackb(body, raw=False, use_list=True)
    except (ValueError, msgpack.UnpackException) as e:
        msg = f"partition worker {group}: a window report of {len(body)} bytes does not parse ({e})"
        raise FrameError(msg) from None
    if not isinstance(f, list) or len(f) != FIELDS:
        raise FrameError(f"partition worker {group}: a window report that is not an array of {FIELDS} fields")
    seq, nxt, arr, later, same, samp, bound, stop, out, idle, left, fin, key, batch = f
    _ints(group, "times", (seq, nxt, arr, later, same, samp, bound, stop, out, idle, left, fin))
    if not isinstance(key, list) or len(key) > MAX_KEY:
        raise FrameError(f"partition worker {group}: a window report's key is not a list of at most {MAX_KEY} ints")
    _ints(group, "key", key)
    if not isinstance(batch, bytes):
        raise FrameError(f"partition worker {group}: a window report whose batch is not bytes")
    return seq, PeerReport(group, nxt, arr, batch, later, same, tuple(key), samp, idle, bound, stop, out, left, fin)
