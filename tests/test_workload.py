"""The workload format: parsing, expansion of `repeat`, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.workload import load_workload, parse_ranks, workload_from_dict, workload_to_dict

ROOT = Path(__file__).resolve().parents[1]


def test_parse_ranks_forms() -> None:
    assert parse_ranks("all", 4, "x") == (0, 1, 2, 3)
    assert parse_ranks("0-2,8-9", None, "x") == (0, 1, 2, 8, 9)
    assert parse_ranks([3, 1], None, "x") == (3, 1)
    with pytest.raises(InputError, match="bad rank range"):
        parse_ranks("3-1", None, "x")
    with pytest.raises(InputError, match="needs a topology"):
        parse_ranks("all", None, "x")


def test_repeat_expands_into_a_chain_with_a_cadence() -> None:
    wl = workload_from_dict(
        {
            "op": [
                {"name": "b", "kind": "all_reduce", "bytes": "1MiB", "ranks": "0-3", "at": "1us", "every": "2us"}
                | {"repeat": 3}
            ]
        }
    )
    assert [op.name for op in wl.ops] == ["b.0", "b.1", "b.2"]
    assert [op.at_ns for op in wl.ops] == [1000, 3000, 5000]
    assert [op.after for op in wl.ops] == [(), ("b.0",), ("b.1",)]
    assert wl.ops[0].coll.nbytes == 2**20


def test_defaults_apply_and_round_trip() -> None:
    data = {
        "name": "w",
        "defaults": {"ranks": "0-1", "dtype": "fp32"},
        "op": [
            {"name": "a", "kind": "all_gather", "bytes": 4096},
            {"name": "b", "kind": "send_recv", "src": 0, "dst": 1, "bytes": 8, "after": "a", "gap": "3us"},
        ],
    }
    wl = workload_from_dict(data)
    assert wl.ops[0].coll.dtype == "fp32" and wl.ops[0].coll.ranks == (0, 1)
    assert wl.ops[1].after == ("a",) and wl.ops[1].gap_ns == 3000
    again = workload_from_dict(workload_to_dict(wl))
    assert again.ops == wl.ops


@pytest.mark.parametrize(
    ("op", "field", "message"),
    [
        ({"kind": "all_reduce", "bytes": -5}, "bytes", "size|>= 0"),
        ({"kind": "warp_drive", "bytes": 5}, "kind", "unknown collective kind"),
        ({"kind": "all_reduce", "bytes": 5, "colour": "red"}, "colour", "unknown field"),
        ({"kind": "all_reduce", "bytes": 5, "ranks": "0-99"}, "ranks", "outside the topology"),
        ({"kind": "all_reduce", "bytes": 5, "after": ["nope"]}, "after", "not an earlier op"),
        ({"kind": "send_recv", "bytes": 5}, "src", "needs 'src' and 'dst'"),
        ({"kind": "all_reduce", "bytes": "5 parsecs"}, None, "unknown size unit"),
    ],
)
def test_bad_ops_name_the_field(tmp_path: Path, op: dict, field: str | None, message: str) -> None:
    import json

    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"op": [op]}))
    with pytest.raises(InputError, match=message) as info:
        load_workload(path, world=8)
    assert str(path) in str(info.value)
    if field is not None:
        assert info.value.field == field


def test_unparsable_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[[op]\nkind=")
    with pytest.raises(InputError, match="cannot parse") as info:
        load_workload(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["ddp_buckets", "fsdp_layers", "moe_alltoall"])
def test_shipped_workloads_load(name: str) -> None:
    wl = load_workload(ROOT / "workloads" / f"{name}.toml", world=16)
    assert wl.ops and all(op.coll.ranks == tuple(range(16)) for op in wl.ops)


def test_an_op_may_name_its_collective_model_and_protocol() -> None:
    """docs/workload.md lists `model` and `protocol` among an op's fields; they reach the op's own options."""
    wl = workload_from_dict(
        {"op": [{"name": "a2a", "kind": "all_to_all", "bytes": "1MiB", "model": "ideal", "protocol": "Simple"}]},
        world=8,
    )
    assert wl.ops[0].algo == {"model": "ideal", "protocol": "Simple"}
