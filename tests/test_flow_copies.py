"""Fast per-flow copies used on the decomposition's hot paths equal `dataclasses.replace` field for field."""

from __future__ import annotations

import dataclasses

from bridge.protocol import _ints
from phantora.netsim.base import Completion, Flow
from phantora.netsim.hybrid import topological_order


def test_with_deps_equals_dataclasses_replace_on_every_field() -> None:
    f = Flow(
        7,
        3,
        9,
        4096,
        (1, 2, 2),
        delay_ns=55,
        tag="c1/ring",
        priority=5,
        key=123,
        loss_budget=17,
        rate_bps=9,
        conn=11,
        queue=13,
        via_nic=True,
    )
    assert [x.name for x in dataclasses.fields(Flow)] == [
        "id",
        "src",
        "dst",
        "size",
        "deps",
        "delay_ns",
        "tag",
        "priority",
        "key",
        "loss_budget",
        "rate_bps",
        "conn",
        "queue",
        "via_nic",
    ]  # fmt: skip  (a new field must be added to Flow.with_deps)
    assert f.with_deps((2,)) == dataclasses.replace(f, deps=(2,))
    assert f.with_deps((), 0) == dataclasses.replace(f, deps=(), delay_ns=0)
    assert f.with_deps((1,), 9).delay_ns == 9 and f.with_deps((1,), 9).loss_budget == 17
    assert f.with_deps((1,), 9).rate_bps == 9 and f.with_deps((1,), 9).conn == 11
    assert f.with_deps((1,), 9).queue == 13 and f.with_deps((1,), 9).via_nic
    assert f.moved(8, (), "c2/ring") == dataclasses.replace(f, id=8, deps=(), tag="c2/ring")


def test_ints_accepts_int_lists_only() -> None:
    assert _ints([]) and _ints([0, -5, 1 << 62])
    assert not _ints([1, True]) and not _ints([1, 2.0]) and not _ints((1, 2)) and not _ints([1, "2"])


def test_completion_fields_are_the_ones_nic_latency_copies() -> None:
    """`NicLatencySimulator._posted_starts` rebuilds a Completion positionally: its fields, in order."""
    assert [x.name for x in dataclasses.fields(Completion)] == [
        "flow_id", "start_ns", "end_ns", "size", "src", "dst", "tag", "lost",
    ]  # fmt: skip


def test_topological_order_keeps_an_ordered_batch_and_reorders_otherwise() -> None:
    a, b, c = Flow(1, 0, 1, 10), Flow(2, 0, 1, 10, (1,)), Flow(3, 0, 1, 10, (2, 99))
    ordered = [a, b, c]
    assert topological_order(ordered, {f.id: f for f in ordered}) == ordered
    shuffled = [c, a, b]
    out = topological_order(shuffled, {f.id: f for f in shuffled})
    assert [f.id for f in out] == [1, 2, 3]  # each after its in-batch deps (99 is outside the batch)
