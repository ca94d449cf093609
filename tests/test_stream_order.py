"""A rank's collectives on one process group run in turn, as on ProcessGroupNCCL's one NCCL stream per group.

Closed forms of the ideal model on tests/test_bridge_core.py's 4-GPU star (100 Gb/s, 1 us links): a ring all-reduce
of S bytes on 4 ranks takes T = 2 x 3/4 x S x 8 / 100 Gb/s + 2 us. Two issued at once, without a wait between:
on one stream the second starts when the first ends (2T), on two streams they share the links (both end at about
2T - 2 us, the latency paid once each, side by side). Before, one stream's calls overlapped as two streams do.
"""

from __future__ import annotations

from bridge.stream_order import StreamOrder
from phantora.collectives.spec import AlgoOptions
from tests.test_bridge_core import Harness, ring_allreduce_ns

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
