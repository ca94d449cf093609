"""Chakra ET export: the wire format of et_def.proto (checked with a decoder written here), and a round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("google.protobuf")

from phantora.egraph import ProgramBuilder, build_graph, replay_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine


def wire(data: bytes) -> list[tuple[int, int, object]]:
    """Protobuf wire decoding: (field number, wire type, value) triples (varints and length-delimited only)."""
    out, pos = [], 0

    def varint() -> int:
        nonlocal pos
        val, shift = 0, 0
        while True:
            b = data[pos]
            pos += 1
            val |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return val

    while pos < len(data):
        key = varint()
        num, wt = key >> 3, key & 7
        if wt == 0:
            out.append((num, wt, varint()))
        elif wt == 2:
            n = varint()
            out.append((num, wt, data[pos : pos + n]))
            pos += n
        else:
            raise AssertionError(f"unexpected wire type {wt}")
    return out


def messages(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size, shift = 0, 0
        while True:
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        out.append(data[pos : pos + size])
        pos += size
    return out


def sample_graph():
    bs = []
    for r in range(4):
        b = ProgramBuilder(r)
        f = b.compute("fwd", 123_456)
        h = b.collective("all_reduce", range(4), 3 * 2**20, dtype="fp32")
        b.compute("bwd", 50_000)
        b.wait([h])
        peer = r ^ 1
        s = b.p2p(peer, r % 2 == 0, 2**20, tag=3)
        b.wait([s], stream=1, deps=[f])
        b.step()
        bs.append(b)
    return build_graph(bs)


def test_et_files_follow_the_chakra_schema(tmp_path: Path) -> None:
    paths = export_chakra(sample_graph(), tmp_path)
    assert [p.name for p in paths] == [f"phantora.{r}.et" for r in range(4)] + ["phantora.comm_groups.json"]
    msgs = messages(paths[0].read_bytes())
    meta = wire(msgs[0])
    assert (1, 2, b"0.0.4") in meta  # GlobalMetadata.version = 1
    nodes = [wire(m) for m in msgs[1:]]
    assert len(nodes) == 7

    def field(node, num):
        return [v for n, _, v in node if n == num]

    def attrs(node) -> dict[str, object]:
        out = {}
        for raw in field(node, 10):  # Node.attr = 10, AttributeProto.name = 1
            a = wire(raw)
            name = field(a, 1)[0].decode()
            out[name] = next(v for n, _, v in a if n != 1)
        return out

    fwd, ar, bwd, wait = nodes[:4]
    assert field(fwd, 1) == [] and field(fwd, 3) == [4]  # id 0 (default, omitted); type COMP_NODE = 4
    assert field(fwd, 7) == [123]  # duration_micros
    assert attrs(fwd)["duration_ns"] == 123_456
    assert field(ar, 3) == [7]  # COMM_COLL_NODE
    a = attrs(ar)
    assert a["comm_type"] == 0 and a["comm_size"] == 3 * 2**20 and a["pg_name"] == b"0"  # ALL_REDUCE
    assert field(bwd, 5) == [bytes([0])]  # data_deps (packed): bwd follows fwd, not the collective
    assert set(field(wait, 5)[0]) == {1, 2}  # the wait depends on the stream and on the collective
    groups = json.loads(paths[-1].read_text())
    assert groups["0"] == [0, 1, 2, 3]


def test_round_trip_replays_identically(tmp_path: Path) -> None:
    g = sample_graph()
    export_chakra(g, tmp_path)
    back = read_chakra(tmp_path)
    assert [p.nodes for p in back.programs] == [p.nodes for p in g.programs]
    topo = leaf_spine(1, 4, 0, nic_rate="100Gbps", latency="1us")
    want = replay_graph(g, topo, FlowSimulator(topo))
    got = replay_graph(back, topo, FlowSimulator(topo))
    assert got.rank_step_ends_ns == want.rank_step_ends_ns and got.rank_end_ns == want.rank_end_ns


def test_truncated_et_file_is_reported(tmp_path: Path) -> None:
    paths = export_chakra(sample_graph(), tmp_path)
    paths[1].write_bytes(paths[1].read_bytes()[:-5])
    with pytest.raises(InputError, match=rf"{paths[1]}: truncated message"):
        read_chakra(tmp_path)


def test_a_dep_on_a_later_node_is_reported(tmp_path: Path) -> None:
    """A data dep past the node (here past the file's end) is a one-line error naming the file and the node."""
    from phantora.egraph.chakra import _messages, _varint

    paths = export_chakra(sample_graph(), tmp_path)
    data = paths[0].read_bytes()
    raw = messages(data)
    node = _messages()["Node"].FromString(raw[2])
    node.data_deps.append(99)
    raw[2] = node.SerializeToString()
    paths[0].write_bytes(b"".join(_varint(len(m)) + m for m in raw))
    with pytest.raises(InputError, match=rf"^{paths[0]}: node 1 depends on node 99, which is not an earlier node$"):
        read_chakra(tmp_path)


def test_an_explicit_dep_on_a_collective_stays_a_dep_and_after_stays_after(tmp_path: Path) -> None:
    """A collective with an explicit dep on the one before (its issue) and a transfer after it (its completion):
    both are data deps in Chakra; read back, each is what it was, node for node."""
    bs = []
    for r in range(2):
        b = ProgramBuilder(r)
        a = b.collective("all_reduce", range(2), 2**20)
        b.collective("all_reduce", range(2), 2**20, deps=[a])
        b.p2p(r ^ 1, r == 0, 2**20, after=[a])
        b.step()
        bs.append(b)
    g = build_graph(bs)
    export_chakra(g, tmp_path)
    back = read_chakra(tmp_path)
    assert back.programs[0].nodes[1].deps == (0,) and back.programs[0].nodes[1].after == ()
    assert back.programs[0].nodes[2].deps == () and back.programs[0].nodes[2].after == (0,)
    assert [p.nodes for p in back.programs] == [p.nodes for p in g.programs]
