"""A recording carries the stream order the live coordinator ran by, and its replay honours it.

Two ranks on tests/test_bridge_core.py's star (100 Gb/s, 1 us links), ideal collectives. Each issues at 0: A, a
2-rank all-reduce on the group's stream 7 (sync, on a side CUDA stream); B, a send 0 -> 1 of S bytes on the pair's
stream 9 after A (its CUDA stream waited for A); C, the next all-reduce on stream 7 (after A by the stream). Live,
B starts when A ends (T_AR), beside C; replayed, the recording gives the live times exactly. A recording
without the order (issued on no stream, as before) replays B from 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.core import CoordinatorCore
from bridge.protocol import INF_NS, decode, encode
from phantora.collectives.spec import AlgoOptions
from phantora.egraph import GraphRecorder, finalize_recording, load, replay_graph
from phantora.egraph.format import P2P, Coll
from phantora.egraph.live import _RecorderListener
from phantora.netsim.flow import FlowSimulator
from phantora.runtime.session import Issued
from tests.test_bridge_core import ring_allreduce_ns, transfer_ns
from tests.test_egraph_replay import star

S = 8 * 2**20
IDEAL = AlgoOptions(model="ideal")


def _live_and_recorded(directory: Path, ordered: bool) -> list[int]:
    """Run the three calls through the coordinator, recording both ranks; return each rank's step end."""
    topo = star(2)
    inbox: dict[int, list[Any]] = {0: [], 1: []}
    core = CoordinatorCore(FlowSimulator(topo), topo, 2, window_ns=0, algo=IDEAL,
                           send=lambda r, raw: inbox[r].append(decode(raw)))  # fmt: skip
    recs = [_RecorderListener(GraphRecorder(r, 2), directory) for r in (0, 1)]

    clock = [0, 0]

    def msg(r: int, type_: str, **fields: Any) -> None:
        core.on_message(r, decode(encode(type_, clock[r], **fields)))

    for r in (0, 1):
        order = (lambda **o: o) if ordered else (lambda **o: {})
        a = order(stream=7)
        msg(r, "coll", h=1, group=[0, 1], seq=0, kind="all_reduce", nbytes=S, dtype="bf16", root=None, name="A",
            algo=None, **a)  # fmt: skip
        recs[r].on_issue(Issued(1, "all_reduce", 0, S, 0, (0, 1), "bf16", None, **a))
        b = order(stream=9, after=(1,))
        msg(r, "p2p", h=2, peer=1 - r, send=r == 0, tag=0, seq=0, nbytes=S, name="B",
            **{k: list(v) if k == "after" else v for k, v in b.items()})  # fmt: skip
        recs[r].on_issue(Issued(2, "send" if r == 0 else "recv", 0, S, 0, peer=1 - r, tag=0, **b))
        msg(r, "coll", h=3, group=[0, 1], seq=1, kind="all_reduce", nbytes=S, dtype="bf16", root=None, name="C",
            algo=None, **a)  # fmt: skip
        recs[r].on_issue(Issued(3, "all_reduce", 1, S, 0, (0, 1), "bf16", None, **a))
    done: dict[int, dict[int, int]] = {0: {}, 1: {}}
    for h in (1, 2, 3):
        for r in (0, 1):
            msg(r, "wait", handles=[h], until=INF_NS)
        core.progress()
        for r in (0, 1):
            done[r].update({m["h"]: m["t_done"] for m in inbox[r] if m.type == "result" and m["h"] is not None})
            inbox[r].clear()
            clock[r] = max(clock[r], done[r][h])  # the compute lane joins it
            recs[r].on_wait([h], done[r][h])
    ends = []
    for r in (0, 1):
        end = clock[r]
        recs[r].on_step(0, end)
        recs[r].on_finish(end)
        ends.append(end)
    spans = {rec.name: (rec.t_start, rec.end_ns) for rec in core.records}
    ar, t = ring_allreduce_ns(S, 2), transfer_ns(S)
    if ordered:  # A alone, then B beside C from T_AR on (sharing the link)
        assert spans["A"] == (0, ar) and spans["B"][0] == spans["C"][0] == ar and spans["B"][1] >= ar + t
    else:
        assert spans["A"][0] == spans["B"][0] == spans["C"][0] == 0
    finalize_recording(directory, meta={"topology": topo.name, "network": "flow"})
    return ends


def test_a_recording_replays_with_the_live_runs_stream_order(tmp_path: Path) -> None:
    live = _live_and_recorded(tmp_path / "trace", ordered=True)
    graph = load(tmp_path / "trace")
    prog = graph.program_of(0)
    colls = [i for i, n in enumerate(prog.nodes) if isinstance(n, (Coll, P2P))]
    assert [prog.nodes[i].after for i in colls] == [(), (colls[0],), (colls[0],)]  # B after A; C after A (stream 7)
    topo = star(2)
    res = replay_graph(graph, topo, FlowSimulator(topo), IDEAL)
    assert [ends[0] for ends in res.rank_step_ends_ns] == live


def test_without_the_order_the_replay_overlaps_what_the_live_run_serialised(tmp_path: Path) -> None:
    """The control: the same calls on no stream run side by side, live and replayed alike (B from 0)."""
    ordered = _live_and_recorded(tmp_path / "ordered", ordered=True)
    loose = _live_and_recorded(tmp_path / "loose", ordered=False)
    topo = star(2)
    res = replay_graph(load(tmp_path / "loose"), topo, FlowSimulator(topo), IDEAL)
    assert [ends[0] for ends in res.rank_step_ends_ns] == loose
    assert max(loose) < max(ordered)


def test_after_round_trips_and_a_bad_one_is_named() -> None:
    """`after` is stored as its own type codes (5: a collective with it, 6: a transfer with it), appended to the
    stable codes, so graphs without it read as before; one that names a later node is refused, naming the node."""
    import msgpack
    import pytest

    from phantora.egraph.format import Program
    from phantora.errors import InputError

    prog = Program([Coll(0, 0, "all_reduce", 64, "bf16", None, 0), P2P(0, 1, True, 0, 64, 0, (), (0,)),
                    Coll(0, 0, "all_reduce", 64, "bf16", None, 1, (), (0, 1))])  # fmt: skip
    rows = msgpack.unpackb(prog.encode())["nodes"]
    assert [r[0] for r in rows] == [1, 6, 5]
    assert Program.decode(prog.encode()) == prog
    bad = msgpack.packb({"v": 1, "names": [], "nodes": [[5, 0, 0, 0, 64, 0, -1, 0, [1]]]})
    with pytest.raises(InputError, match=r"nodes\[0\]"):
        Program.decode(bad, "p0.msgpack")


def test_the_order_survives_a_chakra_round_trip(tmp_path: Path) -> None:
    """Exported, `after` becomes data deps of the comm node (Chakra issues a comm node once its deps completed);
    read back, they are `after` again, and the graph replays with the live times."""
    import pytest

    pytest.importorskip("google.protobuf")
    from phantora.egraph.chakra import export_chakra, read_chakra

    live = _live_and_recorded(tmp_path / "trace", ordered=True)
    graph = load(tmp_path / "trace")
    export_chakra(graph, tmp_path / "et")
    back = read_chakra(tmp_path / "et")
    assert back.program_of(0).nodes == graph.program_of(0).nodes
    topo = star(2)
    res = replay_graph(back, topo, FlowSimulator(topo), IDEAL)
    assert [ends[0] for ends in res.rank_step_ends_ns] == live
