"""A decomposition worker's reply nests the completion columns a driver's books do not read in one msgpack bin,
`rest` (issue 38, item 2): the driver decodes ids and ends and copies the bin, unpacked when the objects are built.
Every completion must be the one the worker sent; a malformed reply must raise ProtocolError, at once or when
built."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from bridge.columns import completion_columns, completions_to_columns
from bridge.errors import ProtocolError
from bridge.protocol import decode, encode
from phantora.netsim.base import Completion

SENT = [
    Completion(7, 0, 100, 1000, 1, 4, "a"),
    Completion(3, 5, 100, 2000, 2, 5, "b", ((0, 64), (512, 64))),
    Completion(9, 10, 250, 3000, 3, 6, "c"),
]


def _nested(**change: Any) -> dict[str, Any]:
    """SENT's nested columns, with `change` made to the columns in `rest`."""
    cols = completions_to_columns(SENT)
    rest = {k: v for k, v in cols.items() if k not in ("id", "end")}
    return {"id": cols["id"], "end": cols["end"], "rest": msgpack.packb({**rest, **change}, use_bin_type=True)}


def test_a_reply_carries_ids_and_ends_and_the_rest_as_one_bin() -> None:
    cols = completions_to_columns(SENT, nested=True)
    assert sorted(cols) == ["end", "id", "rest"] and type(cols["rest"]) is bytes
    raw = encode("posted", 250, now=250, in_flight=0, next=None, done=cols, bounds=[], cpu=0.1, wall=0.2)
    got = completion_columns(decode(raw)["done"])
    assert got.ids == [7, 3, 9] and got.ends == [100, 100, 250]
    assert got.built() == SENT and got.built([1])[0].lost_bytes == 128
    assert completions_to_columns(got) == completions_to_columns(SENT)  # (out again, flat)
    assert completions_to_columns(completion_columns(_nested()), nested=True) == cols


def test_a_malformed_rest_raises_when_built() -> None:
    with pytest.raises(ProtocolError, match="'rest' must be a bin"):
        completion_columns({**_nested(), "rest": [1]})
    with pytest.raises(ProtocolError, match="bad column 'end'"):
        completion_columns({**_nested(), "end": [100, None, 250]})
    for rest, match in (
        (b"\xc1", "'rest' is not msgpack"),
        (msgpack.packb([1, 2]), "'rest' must hold a map"),
        (_nested(size=[1, 2])["rest"], "different lengths"),
        (completions_to_columns(SENT[:2], nested=True)["rest"], "another length"),
        (_nested(src=[1, "x", 3])["rest"], "bad column 'src'"),
        (_nested(tag=["a", 5, "c"])["rest"], "'tag' must hold strings"),
        (_nested(lost=[[7, [[0, 64]]]])["rest"], "bad lost ranges"),
    ):
        late = completion_columns({**_nested(), "rest": rest})
        assert late.ids == [7, 3, 9]  # (the books' columns: read at once)
        with pytest.raises(ProtocolError, match=match):
            late.built()
    missing = msgpack.packb({"start": [0, 5, 10]}, use_bin_type=True)
    with pytest.raises(ProtocolError, match="missing or bad column"):
        completion_columns({**_nested(), "rest": missing}).built()
