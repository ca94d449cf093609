"""The coordinator gives a receive from any source (gloo's recvAnysource) the matching send issued earliest in
virtual time (bridge/anysource.py), whatever order the ranks' messages arrive in.

Closed forms on test_bridge_core's 4-GPU star (100 Gb/s, 1 us links) under the ideal model: a transfer of S bytes
takes S * 8 / B plus two link latencies; a transfer of 0 bytes (a gloo group's, backend.py `gloo_sync`) ends when its
later side is issued.
"""

from __future__ import annotations

import pytest

from bridge.errors import RunFailed
from tests.test_bridge_core import IDEAL, Harness, transfer_ns


def _any(h: Harness, rank: int, t: int, peers: list[int], tag: int = 0, nbytes: int = 0) -> int:
    h.handles[rank] += 1
    hd = h.handles[rank]
    h.msg(
        rank, "p2p", t, h=hd, peer=-1, send=False, tag=tag, seq=-1, nbytes=nbytes, name="", any=[[p, 0] for p in peers]
    )
    return hd


def _p2p(h: Harness, rank: int, t: int, peer: int, send: bool, nbytes: int = 0, seq: int = 0) -> int:
    h.handles[rank] += 1
    hd = h.handles[rank]
    h.msg(rank, "p2p", t, h=hd, peer=peer, send=send, tag=0, seq=seq, nbytes=nbytes, name="")
    return hd


def _sources(h: Harness, rank: int) -> list[tuple[int, int, int]]:
    return [(m["h"], m["src"], m["seq"]) for m in h.sent[rank] if m.type == "source"]


def test_the_send_issued_first_in_virtual_time_wins_not_the_first_to_arrive() -> None:
    h = Harness(world=4, algo=IDEAL)
    h.wait(1, 5_000, _p2p(h, 1, 5_000, 0, True))  # arrives first, issued later in virtual time
    h.wait(2, 3_000, _p2p(h, 2, 3_000, 0, True))
    h.msg(3, "finish", 0, results={}, cpu_s=0.0)
    first = _any(h, 0, 1_000, [1, 2, 3])
    h.wait(0, 1_000, first)
    h.core.progress()
    assert _sources(h, 0) == [(first, 2, 0)]
    kinds = [m.type for m in h.sent[0]]
    assert kinds.index("source") < kinds.index("result")  # told before its result (real mode posts gloo's recv)
    assert h.result(0)["t_done"] == h.result(2)["t_done"] == 3_000  # 0 bytes: ends at the later side's issue
    assert not [m for m in h.sent[1] if m.type == "result"]  # rank 1's send waits for a receive
    h.msg(2, "finish", 3_000, results={}, cpu_s=0.0)  # every live rank blocked again: the next can be given
    second = _any(h, 0, 3_000, [1, 2, 3])
    h.wait(0, 3_000, second)
    h.core.progress()
    assert _sources(h, 0)[1] == (second, 1, 0)
    assert h.result(0)["t_done"] == h.result(1)["t_done"] == 5_000


def test_a_rank_that_can_still_send_earlier_is_waited_for() -> None:
    """Rank 2 waits on a 1,000 B transfer to rank 3 that ends at 1,000 + 2,080 ns, before rank 1's send at 5,000 ns:
    the receive waits for it (the network stops short of 5,000 ns), and rank 2's send at 3,080 ns wins."""
    h = Harness(world=4, algo=IDEAL)
    h.wait(1, 5_000, _p2p(h, 1, 5_000, 0, True))
    h.wait(3, 0, _p2p(h, 3, 0, 2, False, nbytes=1_000))
    h.wait(2, 1_000, _p2p(h, 2, 1_000, 3, True, nbytes=1_000))
    recv = _any(h, 0, 100, [1, 2])
    h.wait(0, 100, recv)
    h.core.progress()
    end = 1_000 + transfer_ns(1_000)
    assert end == 3_080 and h.result(2)["t_done"] == end
    assert not _sources(h, 0)
    h.msg(3, "finish", end, results={}, cpu_s=0.0)
    h.wait(2, end, _p2p(h, 2, end, 0, True))
    h.core.progress()
    assert _sources(h, 0) == [(recv, 2, 0)]
    assert h.result(0)["t_done"] == end


def test_when_nothing_can_move_short_of_the_send_the_earliest_issued_wins() -> None:
    """Rank 2's transfer to rank 3 (8 MiB) ends after rank 1's send: the receive takes rank 1's, at 5,000 ns."""
    h = Harness(world=4, algo=IDEAL)
    h.wait(1, 5_000, _p2p(h, 1, 5_000, 0, True))
    h.wait(3, 0, _p2p(h, 3, 0, 2, False, nbytes=8 << 20))
    h.wait(2, 1_000, _p2p(h, 2, 1_000, 3, True, nbytes=8 << 20))
    recv = _any(h, 0, 100, [1, 2])
    h.wait(0, 100, recv)
    h.core.progress()
    assert _sources(h, 0) == [(recv, 1, 0)]
    assert h.result(0)["t_done"] == h.result(1)["t_done"] == 5_000
    assert 1_000 + transfer_ns(8 << 20) > 5_000


def test_a_pairs_sends_are_taken_in_order_and_a_named_recv_keeps_its_own() -> None:
    h = Harness(world=2, algo=IDEAL)
    named = _p2p(h, 0, 0, 1, False)  # rank 0's recv #0 from rank 1, named, issued first
    s0, s1 = _p2p(h, 1, 10, 0, True, seq=0), _p2p(h, 1, 20, 0, True, seq=1)
    h.wait(1, 20, s1)
    recv = _any(h, 0, 0, [1])
    h.wait(0, 0, recv)
    h.core.progress()
    assert _sources(h, 0) == [(recv, 1, 1)]
    assert h.result(0)["t_done"] == h.result(1)["t_done"] == 20
    assert {m["h"] for m in h.sent[1] if m.type == "result"} == {s1}
    h.wait(0, 20, named)
    h.core.progress()
    assert h.result(0)["t_done"] == 10  # it took send #0, issued at 10 ns
    h.wait(1, 20, s0)
    h.core.progress()
    assert h.result(1)["t_done"] == 10


def test_a_receive_nobody_sends_is_a_deadlock_naming_its_sources() -> None:
    h = Harness(world=2, algo=IDEAL)
    h.wait(0, 0, _any(h, 0, 0, [1]))
    with pytest.raises(RunFailed, match=r"from any of ranks \[1\], none of which sent it"):
        h.msg(1, "finish", 0, results={}, cpu_s=0.0)
        h.core.progress()


def test_bad_sources_are_one_line_errors() -> None:
    h = Harness(world=2, algo=IDEAL)
    with pytest.raises(RunFailed, match="bad sources"):
        _any(h, 0, 0, [0])
    with pytest.raises(RunFailed, match="outside 0..1"):
        _any(h, 1, 0, [5])
