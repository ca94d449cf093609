"""The wire between the driver's `ProcShardedFluid` (fluid_procs.py) and a fluid shard's process
(fluid_proc_server.py): the ops, and frames of a 4-byte little-endian length and a msgpack body (an answer's header
also carries the CPU seconds its request took). msgpack only, never pickle: the topology goes as
`phantora.topology.wire.topology_to_dict`.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

INIT, SET, SUBMIT, ARRIVE, ADVANCE, REPORT, CLOSE = range(7)
SETTABLE = ("prechecked", "carries", "cap_slack")  # the hybrid's settings on its fluid engine a shard takes
LEN = struct.Struct("<I")  # a request's header: its length
REPLY = struct.Struct("<Id")  # an answer's header: its length and the CPU s its request took (its encoding too)
IDLE_CHECK_S = 5.0  # between requests: how often the server checks that its driver is still alive
WORKER_SOCKET = "fluid.sock"  # a local decomposition worker's shard socket, in its run directory (`serve_in_thread`)


def frame(obj: Any) -> bytes:
    """`obj` as one frame's bytes."""
    data = msgpack.packb(obj)
    return LEN.pack(len(data)) + data


def send_frame(sock: socket.socket, obj: Any) -> int:
    """`obj` as one frame; its bytes."""
    data = frame(obj)
    sock.sendall(data)
    return len(data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from `sock` (its timeout applies to each read); EOFError if the peer closed."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the peer closed the socket")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> Any:
    """A request."""
    (n,) = LEN.unpack(recv_exact(sock, LEN.size))
    return msgpack.unpackb(recv_exact(sock, n), strict_map_key=False)


def recv_reply(sock: socket.socket) -> tuple[float, Any, int]:
    """An answer: the CPU s its request took in the shard, its body and its bytes."""
    n, cpu = REPLY.unpack(recv_exact(sock, REPLY.size))
    return cpu, msgpack.unpackb(recv_exact(sock, n), strict_map_key=False), n + REPLY.size
