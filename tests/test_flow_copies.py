"""Fast per-flow copies used on the decomposition's hot paths equal `dataclasses.replace` field for field."""

from __future__ import annotations

import dataclasses

from bridge.protocol import _ints
from phantora.netsim.base import Completion, Flow


def test_with_deps_equals_dataclasses_replace_on_every_field() -> None:
    f = Flow(7, 3, 9, 4096, (1, 2, 2), delay_ns=55, tag="coll1/ring", priority=5, key=123, loss_budget=17)
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
    ]  # fmt: skip  (a new field must be added to Flow.with_deps)
    assert f.with_deps((2,)) == dataclasses.replace(f, deps=(2,))
    assert f.with_deps((), 0) == dataclasses.replace(f, deps=(), delay_ns=0)
    assert f.with_deps((1,), 9).delay_ns == 9 and f.with_deps((1,), 9).loss_budget == 17


def test_ints_accepts_int_lists_only() -> None:
    assert _ints([]) and _ints([0, -5, 1 << 62])
    assert not _ints([1, True]) and not _ints([1, 2.0]) and not _ints((1, 2)) and not _ints([1, "2"])


def test_completion_fields_are_the_ones_nic_latency_copies() -> None:
    """`NicLatencySimulator._posted_starts` rebuilds a Completion positionally: its fields, in order."""
    assert [x.name for x in dataclasses.fields(Completion)] == [
        "flow_id", "start_ns", "end_ns", "size", "src", "dst", "tag", "lost",
    ]  # fmt: skip
