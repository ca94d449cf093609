"""Partition workers' barrier exchange over Unix stream sockets (bridge.cut_unix) and its frame (bridge.cut_frame).

No ns-3: workers are threads of this process, each with its own `UnixPeers` in one private run directory.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from bridge.cut_frame import LENGTH, FrameError, decode, encode
from bridge.cut_unix import HELLO, UnixPeers
from bridge.errors import BridgeError
from bridge.transport import endpoint_file, make_run_dir, new_token, remove_run_dir
from phantora.netsim.cut_windows import NEVER, PeerReport


@pytest.fixture
def run_dir() -> Any:
    root = make_run_dir()
    yield root
    remove_run_dir(root)


def test_frame_round_trip() -> None:
    raw = encode(
        7, 1_000, NEVER, b"\x01\x02batch", (5, NEVER), (3, 9, 4294967295, 12), (2_000, 7_000), (8, 9), 3_000, (3, 9_500)
    )
    (n,) = LENGTH.unpack_from(raw)
    assert n == len(raw) - LENGTH.size
    seq, rep = decode(3, raw[LENGTH.size :])
    assert seq == 7
    assert rep == PeerReport(3, 1_000, NEVER, b"\x01\x02batch", 5, NEVER, (3, 9, 4294967295, 12), 2_000, 7_000, 8, 9,
                             3_000, 3, 9_500)  # fmt: skip


def test_frame_defaults_are_the_peer_report_defaults() -> None:
    _, rep = decode(1, encode(0, 10, 20, b"")[LENGTH.size :])
    assert rep == PeerReport(1, 10, 20, b"")


def test_frame_malformed_names_the_worker() -> None:
    body = encode(0, 10, 20, b"", key=(1, 2, 3))[LENGTH.size :]
    with pytest.raises(FrameError, match="partition worker 4"):
        decode(4, body[:10])  # shorter than the header
    with pytest.raises(FrameError, match="partition worker 4: .* does not parse"):
        decode(4, body[: len(body) - 3])  # cut short inside the array
    with pytest.raises(FrameError, match="key is not a list of at most 8 ints"):
        decode(4, msgpack.packb([0, 10, 20, NEVER, NEVER, NEVER, NEVER, NEVER, 0, NEVER, 0, -1, list(range(9)), b""]))
    with pytest.raises(FrameError, match="not an array of 14 fields"):
        decode(4, msgpack.packb({"seq": 0}))
    with pytest.raises(FrameError, match="times is not all ints"):
        decode(4, msgpack.packb([0, "10", 20, NEVER, NEVER, NEVER, NEVER, NEVER, 0, NEVER, 0, -1, [], b""]))


def _workers(run_dir: Path, n: int, body: Any, **kw: Any) -> list[Any]:
    """Run `body(peers, group)` in `n` threads, each with its own UnixPeers; their results (or exceptions)."""
    token = new_token()
    out: list[Any] = [None] * n

    def run(g: int) -> None:
        peers = None
        try:
            peers = UnixPeers(run_dir, g, n, token, startup_timeout_s=20, **kw)
            out[g] = body(peers, g)
        except Exception as e:  # noqa: BLE001 - handed to the test
            out[g] = e
        finally:
            if peers is not None:
                peers.close()

    threads = [threading.Thread(target=run, args=(g,)) for g in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_three_workers_exchange_in_order(run_dir: Path) -> None:
    def body(peers: UnixPeers, g: int) -> list[list[tuple[int, int, bytes]]]:
        seen = []
        for seq in range(200):
            batch = {p: bytes([g, p]) * (seq % 5) for p in range(3) if p != g}
            reps = peers.exchange(seq, 100 * seq + g, NEVER, batch, key=(seq,) if seq % 7 == 0 else ())
            seen.append([(r.group, r.next_ns, r.batch) for r in reps])
        return seen

    got = _workers(run_dir, 3, body)
    for g in range(3):
        assert not isinstance(got[g], Exception), got[g]
        for seq, reps in enumerate(got[g]):
            others = [p for p in range(3) if p != g]
            assert reps == [(p, 100 * seq + p, bytes([p, g]) * (seq % 5)) for p in others]


def test_large_batches_both_ways_do_not_deadlock(run_dir: Path) -> None:
    size = 8 << 20  # far beyond a socket's buffer: both send at once, neither may block the other

    def body(peers: UnixPeers, g: int) -> list[int]:
        lens = []
        for seq in range(3):
            reps = peers.exchange(seq, seq, NEVER, {1 - g: bytes([g]) * size})
            assert reps[0].batch == bytes([1 - g]) * size
            lens.append(len(reps[0].batch))
        return lens

    assert _workers(run_dir, 2, body) == [[size] * 3, [size] * 3]


def test_wrong_token_is_refused_and_counted(run_dir: Path) -> None:
    token = new_token()
    result: dict[str, Any] = {}

    def worker0() -> None:
        try:
            p = UnixPeers(run_dir, 0, 2, token, startup_timeout_s=20)
            result["rejected"] = p.rejected
            result["reps"] = p.exchange(0, 5, NEVER, {})
            p.close()
        except Exception as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=worker0)
    t.start()
    ep = endpoint_file(run_dir, "cut0")
    deadline = time.monotonic() + 20
    while not ep.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    outsider = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the right path and group, a wrong token
    outsider.connect(ep.read_text().strip().removeprefix("unix://"))
    wrong = msgpack.packb({"k": HELLO, "group": 1, "token": "not the token"})
    outsider.sendall(LENGTH.pack(len(wrong)) + wrong)
    assert outsider.recv(64) == b""  # closed without a hello back
    outsider.close()
    peer = UnixPeers(run_dir, 1, 2, token, startup_timeout_s=20)
    reps = peer.exchange(0, 7, NEVER, {})
    peer.close()
    t.join(30)
    assert "error" not in result, result.get("error")
    assert result["rejected"] == 1
    assert [r.next_ns for r in result["reps"]] == [7] and [r.next_ns for r in reps] == [5]


def test_a_peer_that_closes_is_named_dead(run_dir: Path) -> None:
    def body(peers: UnixPeers, g: int) -> Any:
        peers.exchange(0, 0, NEVER, {})
        if g == 1:
            return "left"  # closes without the next barrier
        with pytest.raises(BridgeError, match="partition worker 1 closed its connection"):
            peers.exchange(1, 0, NEVER, {})
        return "named"

    assert _workers(run_dir, 2, body) == ["named", "left"]


def test_a_peer_closed_before_the_send_is_named_dead_too(run_dir: Path) -> None:
    """The send finds the close first (EPIPE on a Unix stream socket whose other end is closed): the same message
    as a read that finds it, not one that depends on which comes first."""
    closed = threading.Event()

    def body(peers: UnixPeers, g: int) -> Any:
        peers.exchange(0, 0, NEVER, {})
        if g == 1:
            peers.close()
            closed.set()
            return "left"
        assert closed.wait(20)
        with pytest.raises(BridgeError, match=r"partition worker 1 closed its connection \(dead\)"):
            peers.exchange(1, 0, NEVER, {1: b"x" * 4096})
        return "named"

    assert _workers(run_dir, 2, body) == ["named", "left"]


def test_a_silent_peer_times_out_named(run_dir: Path) -> None:
    gate = threading.Event()

    def body(peers: UnixPeers, g: int) -> Any:
        peers.exchange(0, 0, NEVER, {})
        if g == 1:
            gate.wait(10)  # alive but stuck
            return "stuck"
        with pytest.raises(BridgeError, match=r"no word from partition worker\(s\) \[1\] at barrier 1"):
            peers.exchange(1, 0, NEVER, {})
        gate.set()
        return "named"

    assert _workers(run_dir, 2, body, timeout_s=0.3) == ["named", "stuck"]


def test_a_worker_dead_after_publishing_its_socket_is_named(run_dir: Path) -> None:
    """Worker 0 bound and published its socket, then died: its file stays but nobody listens (ECONNREFUSED).
    Worker 1 names it at once, in the module's error, not a bare OSError."""
    path = run_dir / "cut0.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    endpoint_file(run_dir, "cut0").write_text(f"unix://{path}")
    t0 = time.monotonic()
    with pytest.raises(BridgeError, match=r"partition worker 1: partition worker 0 does not answer on its socket"):
        UnixPeers(run_dir, 1, 2, new_token(), startup_timeout_s=20)
    assert time.monotonic() - t0 < 5
