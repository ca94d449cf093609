"""The wire protocol: round trips, and clear rejection of malformed, oversized, versioned and unknown messages."""

from __future__ import annotations

import msgpack
import pytest

from bridge.errors import ProtocolError
from bridge.protocol import (
    SCHEMA,
    VERSION,
    completion_from_wire,
    completion_to_wire,
    decode,
    encode,
    flow_from_wire,
    flow_to_wire,
)
from phantora.netsim.base import Completion, Flow


def test_round_trip_keeps_type_time_and_fields() -> None:
    raw = encode("coll", 123_456_789_012, h=3, group=[0, 2, 5], seq=9, kind="all_gather", nbytes=1 << 40,
                 dtype="bf16", root=None, name="x", algo={"channels": 4})  # fmt: skip
    msg = decode(raw)
    assert msg.type == "coll" and msg.t == 123_456_789_012
    assert msg["group"] == [0, 2, 5] and msg["nbytes"] == 1 << 40 and msg["algo"] == {"channels": 4}


def test_every_message_type_has_a_schema_and_encodes() -> None:
    assert {"hello", "clock", "coll", "p2p", "submit", "advance", "completions", "error", "shutdown"} <= set(SCHEMA)
    assert decode(encode("heartbeat", 5)).t == 5


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"\xc1\xc1garbage", "malformed"),
        (msgpack.packb([1, 2, 3]), "malformed"),
        (msgpack.packb({"v": VERSION, "type": "wait", "t": 0}), "malformed"),  # missing handles
        (msgpack.packb({"v": VERSION, "type": "wait", "t": 0, "handles": ["a"], "until": 0}), "malformed"),
        (msgpack.packb({"v": VERSION, "type": "heartbeat", "t": 1.5}), "malformed"),  # float time
        (msgpack.packb({"v": VERSION + 1, "type": "heartbeat", "t": 0}), "version"),
        (msgpack.packb({"v": VERSION, "type": "teleport", "t": 0}), "unknown-type"),
    ],
)
def test_bad_messages_are_rejected_with_a_code(raw: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode(raw)
    assert err.value.code == code
    assert str(err.value)


def test_version_mismatch_names_both_versions() -> None:
    with pytest.raises(ProtocolError, match=rf"version 99 .* speaks {VERSION}"):
        decode(msgpack.packb({"v": 99, "type": "heartbeat", "t": 0}))


def test_oversized_message_is_rejected_before_parsing() -> None:
    raw = encode("finish", 0, results={"blob": "x" * 5000}, cpu_s=0.0)
    with pytest.raises(ProtocolError) as err:
        decode(raw, max_bytes=1000)
    assert err.value.code == "oversized" and str(len(raw)) in str(err.value)


def test_encode_refuses_missing_fields_and_float_times() -> None:
    with pytest.raises(ValueError):
        encode("wait", 0, handles=[1])
    with pytest.raises(ValueError):
        encode("heartbeat", 0.5)  # type: ignore[arg-type]


def test_flow_and_completion_wire_round_trip() -> None:
    f = Flow(7, 1, 2, 4096, (3, 4), 250, "c0/ring", 3, (1 << 63) + 5)
    assert flow_from_wire(msgpack.unpackb(msgpack.packb(flow_to_wire(f)))) == f
    c = Completion(7, 10, 20, 4096, 1, 2, "t")
    assert completion_from_wire(completion_to_wire(c)) == c
    with pytest.raises(ProtocolError):
        flow_from_wire([1, 2, 3])
