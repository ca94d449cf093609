"""A decomposition driver's completion buffer (`CompletionBuffer`, issue 38 item 2): each reply kept as a run of its
own, handed out by end, built in (end, id) order across runs. Every hand-out must be exactly the buffered completions
ending at or before its ns (or at the least end), in (end, id) order: the definition, checked against a sort of all
of them over random replies."""

from __future__ import annotations

import random

from phantora.netsim.base import Completion
from phantora.netsim.completion_buffer import CompletionBuffer, built
from phantora.netsim.completion_columns import CompletionColumns


def _columns(done: list[Completion]) -> CompletionColumns:
    cols = ([getattr(c, f) for c in done] for f in ("flow_id", "start_ns", "end_ns", "size", "src", "dst", "tag"))
    return CompletionColumns(*cols)


def _key(c: Completion) -> tuple[int, int]:
    return (c.end_ns, c.flow_id)


def test_replies_interleaved_in_time_come_out_in_end_then_id_order() -> None:
    buf = CompletionBuffer()
    a = [Completion(9, 0, 100, 1, 0, 1), Completion(4, 0, 100, 1, 0, 1), Completion(2, 0, 300, 1, 0, 1)]
    b = [Completion(5, 0, 100, 1, 2, 3), Completion(1, 0, 200, 1, 2, 3)]
    buf.add([c.end_ns for c in a], [c.flow_id for c in a], _columns(a))
    buf.add([c.end_ns for c in b], [c.flow_id for c in b], b)  # (a reply of objects)
    buf.add_one(150, 7, Completion(7, 150, 150, 0, 1, 1, "marker"))
    assert len(buf) == 6 and buf.earliest() == 100
    assert sorted(buf.pairs()) == [(100, 4), (100, 5), (100, 9), (150, 7), (200, 1), (300, 2)]
    first, end = buf.take_first()
    assert end == 100 and [c.flow_id for c in built(first)] == [4, 5, 9]
    upto, end = buf.take(250)
    assert end == 200 and [c.flow_id for c in built(upto)] == [7, 1] and built(upto)[0].tag == "marker"
    assert buf.take(250) == ([], -1) and len(buf) == 1 and buf.earliest() == 300
    rest, end = buf.take(10**9)
    assert end == 300 and [c.flow_id for c in built(rest)] == [2]
    assert not buf and len(buf) == 0 and buf.earliest() is None and buf.take_first() == ([], -1)


def test_a_reply_out_of_end_order_is_handed_out_in_order() -> None:
    buf = CompletionBuffer()
    done = [Completion(3, 0, 50, 1, 0, 1), Completion(8, 0, 20, 1, 0, 1), Completion(6, 0, 50, 1, 0, 1)]
    buf.add([c.end_ns for c in done], [c.flow_id for c in done], _columns(done))
    got, end = buf.take(20)
    assert end == 20 and [c.flow_id for c in built(got)] == [8]
    got, end = buf.take(50)
    assert end == 50 and [c.flow_id for c in built(got)] == [3, 6]


def test_random_replies_hand_out_exactly_what_ends_by_each_ns_in_order() -> None:
    rng = random.Random(38)
    for _ in range(40):
        buf = CompletionBuffer()
        left: list[Completion] = []
        fid = 0
        now = 0
        for _ in range(rng.randrange(1, 12)):
            for _ in range(rng.randrange(0, 4)):  # replies: each in end order, ids in any order within a ns
                ends = sorted(now + rng.randrange(0, 40) for _ in range(rng.randrange(0, 30)))
                done = []
                for e in ends:
                    fid += rng.randrange(1, 5)
                    done.append(Completion(rng.choice([fid, 1_000_000 - fid]), e - 5, e, 64, 0, 1, "t"))
                if rng.random() < 0.2:
                    rng.shuffle(done)  # (out of end order: sorted when added)
                ids, stamps = [c.flow_id for c in done], [c.end_ns for c in done]
                buf.add(stamps, ids, _columns(done) if rng.random() < 0.7 else done)
                left += done
            for _ in range(rng.randrange(0, 3)):
                fid += 1
                e = now + rng.randrange(0, 40)
                m = Completion(20_000 + fid, e, e, 0, 2, 2, "marker")
                buf.add_one(e, m.flow_id, m)
                left.append(m)
            assert len(buf) == len(left) and sorted(buf.pairs()) == sorted(map(_key, left))
            assert buf.earliest() == min((c.end_ns for c in left), default=None)
            if rng.random() < 0.3 and left:
                segs, end = buf.take_first()
                least = min(c.end_ns for c in left)
                want = sorted((c for c in left if c.end_ns == least), key=_key)
            else:
                now += rng.randrange(0, 30)
                segs, end = buf.take(now)
                want = sorted((c for c in left if c.end_ns <= now), key=_key)
            got = built(segs)
            assert got == want and end == (want[-1].end_ns if want else -1)
            left = [c for c in left if c not in want]
