"""Flows and completions as columns on the wire (bridge.columns, issue 38): round trips through msgpack, and
malformed columns refused with a protocol error (never another exception)."""

from __future__ import annotations

import msgpack
import pytest

from bridge.columns import (
    SHARED_MIN,
    completions_from_columns,
    completions_to_columns,
    flows_from_columns,
    flows_to_columns,
)
from bridge.errors import ProtocolError
from phantora.netsim.base import Completion, Flow

FLOWS = [
    Flow(7, 1, 2, 4096, (3, 4), 150, "coll1/ring/ch0/step0", 3, None),
    Flow(2**64 - 1, 5, 6, 0, (), 0, "", 1, 42, 0, 0, 0),
    Flow(9, 2, 1, 10, (7,), 0, "x", 7, 9, 4, 400_000_000_000, 2**63),
]


def wire(obj: object) -> object:
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False)


def test_flows_round_trip_with_their_deps_or_replacements() -> None:
    assert flows_from_columns(wire(flows_to_columns(FLOWS))) == FLOWS
    local = [(), (1, 2, 3), (4,)]
    got = flows_from_columns(wire(flows_to_columns(FLOWS, local)))
    assert [f.deps for f in got] == local
    assert [f.with_deps(g.deps) for f, g in zip(FLOWS, got, strict=True)] == got
    assert flows_from_columns(wire(flows_to_columns([]))) == []


def test_a_flow_through_the_nics_keeps_its_field_and_its_key() -> None:
    """`Flow.via_nic` in its own column (sent only when a flow of the batch has it), the key left whole."""
    flows = [*FLOWS, Flow(10, 3, 4, 64, (), 0, "net", 3, 5 << 56, via_nic=True)]
    cols = flows_to_columns(flows)
    assert cols["nic"] == [False, False, False, True] and "nic" not in flows_to_columns(FLOWS)
    got = flows_from_columns(wire(cols))
    assert got == flows and got[3].key == 5 << 56 and [f.via_nic for f in got] == [False, False, False, True]


def test_a_shared_wide_deps_list_goes_once_and_comes_back_shared() -> None:
    wide = tuple(range(100, 100 + SHARED_MIN))  # one object, as an all-to-all's dependents share it
    flows = [Flow(i, 1, 2, 64, wide) for i in range(3)] + [Flow(3, 1, 2, 64, tuple(wide)[:-1] + (99,))]
    cols = flows_to_columns(flows)
    assert cols["ndeps"] == [SHARED_MIN, -1, -1, SHARED_MIN]  # rows 1 and 2 refer to row 0's
    assert len(cols["deps"]) == 2 * SHARED_MIN
    got = flows_from_columns(wire(cols))
    assert got == flows
    assert got[0].deps is got[1].deps is got[2].deps and got[3].deps is not got[0].deps
    short = (1, 2)  # below SHARED_MIN: sent per row as before
    assert flows_to_columns([Flow(0, 1, 2, 64, short), Flow(1, 1, 2, 64, short)])["ndeps"] == [2, 2]


@pytest.mark.parametrize("ndeps", [[-2, SHARED_MIN], [SHARED_MIN, -2], [SHARED_MIN, -1, -2]])
def test_a_deps_reference_to_a_later_or_referring_row_is_a_protocol_error(ndeps: list[int]) -> None:
    wide = tuple(range(SHARED_MIN))
    cols = flows_to_columns([Flow(i, 1, 2, 64, wide) for i in range(len(ndeps))])
    cols["ndeps"] = ndeps
    with pytest.raises(ProtocolError, match="refers to row"):
        flows_from_columns(cols)


def test_completions_round_trip_with_sparse_lost_ranges() -> None:
    done = [
        Completion(1, 0, 100, 4096, 1, 2, "a"),
        Completion(2, 5, 900, 8192, 3, 4, "b", ((0, 1000), (4096, 96))),
        Completion(3, 7, 901, 1, 3, 4, ""),
    ]
    cols = completions_to_columns(done)
    assert cols["lost"] == [[1, [[0, 1000], [4096, 96]]]]
    assert completions_from_columns(wire(cols)) == done


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c.pop("size"),  # a missing column
        lambda c: c["src"].append(1),  # one column longer
        lambda c: c.__setitem__("size", [1.5, 2, 3]),  # not ints
        lambda c: c.__setitem__("size", [True, 2, 3]),  # bools are not ints
        lambda c: c.__setitem__("ndeps", [2, 0, 2]),  # counts beyond the deps column
        lambda c: c.__setitem__("tag", ["a", 1, "c"]),
        lambda c: c.__setitem__("key", [None, "k", 9]),
        lambda c: c.__setitem__("nic", [0, 1, 0]),  # ints are not bools
        lambda c: c.__setitem__("nic", [True]),  # too short
    ],
)
def test_malformed_flow_columns_are_protocol_errors(change: object) -> None:
    cols = flows_to_columns(FLOWS)
    change(cols)  # type: ignore[operator]
    with pytest.raises(ProtocolError):
        flows_from_columns(cols)


def test_malformed_completion_columns_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        completions_from_columns([1, 2])
    cols = completions_to_columns([Completion(1, 0, 100, 4096, 1, 2, "a")])
    cols["lost"] = [[5, [[0, 1]]]]  # a row that does not exist
    with pytest.raises(ProtocolError):
        completions_from_columns(cols)
