"""A plain gloo group's call of zero network bytes (runtime backend.py `gloo_sync`, Coll/P2P.host) is planned outside
the NCCL model, live (`HOST_ALGO`, collectives/spec.py) and replayed, through the program file and Chakra.

An NCCL send/recv of 0 bytes is a kernel NCCL launches (collectives/nccl/empty_kernel.py): on one host its LL launch,
the ring's LL base latency (6.6 us); so is a collective of count 0 before NCCL 2.20. A gloo call is no NCCL kernel:
its members leave at the latest member's issue. Before, the gloo send/recv took the NCCL figure:
tests/test_gloo_sync.py's ranks left their send/recv 6,600 ns after the later entry, at every load (and its
collectives under PHANTORA_NCCL_VERSION=2.19).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgpack
import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import tables as T
from phantora.collectives.spec import HOST_ALGO
from phantora.egraph import ProgramBuilder, build_graph, replay_graph
from phantora.egraph.format import P2P, Coll, Program
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology

LL_LAUNCH_NS = round(T.BASE_LAT["ring"][T.PROTOCOLS.index("LL")] * 1000)  # 6,600 ns
EARLY, LATE = 100_000, 300_000  # the two ends' entries
OLD_NCCL = (("PHANTORA_NCCL_VERSION", "2.19"),)  # before 2.20 NCCL launches a collective of count 0


def test_an_empty_send_recv_is_nccls_launch_but_a_gloo_ones_no_flow() -> None:
    topo = load_topology("testbed16")
    coll = Collective("send_recv", (0, 1), 0)
    nccl = decompose(coll, topo, AlgoOptions())
    assert nccl.flows and {f.delay_ns for f in nccl.flows if not f.deps} == {LL_LAUNCH_NS}
    gloo = decompose(coll, topo, AlgoOptions(**HOST_ALGO))
    assert gloo.flows == [] and not any(gloo.rank_last.get(r) for r in (0, 1))


def test_an_empty_collective_before_2_20_is_nccls_launch_but_a_gloo_ones_no_flow() -> None:
    topo = load_topology("testbed16")
    coll = Collective("all_reduce", (0, 1), 0)
    old = AlgoOptions(nccl_env=OLD_NCCL)
    assert {f.delay_ns for f in decompose(coll, topo, old).flows} == {LL_LAUNCH_NS}
    assert decompose(coll, topo, dataclasses.replace(old, **HOST_ALGO)).flows == []


def _graph(host: bool, p2p: bool):  # type: ignore[no-untyped-def]
    """Rank 0 enters a call of 0 bytes with rank 1 at EARLY (a receive from it, or an all-reduce), rank 1 at LATE
    (its send, or the all-reduce); each then computes 1 us. Recorded under NCCL 2.19, which launches both."""
    bs = []
    for r, entry in ((0, EARLY), (1, LATE)):
        b = ProgramBuilder(r)
        b.compute("before", entry)
        h = b.p2p(1 - r, r == 1, 0, host=host) if p2p else b.collective("all_reduce", (0, 1), 0, "uint8", host=host)
        b.wait([h])
        b.compute("after", 1_000)
        bs.append(b)
    return build_graph(bs, meta={"algo": {"nccl_env": [list(kv) for kv in OLD_NCCL]}})


@pytest.mark.parametrize("p2p", [True, False])
@pytest.mark.parametrize("host", [True, False])
def test_a_gloo_call_replays_to_the_later_entry_and_an_nccl_one_to_its_launch(
    host: bool, p2p: bool, tmp_path: Path
) -> None:
    topo = load_topology("testbed16")
    ends = replay_graph(_graph(host, p2p), topo, FlowSimulator(topo)).rank_end_ns
    assert list(ends) == [LATE + (0 if host else LL_LAUNCH_NS) + 1_000] * 2
    pytest.importorskip("google.protobuf")
    from phantora.egraph.chakra import export_chakra, read_chakra

    export_chakra(_graph(host, p2p), tmp_path)
    back = read_chakra(tmp_path)
    assert [n.host for p in back.programs for n in p.nodes if isinstance(n, P2P | Coll)] == [host, host]
    assert list(replay_graph(back, topo, FlowSimulator(topo)).rank_end_ns) == list(ends)


def test_the_gloo_mark_survives_the_program_file_and_a_bad_one_is_named() -> None:
    b = ProgramBuilder(0)
    b.p2p(1, True, 0, host=True)
    b.p2p(1, True, 4096)
    b.collective("all_reduce", (0, 1), 0, "uint8", host=True)
    prog, _ = b.build()
    assert [n.host for n in Program.decode(prog.encode()).nodes if isinstance(n, P2P | Coll)] == [True, False, True]
    doc = msgpack.unpackb(prog.encode(), raw=False)
    assert doc["host_of"] == [0, 2]
    del doc["host_of"]  # a program without gloo calls has no such key: its bytes are as before
    assert not any(n.host for n in Program.decode(msgpack.packb(doc)).nodes if isinstance(n, P2P | Coll))
    doc["host_of"] = [5]
    with pytest.raises(InputError, match="host_of entry 5") as exc:
        Program.decode(msgpack.packb(doc), "p0.msgpack")
    assert exc.value.field == "host_of"
