"""The value channel (bridge/values.py, phantora/runtime/object_values.py): torch's object collectives in phantom
mode deliver the exact objects, and their collectives are charged the bytes torch would send.

Closed forms: torch pickles an object with `pickle.Pickler` (the default protocol), so an object's bytes are
`len(pickle.dumps(obj))`; the size exchange is one int64 (8 B) per object and rank.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from bridge.errors import RunFailed
from bridge.protocol import decode, encode
from bridge.values import ValueBoard
from phantora.collectives.mirrors import Mirrors

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "phantom_object_collectives.py"


def test_every_member_reads_every_members_bytes_and_the_entry_is_then_dropped() -> None:
    board = ValueBoard(Mirrors(2, 2))
    board.post(0, [0, 1], 0, b"a")
    board.post(1, [0, 1], 0, b"bb")
    assert board.take(0, [0, 1], 0) == [b"a", b"bb"]
    assert len(board) == 1  # rank 1 has not read yet
    assert board.take(1, [0, 1], 0) == [b"a", b"bb"]
    assert len(board) == 0


def test_a_root_alone_posts_and_the_others_read_none_for_themselves() -> None:
    board = ValueBoard(Mirrors(3, 3))
    board.post(2, [0, 1, 2], 7, b"plan")
    assert [board.take(r, [0, 1, 2], 7) for r in (0, 1, 2)] == [[None, None, b"plan"]] * 3
    assert len(board) == 0


def test_a_send_is_read_once_by_its_receiver() -> None:
    board = ValueBoard(Mirrors(2, 2))
    board.post(0, [0, 1], 0, b"meta", reads=False)
    assert board.take(1, [0, 1], 0) == [b"meta", None]
    assert len(board) == 0


def test_a_mirror_ranks_value_is_its_live_ranks() -> None:
    """4 ranks, 2 live: ranks 2 and 3 mirror 0 and 1 (no process); a group of the 4 reads 0, 1, 0, 1's bytes,
    and the shifted group (2, 3) of (0, 1) meets under the same key as (0, 1)."""
    board = ValueBoard(Mirrors(4, 2))
    board.post(0, [0, 1, 2, 3], 0, b"zero")
    board.post(1, [0, 1, 2, 3], 0, b"one")
    assert board.take(0, [0, 1, 2, 3], 0) == [b"zero", b"one", b"zero", b"one"]
    assert board.take(1, [0, 1, 2, 3], 0) == [b"zero", b"one", b"zero", b"one"]
    assert len(board) == 0
    board.post(0, [0, 1], 1, b"x")
    board.post(1, [2, 3], 1, b"y")  # live rank 1 issues on its shifted group
    assert board.take(1, [2, 3], 1) == [b"x", b"y"]


def test_a_second_post_under_one_key_is_refused() -> None:
    board = ValueBoard(Mirrors(2, 2))
    board.post(0, [0, 1], 0, b"a")
    with pytest.raises(RunFailed, match="posted a value twice"):
        board.post(0, [0, 1], 0, b"a")


def test_the_wire_carries_bytes_as_bytes() -> None:
    raw = bytes(range(256))
    msg = decode(encode("value", 5, group=[0, 1], key=3, data=raw))
    assert msg["data"] == raw and msg["group"] == [0, 1] and msg["key"] == 3
    assert decode(encode("valued", 0, data=[raw, None]))["data"] == [raw, None]


def _bytes(trace: Path, rank: int) -> list[tuple[str, int]]:
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    comm = ("all_gather#", "broadcast#", "gather#", "scatter#", "send#", "recv#")
    return [
        (e["name"].split("#")[0], e["args"]["bytes"])
        for e in events
        if e.get("pid") == rank and e.get("ph") == "X" and str(e.get("name", "")).startswith(comm)
    ]


@pytest.mark.slow
def test_two_phantom_ranks_get_the_exact_objects_and_are_charged_torchs_bytes(tmp_path: Path) -> None:
    """tests/scripts/phantom_object_collectives.py on 2 phantom ranks (about 20 s): every helper delivers the
    objects; each collective in the trace has the closed-form size (the backend's trace counts an all-gather's
    and a gather's or scatter's whole buffer: world x the largest pickled object)."""
    from phantora.launcher import RunConfig, launch

    out = tmp_path / "out"
    launch(RunConfig(str(SCRIPT), [str(tmp_path)], "testbed16", nproc=2, tensors="phantom", out_dir=out, timeout_s=300))
    seen = {r: json.loads((tmp_path / f"objects{r}.json").read_text()) for r in (0, 1)}
    gathered = [{"rank": r, "pad": "x" * (100 * (r + 1))} for r in (0, 1)]
    root_list = [{"plan": [1, 2, 3], "name": "root"}, "second"]
    scattered = [{"to": 0}, {"to": 1, "more": list(range(10))}]
    for r in (0, 1):
        assert seen[r]["all_gather_object"] == gathered
        assert seen[r]["broadcast_object_list"] == root_list
        assert seen[r]["scatter_object_list"] == [scattered[r]]
    assert seen[0]["gather_object"] is None
    assert seen[1]["gather_object"] == [["from", 0], ["from", 1]]
    assert seen[1]["recv_object_list"] == [[{"stage": 0, "shape": [4, 8]}], 0]

    size = [len(pickle.dumps(o)) for o in gathered]
    pairs = [len(pickle.dumps(("from", r))) for r in (0, 1)]
    parts = [len(pickle.dumps(o)) for o in scattered]
    expected = [
        ("all_gather", 2 * 8),
        ("all_gather", 2 * max(size)),
        ("broadcast", 2 * 8),
        ("broadcast", sum(len(pickle.dumps(o)) for o in root_list)),
        ("all_gather", 2 * 8),
        ("gather", 2 * max(pairs)),
        ("broadcast", 8),
        ("scatter", 2 * max(parts)),
        ("scatter", 2 * 8),
    ]
    sent = len(pickle.dumps({"stage": 0, "shape": [4, 8]}))
    assert _bytes(out / "trace.json", 0) == [*expected, ("send", 8), ("send", sent)]
    assert _bytes(out / "trace.json", 1) == [*expected, ("recv", 8), ("recv", sent)]


def test_only_a_phantora_group_takes_the_value_channel() -> None:
    from phantora.runtime import backend, object_values

    class Group:
        def __init__(self, cls: type | None) -> None:
            self.cls = cls

        def _get_backend(self, device: object) -> object:
            if self.cls is None:
                raise RuntimeError("no CPU backend")
            return self.cls  # its class attributes are what is read

    nccl_named = type("Nccl", (), {"getBackendName": lambda _self: "nccl"})  # a real CUDA group's name
    assert object_values._phantora_group(Group(backend.PhantoraProcessGroup))
    assert not object_values._phantora_group(Group(nccl_named))
    assert not object_values._phantora_group(Group(None))
