"""A local partition worker's window loop in C++ (issue 38): `ns3::PhantoraCutPeers`' frame and its failures, checked
against `bridge.cut_frame` over a socketpair, and the whole loop against the Python loop and one keyed engine."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.cut_frame import LENGTH, MAX_FRAME, decode, encode
from phantora.netsim.cut_native import bucket_name
from phantora.netsim.cut_windows import NEVER, PeerReport, width_bucket


def _ns3() -> Any:
    from phantora.netsim import cut_native
    from phantora.netsim.packet import load_ns3

    load_ns3()
    return cut_native._gbl()


def _vector(ns3: Any) -> Any:
    import cppyy

    return cppyy.gbl.std.vector[ns3.CutReport]()


def _recv_frame(sock: socket.socket, group: int) -> tuple[int, PeerReport]:
    """One `bridge.cut_frame` frame from `sock`, decoded as worker `group`'s."""
    sock.settimeout(5)
    raw = b""
    while len(raw) < LENGTH.size:
        raw += sock.recv(LENGTH.size - len(raw))
    (n,) = LENGTH.unpack(raw)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return decode(group, body)


def test_width_buckets_are_cut_windows_names() -> None:
    assert [bucket_name(i) for i in range(5)] == ["0", "1", "2-9", "10-99", "100-999"]
    assert bucket_name(20) == width_bucket(NEVER)


def test_a_barrier_sends_and_reads_the_python_frame() -> None:
    """The C++ peers read `bridge.cut_frame.encode`'s frames (msgpack's smallest int forms) and write frames its
    `decode` reads (every int as int 64): the Python loop's wire format, both ways."""
    ns3 = _ns3()
    a, b = socket.socketpair()
    try:
        peers = ns3.PhantoraCutPeers(0, [-1, a.fileno()], 2000, 2000)
        b.sendall(encode(0, 11, NEVER, b"\x01\x02\x03", (300, NEVER), (5, 6, 7, 8), (NEVER, 7_000), (40, NEVER), 2_500))
        b.sendall(encode(1, 1, 1, b""))  # the next barrier's frame, already there: stays buffered
        mine = ns3.CutReport()
        mine.next, mine.minArrival, mine.later, mine.output = 100, 1_100, 2_000, 1_000
        out = _vector(ns3)
        peers.Exchange(0, mine, ["", "batch for 1"], out)
        got = out[1]
        assert [got.next, got.minArrival, got.later, got.same, got.sampleFrom, got.reactBound, got.reactStop,
                got.output] == [11, NEVER, 300, NEVER, NEVER, 40, NEVER, 2_500]  # fmt: skip
        assert (got.idle, got.keyLen, list(got.key)) == (7_000, 4, [5, 6, 7, 8])
        assert bytes(got.batch) == b"\x01\x02\x03"
        assert peers.Buffered() == len(encode(1, 1, 1, b""))
        assert _recv_frame(b, 0) == (0, PeerReport(0, 100, 1_100, b"batch for 1", 2_000, NEVER, (), NEVER, NEVER,
                                                   NEVER, NEVER, 1_000))  # fmt: skip
        peers.Exchange(1, mine, ["", ""], out)  # the buffered frame answers barrier 1
        assert (out[1].next, out[1].minArrival, peers.Buffered()) == (1, 1, 0)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("write", "what"),
    [
        (None, r"partition worker 0: no word from partition worker\(s\) \[1\] at barrier 3 \(dead or stuck\)"),
        ("close", "partition worker 0: partition worker 1 closed its connection \\(dead\\)"),
        (encode(7, 0, 0, b""), "partition worker 0: worker 1 sent barrier 7 at barrier 3"),
        (
            LENGTH.pack(3) + b"abc",
            "partition worker 0: partition worker 1 sent a window report of 3 bytes that does not parse",
        ),
        (LENGTH.pack(MAX_FRAME + 1), f"worker 1 announced a window report of {MAX_FRAME + 1} bytes"),
    ],
)
def test_a_silent_dead_or_garbled_peer_is_named(write: bytes | str | None, what: str) -> None:
    ns3 = _ns3()
    a, b = socket.socketpair()
    try:
        peers = ns3.PhantoraCutPeers(0, [-1, a.fileno()], 200, 200)
        if write == "close":
            b.close()
        elif isinstance(write, bytes):
            b.sendall(write)
        out = _vector(ns3)
        with pytest.raises(Exception, match=what):
            peers.Exchange(3, ns3.CutReport(), ["", ""], out)
    finally:
        a.close()
        b.close()


def test_exchange_rounds_make_the_loops_barriers() -> None:
    """`PhantoraCutExchangeRounds` (the benches' barrier alone) makes one barrier a round, each a frame the Python
    loop reads with its sequence number and the batch's bytes, and reads the peer's frame of each."""
    from phantora.netsim import cut_native

    ns3 = _ns3()
    a, b = socket.socketpair()
    try:
        peers = ns3.PhantoraCutPeers(0, [-1, a.fileno()], 500, 500)
        for seq in range(3, 7):
            b.sendall(encode(seq, seq, NEVER, b"x"))
        cpu_s, wall_s = cut_native.exchange_rounds(peers, 3, 4, 16)
        got = [_recv_frame(b, 0) for _ in range(4)]
        assert [(seq, r.next_ns, r.batch) for seq, r in got] == [(s, 100 * s, bytes(16)) for s in range(3, 7)]
        assert peers.Buffered() == 0 and cpu_s >= 0 and wall_s > 0
        with pytest.raises(Exception, match=r"no word from partition worker\(s\) \[1\] at barrier 7"):
            cut_native.exchange_rounds(peers, 7, 1, 0)
    finally:
        a.close()
        b.close()


def test_a_socket_per_other_worker() -> None:
    ns3 = _ns3()
    with pytest.raises(Exception, match="socket 5 for worker 0 .*-1 at its own group 0"):
        ns3.PhantoraCutPeers(0, [5, 6], 200, 200)


def _run(loop: str, monkeypatch: pytest.MonkeyPatch, partition: int) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_partition_dag as bench
    from bench_decompose import a2a_dag

    from phantora.topology.generators import rail_optimized

    monkeypatch.setenv("PHANTORA_CUT_LOOP", loop)
    topo = rail_optimized(2, 2, 2)
    flows = a2a_dag(topo, 16_384 * topo.num_ranks)
    sets = [*bench.SETS, f"partition={partition}"] if partition else bench.SETS
    return bench.run_dag(topo, flows, sets, "dcqcn")


@pytest.mark.slow
def test_the_c_loop_runs_the_python_loops_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two cross-rail all-to-alls (16 KiB a pair, 2 hosts x 2 GPUs, 2 spines) on stepped workers=2: the C++ loop
    and the Python loop give one keyed engine's completions, and the same windows, ended by the same rules."""
    one = _run("c", monkeypatch, 0)
    c, py = _run("c", monkeypatch, 2), _run("python", monkeypatch, 2)
    assert c["key"] == py["key"] == one["key"]
    keys = ("windows", "windows_ended_by", "window_widths_ns", "message_bytes", "rounds")
    assert {k: c["part"][k] for k in keys} == {k: py["part"][k] for k in keys}
    assert c["part"]["windows"] > 10 and c["part"]["message_bytes"] > 0
