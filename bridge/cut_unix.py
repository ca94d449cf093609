"""Partition workers' barrier exchange over plain Unix stream sockets (issue 38): `cut_windows.Peers` on one machine.

ZeroMQ (`bridge.cut_peers`) hands every message to its I/O thread and back: about 20-50 us of CPU a barrier
between two workers on this machine, where a window of the 1 us lookahead runs a few us of ns-3. On one machine
(the ``ipc`` transport without CurveZMQ) the workers use this instead: one stream socket per pair of workers in the
run's private directory (0700: only its owner reaches it), each report one `bridge.cut_frame` frame (a length,
then one msgpack array carrying the raw batch as a bin), sent with one ``send`` and read with ``recv_into``.

Worker G binds ``cutG.sock`` and publishes it (``cutG.endpoint``, as `ZmqPeers`); it connects to every lower group
and accepts every higher one. Each side sends a hello first (a length-prefixed msgpack map: its group, the run's
token) and checks the other's: a connection with a wrong token, a group out of range or already connected is closed
and counted in ``rejected``. A barrier sends every peer its frame without blocking and reads theirs until each
peer's frame of this sequence number is in (frames of the next barrier may already follow it: a peer moves on once
it has everyone's); at most `timeout_s` of silence (the first barrier: the start-up timeout), then it raises naming
the workers it waits for. A peer that closes its end is named as dead.

The window loop itself runs in C++ over these sockets (`run_native`, `phantora.netsim.cut_native`: the same rules
and the same frames) unless ``PHANTORA_CUT_LOOP=python`` asks for `cut_windows.run_windows`' Python loop. Once the
sockets are handed to C++ their Python `exchange` refuses (each side buffers what it has read).
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack

from bridge.cut_frame import LENGTH, MAX_FRAME, FrameError, decode, encode
from bridge.cut_peers import PEER_TIMEOUT_S, peer_name
from bridge.errors import BridgeError
from bridge.protocol import E_TIMEOUT
from bridge.transport import endpoint_file, token_ok, write_endpoint_file
from phantora.errors import PhantoraError
from phantora.netsim.cut_windows import NEVER, PeerReport

LOOP_ENV = "PHANTORA_CUT_LOOP"  # "python": the Python window loop (cut_windows); else the C++ loop
HELLO = "phantora-cut-hello"  # a hello's kind: {"k": HELLO, "group": G, "token": the run's}
MAX_HELLO = 1024
READ_CHUNK = 1 << 20


class UnixPeers:
    """One worker's stream sockets to the other workers of its partition, on one machine."""

    curve = False

    def __init__(
        self,
        run_dir: Path,
        group: int,
        groups: int,
        token: str,
        *,
        startup_timeout_s: float = 180.0,
        timeout_s: float = PEER_TIMEOUT_S,
    ) -> None:
        self.group, self.groups, self.timeout_s = group, groups, timeout_s
        self._first_timeout_s = max(timeout_s, startup_timeout_s)
        self._token = token.encode()
        self.rejected = 0
        self._socks: dict[int, socket.socket] = {}
        self._bufs: dict[int, bytearray] = {}
        self._poll = select.poll()
        self._by_fd: dict[int, int] = {}
        self._chunk = bytearray(READ_CHUNK)
        self._view = memoryview(self._chunk)
        self.native = os.environ.get(LOOP_ENV, "") != "python"  # the C++ window loop runs over these sockets
        self._native: Any = None  # its handle (`phantora.netsim.cut_native.native_peers`), once handed over
        path = run_dir / f"{peer_name(group)}.sock"
        self._listen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listen.bind(str(path))
            self._listen.listen(max(groups, 1))
            write_endpoint_file(run_dir, peer_name(group), f"unix://{path}")
            self._connect(run_dir, time.monotonic() + startup_timeout_s, startup_timeout_s)
        except BaseException:
            self.close()
            raise

    # ----- start-up -----------------------------------------------------------------------------
    def _hello(self) -> bytes:
        body = msgpack.packb({"k": HELLO, "group": self.group, "token": self._token.decode()})
        return LENGTH.pack(len(body)) + body

    def _read_hello(self, sock: socket.socket, deadline: float) -> int | None:
        """The group a peer's hello declares, or None (a wrong hello: counted)."""
        head = self._read_exact(sock, LENGTH.size, deadline)
        (n,) = LENGTH.unpack(head) if head is not None else (0,)
        raw = self._read_exact(sock, n, deadline) if head is not None and n <= MAX_HELLO else None
        try:
            msg: Any = msgpack.unpackb(raw, raw=False) if raw is not None else None
        except (ValueError, msgpack.UnpackException):
            msg = None
        ok = isinstance(msg, dict) and msg.get("k") == HELLO and isinstance(msg.get("token"), str)
        if not ok or not token_ok(msg["token"], self._token.decode()):
            self.rejected += 1
            return None
        g = msg.get("group")
        if type(g) is not int or not (0 <= g < self.groups) or g == self.group or g in self._socks:
            self.rejected += 1
            return None
        return int(g)

    @staticmethod
    def _read_exact(sock: socket.socket, n: int, deadline: float) -> bytes | None:
        out = b""
        while len(out) < n:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = sock.recv(n - len(out))
            except (TimeoutError, OSError):
                return None
            if not chunk:
                return None
            out += chunk
        return out

    def _connect(self, run_dir: Path, deadline: float, startup_timeout_s: float) -> None:
        """Connect to every lower group, accept every higher one, hellos both ways (at most the start-up
        timeout)."""
        for g in range(self.group):
            ep = endpoint_file(run_dir, peer_name(g))
            while not ep.exists():
                if time.monotonic() > deadline:
                    raise BridgeError(f"partition worker {g} did not start within {startup_timeout_s:.0f} s",
                                      code=E_TIMEOUT)  # fmt: skip
                time.sleep(0.01)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(ep.read_text().strip().removeprefix("unix://"))
                sock.sendall(self._hello())
            except OSError as e:  # its socket is there but nobody listens (it died after publishing it)
                sock.close()
                raise BridgeError(f"partition worker {self.group}: partition worker {g} does not answer on its "
                                  f"socket (dead: {e})") from None  # fmt: skip
            if self._read_hello(sock, deadline) != g:
                sock.close()
                raise BridgeError(f"partition worker {self.group}: worker {g}'s socket did not answer as worker {g}")
            self._add(g, sock)
        while missing := [g for g in range(self.group + 1, self.groups) if g not in self._socks]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BridgeError(f"partition worker {self.group}: no word from partition worker(s) {missing}",
                                  code=E_TIMEOUT)  # fmt: skip
            self._listen.settimeout(left)
            try:
                sock, _ = self._listen.accept()
            except TimeoutError:
                continue
            peer = self._read_hello(sock, deadline)
            if peer is None or peer < self.group:
                sock.close()
                continue
            sock.sendall(self._hello())
            self._add(peer, sock)

    def _add(self, g: int, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._socks[g] = sock
        self._bufs[g] = bytearray()
        self._by_fd[sock.fileno()] = g
        self._poll.register(sock.fileno(), select.POLLIN)

    # ----- the C++ window loop ---------------------------------------------------------------------
    def run_native(self, net: Any, **kw: Any) -> int | None:
        """`cut_windows.run_windows` in C++ over these sockets (`phantora.netsim.cut_native.run_native`'s
        keywords); a failure (a silent, dead or garbled peer) as the Python exchange raises it."""
        from phantora.netsim import cut_native

        try:
            return cut_native.run_native(net, self._handle(), group=self.group, **kw)
        except PhantoraError as e:
            if "no word from" in str(e):
                raise BridgeError(str(e), code=E_TIMEOUT) from None
            raise BridgeError(str(e)) from None

    def beat_to(self, fd: int, every_s: float) -> bool:
        """Where the C++ loop runs (`native`): a progress beat to `fd` after a window once `every_s` CPU seconds
        passed since the last (``PhantoraCutPeers::SetBeat``); False where the Python loop runs (no beat)."""
        if not self.native:
            return False
        self._handle().SetBeat(fd, max(1, int(every_s * 1e9)))
        return True

    def warm_up_native(self, net: Any) -> None:
        """Where the C++ loop runs (`native`), hand the sockets over now and call it once doing nothing
        (`cut_native.warm_up`): cppyy's first calls (about 0.2 CPU s), kept out of the first round's figures as the
        engine's own warm-up is."""
        from phantora.netsim import cut_native

        if self.native:
            cut_native.warm_up(net, self._handle())

    def exchange_rounds(self, first_seq: int, rounds: int, batch_bytes: int) -> tuple[float, float]:
        """(CPU s, wall s) of `rounds` barriers the C++ loop makes over these sockets with no window between
        (`cut_native.exchange_rounds`: a barrier's own cost, for the benches); every worker must call it alike."""
        from phantora.netsim import cut_native

        try:
            return cut_native.exchange_rounds(self._handle(), first_seq, rounds, batch_bytes)
        except PhantoraError as e:
            raise BridgeError(str(e), code=E_TIMEOUT if "no word from" in str(e) else "bridge") from None

    def _handle(self) -> Any:
        """The C++ side of these sockets (`cut_native.native_peers`), made once."""
        from phantora.netsim import cut_native

        if self._native is None:
            if any(len(b) for b in self._bufs.values()):
                raise BridgeError(f"partition worker {self.group}: frames already read by Python; the C++ window "
                                  "loop cannot take the sockets over")  # fmt: skip
            fds = [self._socks[g].fileno() if g in self._socks else -1 for g in range(self.groups)]
            self._native = cut_native.native_peers(self.group, fds, self.timeout_s, self._first_timeout_s)
        return self._native

    # ----- barriers -----------------------------------------------------------------------------
    def _frame(self, g: int) -> tuple[int, PeerReport] | None:
        """The first whole frame buffered from worker `g`, taken off its buffer; None if not whole yet."""
        buf = self._bufs[g]
        if len(buf) < LENGTH.size:
            return None
        (n,) = LENGTH.unpack_from(buf)
        if n > MAX_FRAME:
            raise BridgeError(f"partition worker {self.group}: worker {g} announced a window report of {n:,} bytes "
                              f"(at most {MAX_FRAME:,})")  # fmt: skip
        if len(buf) < LENGTH.size + n:
            return None
        try:
            got = decode(g, memoryview(buf)[LENGTH.size : LENGTH.size + n])
        except FrameError as e:
            raise BridgeError(f"partition worker {self.group}: {e}") from None
        del buf[: LENGTH.size + n]
        return got

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
        """`phantora.netsim.cut_windows.Peers.exchange` over the stream sockets."""
        if self._native is not None:
            raise BridgeError(f"partition worker {self.group}: its sockets run the C++ window loop, not this exchange")
        out: dict[int, PeerReport] = {}
        unsent: dict[int, memoryview] = {}
        for g, sock in self._socks.items():
            data = encode(
                seq, next_ns, min_arrival, batches.get(g, b""), releases, key, sampling, react, output, finish
            )
            n = self._send(g, sock, data)
            if n < len(data):
                unsent[g] = memoryview(data)[n:]
                self._poll.modify(sock, select.POLLIN | select.POLLOUT)
        for g in self._socks:
            self._take(g, seq, out)
        limit = self._first_timeout_s if seq == 0 else self.timeout_s
        deadline = time.monotonic() + limit
        while unsent or len(out) < len(self._socks):
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = sorted(set(self._socks) - set(out))
                raise BridgeError(f"partition worker {self.group}: no word from partition worker(s) {waiting} at "
                                  f"barrier {seq} (dead or stuck)", code=E_TIMEOUT)  # fmt: skip
            for fd, ev in self._poll.poll(int(left * 1000) + 1):
                g = self._by_fd[fd]
                sock = self._socks[g]
                if ev & select.POLLOUT and g in unsent:
                    unsent[g] = unsent[g][self._send(g, sock, unsent[g]) :]
                    if not len(unsent[g]):
                        del unsent[g]
                        self._poll.modify(sock, select.POLLIN)
                if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    if not self._read(g, sock):  # it closed its end: dead, unless it said all it had to
                        self._poll.unregister(fd)
                        self._take(g, seq, out)
                        if g not in out:
                            raise self._closed(g)
                    self._take(g, seq, out)
                deadline = time.monotonic() + limit  # progress
        return [out[g] for g in sorted(out)]

    def _send(self, g: int, sock: socket.socket, data: bytes | memoryview) -> int:
        """Bytes of `data` the socket took now (0 when full)."""
        try:
            return sock.send(data)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, ConnectionResetError):  # it closed its end before this send: dead, as on a read
            raise self._closed(g) from None
        except OSError as e:
            raise BridgeError(f"partition worker {self.group}: partition worker {g} is gone ({e})") from None

    def _read(self, g: int, sock: socket.socket) -> bool:
        """Read what worker `g` sent into its buffer; False once it closed its end."""
        try:
            n = sock.recv_into(self._chunk)  # into one buffer kept for it: a fresh 1 MiB each time costs 30 us
        except BlockingIOError:
            return True
        except ConnectionResetError:  # it closed its end with our bytes unread: as a plain close
            return False
        except OSError as e:
            raise BridgeError(f"partition worker {self.group}: partition worker {g} is gone ({e})") from None
        self._bufs[g] += self._view[:n]
        return n > 0

    def _closed(self, g: int) -> BridgeError:
        """Worker `g` closed its connection: one message whether a send or a read finds it out first."""
        return BridgeError(f"partition worker {self.group}: partition worker {g} closed its connection (dead)")

    def _take(self, g: int, seq: int, out: dict[int, PeerReport]) -> None:
        if g in out:
            return
        got = self._frame(g)
        if got is None:
            return
        if got[0] != seq:
            raise BridgeError(f"partition worker {self.group}: worker {g} sent barrier {got[0]} at barrier {seq}")
        out[g] = got[1]

    def close(self) -> None:
        for sock in [*self._socks.values(), self._listen]:
            try:
                sock.close()
            except OSError:
                pass
        self._socks.clear()


def is_local(setup: Mapping[str, object]) -> bool:
    """The setup's workers run on one machine without CurveZMQ (ipc): they use `UnixPeers`."""
    return setup.get("transport", "ipc") == "ipc" and not setup.get("curve") and os.name == "posix"
