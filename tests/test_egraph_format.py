"""The graph format: deduplication of identical ranks, the recorder hook, and clear errors on bad files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgpack
import pytest

from phantora.egraph import GraphRecorder, ProgramBuilder, build_graph, finalize_recording, load, save
from phantora.egraph.format import INDEX, Coll, Compute, Program, Step, Wait, dir_size_bytes
from phantora.errors import InputError


def ddp_graph(world: int, layers: int = 200):
    """A DDP-like step with `layers` compute ops and a bucket all-reduce every 10 layers."""
    bs = []
    for r in range(world):
        b = ProgramBuilder(r)
        hs = []
        for i in range(layers):
            b.compute("aten::mm" if i % 2 else "aten::gelu", 1000 + 37 * i)
            if i % 10 == 9:
                hs.append(b.collective("all_reduce", range(world), 25 * 2**20))
        b.wait(hs)
        b.compute("optimizer", 5000)
        b.step()
        bs.append(b)
    return build_graph(bs, meta={"model": "toy"})


def test_identical_ranks_are_stored_once_and_size_grows_sublinearly(tmp_path: Path) -> None:
    sizes, program_bytes = {}, 0
    for world in (8, 64, 256):
        g = ddp_graph(world, layers=100)
        assert len(g.programs) == 1 and len(g.groups) == 1
        save(g, tmp_path / f"w{world}")
        sizes[world] = dir_size_bytes(tmp_path / f"w{world}")
        program_bytes = len(g.programs[0].encode())
    # 32x the ranks: each extra rank costs a few bytes of index (its binding and its place in the group), not a
    # program; storing every rank's program would take world x program bytes.
    assert (sizes[256] - sizes[8]) / (256 - 8) < 16
    assert sizes[256] < 256 * program_bytes / 25
    g = load(tmp_path / "w64")
    assert g.world == 64 and g.num_nodes() == 64 * len(g.programs[0].nodes)
    assert g.meta == {"model": "toy"}


def test_tp_ranks_share_a_program_through_slots(tmp_path: Path) -> None:
    bs = []
    for r in range(8):
        b = ProgramBuilder(r)
        h = b.collective("all_reduce", [r - r % 2, r - r % 2 + 1], 4096)
        b.wait([h])
        h = b.collective("all_gather", range(r % 2, 8, 2), 8192)
        b.wait([h])
        b.step()
        bs.append(b)
    g = build_graph(bs)
    assert len(g.programs) == 1
    assert g.group_of(5, 0) == (4, 5) and g.group_of(5, 1) == (1, 3, 5, 7)
    save(g, tmp_path / "g")
    assert load(tmp_path / "g").ranks == g.ranks


def test_program_round_trip_keeps_every_field() -> None:
    b = ProgramBuilder(1)
    c = b.compute("k", 17, stream=2)
    h = b.collective("broadcast", [3, 1, 0], 1000, dtype="fp32", root=0, stream=1, deps=[c])
    s = b.p2p(0, True, 64, tag=5)
    b.wait([h, s], stream=2)
    b.step(7, stream=2)
    prog, groups = b.build()
    back = Program.decode(prog.encode())
    assert back.nodes == prog.nodes
    assert groups == [(3, 1, 0), (1, 0)]
    assert isinstance(back.nodes[1], Coll) and back.nodes[1].root == 0 and back.nodes[1].deps == (0,)


def test_recorder_follows_the_runtime_clock(tmp_path: Path) -> None:
    """Ops, an issue, a wait that stalls, a step that joins an unwaited collective; a gap becomes idle."""
    rec = GraphRecorder(0, world=2)
    rec.compute("aten::mm", 0, 100)
    rec.collective(1, [0, 1], 0, "all_reduce", 4096, "bf16", None, 100)
    rec.compute("aten::add", 100, 50)
    rec.wait(1, 400)  # the compute lane stalled until 400
    rec.wait(1, 400)  # a second Work.wait() adds nothing
    rec.compute("aten::mm", 400, 100)
    rec.collective(2, [0, 1], 1, "all_gather", 8192, "bf16", None, 500)
    rec.compute("aten::mm", 530, 10)  # 30 ns the recorder was not told about
    rec.step(0, 900)
    rec.finish(tmp_path)
    nodes = rec.program()[0].nodes
    assert [type(n).__name__ for n in nodes] == [
        "Compute", "Coll", "Compute", "Wait", "Compute", "Coll", "Compute", "Compute", "Wait", "Step"
    ]  # fmt: skip
    assert nodes[6] == Compute(0, "idle", 30)
    assert isinstance(nodes[8], Wait) and nodes[8].refs == (5,)
    assert rec.idle_ns == 30 and rec.step_ends == [900]
    part = msgpack.unpackb((tmp_path / "parts" / "rank0.msgpack").read_bytes())
    assert part["rank"] == 0 and part["step_ends_ns"] == [900]


def test_finalize_merges_parts_and_removes_them(tmp_path: Path) -> None:
    for r in range(3):
        rec = GraphRecorder(r, 3)
        rec.compute("x", 0, 10 * (r + 1))
        rec.step(0, 10 * (r + 1))
        rec.finish(tmp_path)
    g = finalize_recording(tmp_path, meta={"network": "flow"})
    assert not (tmp_path / "parts").exists()
    assert len(g.programs) == 3 and g.recorded["step_ends_ns"] == [[10], [20], [30]]
    assert g.recorded_step_times() == [30]
    assert load(tmp_path).recorded == g.recorded


def test_recorder_rejects_unknown_handles() -> None:
    rec = GraphRecorder(0)
    with pytest.raises(Exception, match="handle 9"):
        rec.wait(9, 0)


# ----- bad files ------------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path) -> Path:
    save(ddp_graph(4, layers=20), tmp_path / "g")
    return tmp_path / "g"


def test_truncated_index_names_the_file(saved: Path) -> None:
    idx = saved / INDEX
    idx.write_text(idx.read_text()[:50])
    with pytest.raises(InputError, match=rf"{idx}.*corrupt or truncated"):
        load(saved)


def test_version_mismatch_names_the_field(saved: Path) -> None:
    idx = saved / INDEX
    data = json.loads(idx.read_text())
    data["version"] = 99
    idx.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"field 'version'.*version 99.*reads version 1"):
        load(saved)


def test_truncated_program_is_caught_by_its_checksum(saved: Path) -> None:
    prog = saved / "programs" / "p0.msgpack"
    prog.write_bytes(prog.read_bytes()[:-10])
    with pytest.raises(InputError, match=rf"{prog}.*SHA-256"):
        load(saved)


def test_bad_node_in_a_program_names_the_node(saved: Path, tmp_path: Path) -> None:
    prog = Program([Compute(0, "a", 5), Wait(0, (0,)), Step(0, 0)])  # a wait that names a compute node
    with pytest.raises(InputError, match=r"field 'nodes\[1\]'.*not an earlier collective"):
        Program.decode(prog.encode(), "p.msgpack")
    bad = msgpack.packb({"v": 1, "names": ["a"], "nodes": [[0, 0, 5, 10]]})  # name index 5 does not exist
    with pytest.raises(InputError, match=r"p.msgpack: field 'nodes\[0\]'"):
        Program.decode(bad, "p.msgpack")
    with pytest.raises(InputError, match="not a valid program file"):
        Program.decode(b"\xc1garbage", "p.msgpack")


def test_not_a_graph_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not an execution-graph directory"):
        load(tmp_path)
    (tmp_path / INDEX).write_text('{"format": "something-else"}')
    with pytest.raises(InputError, match="field 'format'"):
        load(tmp_path)


def test_binding_outside_the_world_is_rejected(saved: Path) -> None:
    idx = saved / INDEX
    data = json.loads(idx.read_text())
    data["groups"][0] = [0, 1, 2, 9]
    idx.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"field 'groups\[0\]'"):
        load(saved)


def _first_bad_node(graph, rank: int) -> int | None:
    """The first node of `rank`'s program whose group does not hold the rank, read node by node."""
    for i, n in enumerate(graph.program_of(rank).nodes):
        if isinstance(n, Coll) and rank not in graph.group_of(rank, n.slot):
            return i
    return None


