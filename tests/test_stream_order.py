"""A rank's collectives on one process group run in turn, as on ProcessGroupNCCL's one NCCL stream per group.

Closed forms of the ideal model on tests/test_bridge_core.py's 4-GPU star (100 Gb/s, 1 us links): a ring all-reduce
of S bytes on 4 ranks takes T = 2 x 3/4 x S x 8 / 100 Gb/s + 2 us. Two issued at once, without a wait between:
on one stream the second starts when the first ends (2T), on two streams they share the links (both end at about
2T - 2 us, the latency paid once each, side by side). Before, one stream's calls overlapped as two streams do.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.errors import RunFailed
from bridge.stream_order import StreamOrder
from phantora.collectives.spec import AlgoOptions
from tests.test_bridge_core import LAT, Harness, ring_allreduce_ns, transfer_ns

S = 8 * 2**20
IDEAL = AlgoOptions(model="ideal")


def _two_all_reduces(streams: tuple[int, int]) -> list[int]:
    h = Harness(algo=IDEAL)
    done = []
    for r in range(4):
        for i, stream in enumerate(streams):
            h.handles[r] += 1
            h.msg(r, "coll", 0, h=h.handles[r], group=[0, 1, 2, 3], seq=i, kind="all_reduce", nbytes=S,
                  dtype="bf16", root=None, name="", algo=None, stream=stream)  # fmt: skip
        h.wait(r, 0, h.handles[r])
    h.core.progress()
    for r in range(4):
        done.append(h.result(r)["t_done"])
    first, second = h.core.records
    assert first.t_start == 0
    return [second.t_start, *done]


def test_one_stream_runs_the_second_after_the_first() -> None:
    t = ring_allreduce_ns(S, 4)
    assert _two_all_reduces((7, 7)) == [t, 2 * t, 2 * t, 2 * t, 2 * t]


def test_two_streams_overlap() -> None:
    t = ring_allreduce_ns(S, 4)
    start, *ends = _two_all_reduces((7, 8))
    assert start == 0 and all(e < 2 * t for e in ends)


def test_no_stream_keeps_the_old_overlap() -> None:
    """A rank that names no stream (a replayed graph, an older client) is not ordered."""
    order = StreamOrder()
    order.issued(0, None, 1)
    order.issued(0, None, 2)
    assert not list(order.waited_on()) and not order.parked


def test_a_parked_call_freed_while_the_run_drains_starts_at_its_predecessors_end() -> None:
    """Ranks that finish with calls in flight: the coordinator drains them (finalize). B waits on stream 7 for A
    (0 -> T); C, on stream 8, is issued at 3T. Catching up to C must stop at A's end, where B starts (T -> 2T),
    not run on to C and then start B in the past (an "exact mode broken" failure before)."""
    t = ring_allreduce_ns(S, 4)
    h = Harness(algo=IDEAL)
    calls = [(7, 0, 0), (7, 1, 0), (8, 2, 3 * t)]  # (stream, seq, issue ns): A, B, C
    for r in range(4):
        for stream, seq, at in calls:
            h.handles[r] += 1
            h.msg(r, "coll", at, h=h.handles[r], group=[0, 1, 2, 3], seq=seq, kind="all_reduce", nbytes=S,
                  dtype="bf16", root=None, name="", algo=None, stream=stream)  # fmt: skip
        h.msg(r, "finish", 3 * t, results={}, cpu_s=0.0)
    h.core.finalize()
    spans = sorted((rec.t_start, rec.end_ns) for rec in h.core.records)
    assert spans == [(0, t), (t, 2 * t), (3 * t, 4 * t)]


def test_one_group_launch_starts_its_calls_together_and_the_next_call_after_all() -> None:
    """A `_coalescing_manager` block is one NCCL group launch: A and B (launch 1 on stream 7) start at once and
    share the links, the ring's latency paid once, so both end at 2T - 2 LAT (one launch fewer than A then B, 2T);
    C, the next call on stream 7, starts when the last of them ends and ends T later."""
    t = ring_allreduce_ns(S, 4)
    h = Harness(algo=IDEAL)
    for r in range(4):
        for seq, launch in enumerate((1, 1, None)):
            h.handles[r] += 1
            more = {} if launch is None else {"launch": launch}
            h.msg(r, "coll", 0, h=h.handles[r], group=[0, 1, 2, 3], seq=seq, kind="all_reduce", nbytes=S,
                  dtype="bf16", root=None, name="", algo=None, stream=7, **more)  # fmt: skip
        h.wait(r, 0, h.handles[r])
    h.core.progress()
    spans = [(rec.t_start, rec.end_ns) for rec in h.core.records]
    block = 2 * t - 2 * LAT
    assert spans == [(0, block), (0, block), (block, block + t)]


def test_a_launch_id_joins_only_the_streams_last_launch() -> None:
    """Launch 1 twice on stream 7 with a lone call between: the second is a launch of its own after that call."""
    order = StreamOrder()
    for handle, launch in ((1, 1), (2, 1), (3, None), (4, 1), (5, 1)):
        order.issued(0, 7, handle, launch)
    assert order._prev == {(0, 3): (1, 2), (0, 4): (3,), (0, 5): (3,)}


def _two_groups(after_first: bool) -> list[tuple[int, int]]:
    """A on one group's stream (7), B on another's (8), both issued at 0; B after A when `after_first` (both
    sync on one CUDA stream: the rank names A in B's `after`)."""
    h = Harness(algo=IDEAL)
    for r in range(4):
        first = h.handles[r] + 1
        for seq, stream in enumerate((7, 8)):
            h.handles[r] += 1
            more = {"after": [first]} if after_first and stream == 8 else {}
            h.msg(r, "coll", 0, h=h.handles[r], group=[0, 1, 2, 3], seq=seq, kind="all_reduce", nbytes=S,
                  dtype="bf16", root=None, name="", algo=None, stream=stream, **more)  # fmt: skip
        h.wait(r, 0, h.handles[r])
    h.core.progress()
    return [(rec.t_start, rec.end_ns) for rec in h.core.records]


def test_two_sync_calls_on_one_cuda_stream_run_in_turn_across_groups() -> None:
    """Sync collectives of two groups launched on one CUDA stream (FSDP2's HSDP all-reduce after its
    reduce-scatter): the second starts when the first ends, (0, T) then (T, 2T); without `after` they overlap."""
    t = ring_allreduce_ns(S, 4)
    assert _two_groups(True) == [(0, t), (t, 2 * t)]
    assert all(end < 2 * t for _, end in _two_groups(False))


def test_after_must_name_the_ranks_own_collectives() -> None:
    h = Harness(algo=IDEAL)
    with pytest.raises(RunFailed, match="after"):
        h.msg(0, "coll", 0, h=1, group=[0, 1, 2, 3], seq=0, kind="all_reduce", nbytes=S, dtype="bf16", root=None,
              name="", algo=None, stream=7, after=[5])  # fmt: skip


def _p2p(h: Harness, rank: int, peer: int, send: bool, tag: int, **order: Any) -> int:
    """One side of a transfer of S bytes, issued at 0 (`order`: its stream, launch, after)."""
    h.handles[rank] += 1
    h.msg(rank, "p2p", 0, h=h.handles[rank], peer=peer, send=send, tag=tag, seq=0, nbytes=S, name="", **order)
    return h.handles[rank]


def _spans(h: Harness) -> list[tuple[int, int]]:
    h.core.progress()
    return sorted((rec.t_start, rec.end_ns) for rec in h.core.records)


@pytest.mark.parametrize("stream", [5, None])
def test_sends_on_one_pair_stream_run_in_turn(stream: int | None) -> None:
    """Two isends 0 -> 1 on the pair's communicator stream (ProcessGroupNCCL's lone p2p): the second starts when
    the first ends, (0, T) then (T, 2T) with T = transfer_ns(S); on no stream (before) they shared the link, both
    ending at 2T - 2 LAT."""
    t = transfer_ns(S)
    h = Harness(world=2, algo=IDEAL)
    order = {} if stream is None else {"stream": stream}
    for tag in (0, 1):
        _p2p(h, 0, 1, True, tag, **order)
        _p2p(h, 1, 0, False, tag, **order)
    for r in (0, 1):
        h.wait(r, 0, 2)
    if stream is None:
        assert _spans(h) == [(0, 2 * t - 2 * LAT)] * 2
    else:
        assert _spans(h) == [(0, t), (t, 2 * t)]


def test_a_send_after_a_sync_collective_on_its_cuda_stream_starts_at_its_end() -> None:
    """A sync all-reduce on a side stream (it runs there), then a send from that stream: the send's pair stream
    waits for the side stream (syncStream), so the send starts at the all-reduce's end T_AR and ends T_S later."""
    ar, t = ring_allreduce_ns(S, 2), transfer_ns(S)
    h = Harness(world=2, algo=IDEAL)
    first = {r: h.coll(r, 0, group=(0, 1)) for r in (0, 1)}
    _p2p(h, 0, 1, True, 0, stream=9, after=[first[0]])
    _p2p(h, 1, 0, False, 0, stream=9, after=[first[1]])
    for r in (0, 1):
        h.wait(r, 0, 2)
    assert _spans(h) == [(0, ar), (ar, ar + t)]


def test_a_batched_ring_is_one_group_launch() -> None:
    """batch_isend_irecv of a ring (each rank sends S to r + 1 and receives from r - 1, launch 1 on the group's
    stream 7): one NCCL launch, so every transfer starts at 0 and, each NIC sending one and receiving one, ends at
    T = transfer_ns(S); the group's next call, an all-reduce, starts when the last ends: (T, T + T_AR). The same
    ring as lone calls on that one stream in this order would deadlock, as on NCCL."""
    t = transfer_ns(S)
    h = Harness(world=4, algo=IDEAL)
    for r in range(4):
        _p2p(h, r, (r + 1) % 4, True, 0, stream=7, launch=1)
        _p2p(h, r, (r - 1) % 4, False, 0, stream=7, launch=1)
    for r in range(4):
        h.handles[r] += 1
        h.msg(r, "coll", 0, h=h.handles[r], group=[0, 1, 2, 3], seq=0, kind="all_reduce", nbytes=S, dtype="bf16",
              root=None, name="", algo=None, stream=7)  # fmt: skip
        h.wait(r, 0, h.handles[r])
    assert _spans(h) == [(0, t)] * 4 + [(t, t + ring_allreduce_ns(S, 4))]


def test_a_sends_after_must_name_the_ranks_earlier_calls() -> None:
    h = Harness(world=2, algo=IDEAL)
    with pytest.raises(RunFailed, match="after"):
        _p2p(h, 0, 1, True, 0, stream=5, after=[3])


def test_two_ranks_sending_first_on_their_pair_stream_deadlock_with_the_held_call_named() -> None:
    """Both ranks isend, then irecv, on their pair's stream: each receive waits for its rank's send, which waits for
    the other's receive. NCCL hangs so past its buffers; the coordinator reports it at once, naming the held call."""
    h = Harness(world=2, algo=IDEAL)
    for r in (0, 1):
        _p2p(h, r, 1 - r, True, r, stream=5)
        _p2p(h, r, 1 - r, False, 1 - r, stream=5)
        h.wait(r, 0, 2)
    with pytest.raises(RunFailed, match="deadlock(.|\n)*held behind an earlier call on its stream"):
        h.core.progress()
