"""A fluid shard's process (`fluid_procs=on`, issue 38, item 3): one flow engine for a run of hosts, driven over a
Unix socket by `phantora.netsim.fluid_procs.ProcShardedFluid` in the driver.

Frames are a 4-byte little-endian length and a msgpack array `[op, ...]` (fluid_proc_wire.py); the first is
`[INIT, topology (`topology_to_dict`), engine settings]`. Every request but SET and CLOSE is answered in order with
`[next event ns or None, ...]` behind a header of its length and the CPU this process spent on the request
(decoding, the engine, encoding the answer). Flows come as `ShardedFluid._rows` rows (deps already filtered to what
this shard must wait on); completions go back as `(id, start, end)`.
Run as `python -m phantora.netsim.fluid_proc_server FD PARENT_PID`, or inside a decomposition worker's process as
a thread (`serve_in_thread`: the worker's own cores, no process or imports of its own; its CPU by the thread's clock).
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from phantora.errors import PhantoraError
from phantora.netsim.fluid_proc_wire import (
    ADVANCE,
    ARRIVE,
    CLOSE,
    IDLE_CHECK_S,
    INIT,
    REPLY,
    REPORT,
    SET,
    SUBMIT,
    recv_frame,
)
from phantora.topology.wire import topology_from_dict


def _flows(rows: list[list[Any]]) -> list[Any]:
    from phantora.netsim.base import Flow

    return [
        Flow(i, a, b, n, tuple(deps), delay, tag, prio, key, loss, rate, conn, queue, nic)
        for i, a, b, n, deps, delay, tag, prio, key, loss, rate, conn, queue, nic in rows
    ]


def _report(engine: Any, what: str, arg: Any) -> Any:
    """A report the driver merges over the shards (`ShardedFluid`'s reporting methods)."""
    if what == "sync":  # (every event at or before `arg` has run: its clock only)
        if engine.now() < arg:
            left = engine.advance(arg)
            if left:
                raise RuntimeError(f"a shard had {len(left)} completions at or before {arg} ns left at a sync")
        return None
    if what == "channel_usage":
        return [[getattr(u, n) for n in u.__slots__] for u in engine.channel_usage(arg)]
    return getattr(engine, what)()


def serve(
    sock: socket.socket, parent: int, clock: Callable[[], float] = time.process_time, policy: bool = True
) -> None:
    """Answer the driver's requests until CLOSE or its end (EOF, or the driver gone). `clock`: the CPU each answer
    reports (a thread's own in a worker's process); `policy`: set the run's GC policy (a process of its own)."""
    from phantora.netsim.factory import fluid_shard_engine
    from phantora.netsim.gc_pause import use_run_policy

    op, blob, settings = recv_frame(sock)
    if op != INIT:
        raise RuntimeError(f"a fluid shard's first frame must be INIT, got op {op}")
    engine = fluid_shard_engine(topology_from_dict(blob), settings)
    if policy:
        use_run_policy()  # (as the driver runs: the engine and topology out of the collector's passes)
    while True:
        while not select.select([sock], [], [], IDLE_CHECK_S)[0]:
            if os.getppid() != parent:
                return
        try:
            msg = recv_frame(sock)
        except EOFError:
            return
        t0 = clock()
        op = msg[0]
        if op == SET:
            setattr(engine, msg[1], msg[2])
            continue
        if op == CLOSE:
            return
        if op == SUBMIT:
            engine.submit(_flows(msg[2]), msg[1])
            extra: list[Any] = []
        elif op == ARRIVE:
            engine.arrive(msg[2], msg[1])
            extra = []
        elif op == ADVANCE:
            extra = [[(c.flow_id, c.start_ns, c.end_ns) for c in engine.advance(msg[1])]]
        elif op == REPORT:
            extra = [_report(engine, msg[1], msg[2])]
        else:
            raise RuntimeError(f"a fluid shard got an unknown op {op}")
        body = msgpack.packb([engine.next_event_time(), *extra])
        sock.sendall(REPLY.pack(len(body), clock() - t0) + body)


def serve_in_thread(path: Path) -> threading.Thread:
    """A fluid shard served by a daemon thread of this process (a decomposition worker's) to the one driver that
    connects to the Unix socket at `path` (in the worker's private run directory, made 0600 here): its answers carry
    the thread's CPU, and it ends at CLOSE, at the driver's end, or with the process. PhantoraError naming `path` if
    the socket cannot be opened (bound, made private, listened on)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(1)
    except OSError as exc:
        listener.close()
        raise PhantoraError(f"cannot open the fluid shard socket {path}: {exc}") from None
    parent = os.getppid()

    def run() -> None:
        with listener:
            conn, _ = listener.accept()
        with conn:
            conn.setblocking(True)
            serve(conn, parent, time.thread_time, policy=False)

    thread = threading.Thread(target=run, name="phantora-fluid-shard", daemon=True)
    thread.start()
    return thread


def main() -> None:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    try:
        serve(sock, parent)
    finally:
        sock.close()


if __name__ == "__main__":
    main()
