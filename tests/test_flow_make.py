"""`new_flow` and `moved_flows` make the `Flow`s the dataclass makes: same fields, same type, still frozen."""

from __future__ import annotations

import dataclasses

import pytest

from phantora.netsim.base import Flow, flow_of, moved_flows, new_flow


def test_new_flow_is_the_dataclass_flow() -> None:
    got = new_flow(7, 1, 2, 4096, (3, 5), 250, "c/ring/ch0/step1", key=99, conn=12345, queue=678)
    want = Flow(7, 1, 2, 4096, (3, 5), 250, "c/ring/ch0/step1", key=99, conn=12345, queue=678)
    assert type(got) is Flow and got == want and hash(got) == hash(want)
    assert (got.priority, got.loss_budget, got.rate_bps, got.via_nic) == (3, 0, 0, False)  # the field defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.size = 1  # type: ignore[misc]


def test_moved_flows_move_ids_deps_and_tags_and_gate_the_roots() -> None:
    flows = [
        Flow(10, 1, 2, 100, (), 5, "a/x", priority=1, key=7, loss_budget=3, rate_bps=9, conn=11, queue=13),
        Flow(11, 2, 3, 200, (10,), 0, "a/y", via_nic=True),
        Flow(12, 3, 3, 0, (10, 11), 0, "a/z/join"),
    ]
    got = moved_flows(flows, 1000, "b#2/", ["x", "y", "z/join"], (42,))
    want = [
        Flow(1010, 1, 2, 100, (42,), 5, "b#2/x", priority=1, key=7, loss_budget=3, rate_bps=9, conn=11, queue=13),
        Flow(1011, 2, 3, 200, (1010,), 0, "b#2/y", via_nic=True),
        Flow(1012, 3, 3, 0, (1010, 1011), 0, "b#2/z/join"),
    ]
    assert got == want and all(type(f) is Flow for f in got)
    assert [f.with_deps((1,), 2) for f in got] == [dataclasses.replace(f, deps=(1,), delay_ns=2) for f in want]


def test_flow_of_and_with_ends_are_the_dataclass_flows() -> None:
    fields = (3, 1, 2, 64, (1, 2), 9, "t", 5, 77, 4, 8, 99, 11, True)
    got = flow_of(*fields)
    assert type(got) is Flow and got == Flow(*fields)
    assert got.with_ends(6, 7) == dataclasses.replace(Flow(*fields), src=6, dst=7)