@pytest.mark.parametrize("slot", [0, 1])
def test_a_bad_binding_names_the_first_node_that_uses_it(slot: int) -> None:
    """The check reads each program once, not once a rank: a rank bound to a group without it still names the
    first node of its program on that slot (node by node, the first bad one)."""
    bs = []
    for r in range(8):
        b = ProgramBuilder(r)
        b.compute("a", 100)
        for _ in range(3):  # slot 0: the pair, slot 1: the stride-2 group, in turn
            b.wait([b.collective("all_reduce", [r - r % 2, r - r % 2 + 1], 4096)])
            b.wait([b.collective("all_gather", range(r % 2, 8, 2), 8192)])
        b.step()
        bs.append(b)
    g = build_graph(bs)
    g.check()
    assert len(g.programs) == 1
    other = g.ranks[4].groups[slot]  # rank 4's pair (4, 5) or its stride-2 group (0, 2, 4, 6)
    assert 3 not in g.groups[other]
    bound = tuple(other if s == slot else x for s, x in enumerate(g.ranks[3].groups))
    g.ranks[3] = dataclasses.replace(g.ranks[3], groups=bound)
    want = _first_bad_node(g, 3)
    assert want == 1 + 2 * slot  # the compute, then each collective with its wait
    with pytest.raises(InputError, match=rf"rank 3 is not in the group .* of its node {want}$"):
        g.check()
