"""A rank's collectives on one process group run in turn, as on ProcessGroupNCCL's one NCCL stream per group.

Closed forms of the ideal model on tests/test_bridge_core.py's 4-GPU star (100 Gb/s, 1 us links): a ring all-reduce
of S bytes on 4 ranks takes T = 2 x 3/4 x S x 8 / 100 Gb/s + 2 us. Two issued at once, without a wait between:
on one stream the second starts when the first ends (2T), on two streams they share the links (both end at about
2T - 2 us, the latency paid once each, side by side). Before, one stream's calls overlapped as two streams do.
"""

from __future__ import annotations

import pytest

from bridge.errors import RunFailed
from bridge.stream_order import StreamOrder
from phantora.collectives.spec import AlgoOptions
from tests.test_bridge_core import LAT, Harness, ring_allreduce_ns

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
