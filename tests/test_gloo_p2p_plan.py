"""A plain gloo group's send or recv of zero network bytes (runtime backend.py `gloo_sync`, P2P.host) is planned
outside the NCCL model, live (session's `HOST_ALGO`) and replayed, through the program file and Chakra.

An NCCL send/recv of 0 bytes is a kernel NCCL launches (collectives/nccl/empty_kernel.py): on one host its LL launch,
the ring's LL base latency (6.6 us). A gloo call is no NCCL kernel: its two ends leave at the later end's issue, as
every gloo call does. Before, the gloo send/recv took the NCCL figure: tests/test_gloo_sync.py's ranks left their
send/recv 6,600 ns after the later entry, at every load.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import tables as T
from phantora.collectives.spec import HOST_ALGO
from phantora.egraph import ProgramBuilder, build_graph, replay_graph
from phantora.egraph.format import P2P, Program
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology

LL_LAUNCH_NS = round(T.BASE_LAT["ring"][T.PROTOCOLS.index("LL")] * 1000)  # 6,600 ns
EARLY, LATE = 100_000, 300_000  # the two ends' entries


def test_an_empty_send_recv_is_nccls_launch_but_a_gloo_ones_no_flow() -> None:
    topo = load_topology("testbed16")
    coll = Collective("send_recv", (0, 1), 0)
    nccl = decompose(coll, topo, AlgoOptions())
    assert nccl.flows and {f.delay_ns for f in nccl.flows if not f.deps} == {LL_LAUNCH_NS}
    gloo = decompose(coll, topo, AlgoOptions(**HOST_ALGO))
    assert gloo.flows == [] and not any(gloo.rank_last.get(r) for r in (0, 1))


def _graph(host: bool):  # type: ignore[no-untyped-def]
    """Rank 0 receives 0 bytes from rank 1 at EARLY, rank 1 sends at LATE; each then computes 1 us."""
    bs = []
    for r, entry in ((0, EARLY), (1, LATE)):
        b = ProgramBuilder(r)
        b.compute("before", entry)
        h = b.p2p(1 - r, r == 1, 0, host=host)
        b.wait([h])
        b.compute("after", 1_000)
        bs.append(b)
    return build_graph(bs)


@pytest.mark.parametrize("host", [True, False])
def test_a_gloo_transfer_replays_to_the_later_entry_and_an_nccl_one_to_its_launch(host: bool, tmp_path: Path) -> None:
    topo = load_topology("testbed16")
    ends = replay_graph(_graph(host), topo, FlowSimulator(topo)).rank_end_ns
    assert list(ends) == [LATE + (0 if host else LL_LAUNCH_NS) + 1_000] * 2
    pytest.importorskip("google.protobuf")
    from phantora.egraph.chakra import export_chakra, read_chakra

    export_chakra(_graph(host), tmp_path)
    back = read_chakra(tmp_path)
    assert [n.host for p in back.programs for n in p.nodes if isinstance(n, P2P)] == [host, host]
    assert list(replay_graph(back, topo, FlowSimulator(topo)).rank_end_ns) == list(ends)


def test_the_gloo_mark_survives_the_program_file_and_a_bad_one_is_named() -> None:
    b = ProgramBuilder(0)
    b.p2p(1, True, 0, host=True)
    b.p2p(1, True, 4096)
    prog, _ = b.build()
    assert [n.host for n in Program.decode(prog.encode()).nodes if isinstance(n, P2P)] == [True, False]
    doc = msgpack.unpackb(prog.encode(), raw=False)
    assert doc["host_of"] == [0]
    del doc["host_of"]  # a program without gloo transfers has no such key: its bytes are as before
    assert not any(n.host for n in Program.decode(msgpack.packb(doc)).nodes if isinstance(n, P2P))
    doc["host_of"] = [5]
    with pytest.raises(InputError, match="host_of entry 5") as exc:
        Program.decode(msgpack.packb(doc), "p0.msgpack")
    assert exc.value.field == "host_of"
