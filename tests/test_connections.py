"""Connections (`Flow.conn`): NCCL's persistent queue pairs (issue 33). A collective's flows carry the connection
of their (communicator, channel, peer), as NCCL connects once per communicator and keeps the queue pairs; in the
packet engine the flows of one connection are messages on one queue pair, in order, with one CC state that
outlives each message. Checked against closed forms: serial messages at line rate, a DCQCN cut that survives a
short idle and is recovered from after a long one."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.collectives.back_pressure import is_credit
from phantora.collectives.dag import communicator_id, connection_id
from phantora.collectives.decompose import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow
from phantora.topology import rail_optimized
from tests.test_packet_engine import G, star

MB = 1_000_000


def flows_of(kind: str, ranks: tuple[int, ...], nbytes: int, algorithm: str = "ring") -> list[Flow]:
    """The flows of a collective on two 8-GPU hosts with one rail-optimised NIC per GPU."""
    coll = Collective(kind, ranks, nbytes, "bf16")
    return decompose(coll, rail_optimized(hosts=2, gpu="h100"), AlgoOptions(algorithm=algorithm)).flows


def test_a_collectives_flows_carry_one_connection_per_channel_and_peer() -> None:
    flows = flows_of("all_reduce", tuple(range(16)), 64 * MB)
    by_conn: dict[int, set[tuple[int, int, int | None]]] = {}
    for f in flows:
        assert f.conn != 0
        by_conn.setdefault(f.conn, set()).add((f.src, f.dst, f.key))
    # one connection is one (src, dst, channel): its flows share the endpoints and the ECMP key (one QP, one path)
    assert all(len(v) == 1 for v in by_conn.values())
    assert len(by_conn) == len({(f.src, f.dst, f.key) for f in flows})


def test_connections_persist_across_collectives_and_are_per_communicator() -> None:
    world = tuple(range(16))
    first = {f.conn for f in flows_of("all_reduce", world, 8 * MB)}
    again = {f.conn for f in flows_of("all_reduce", world, 32 * MB)}
    gather = {f.conn for f in flows_of("all_gather", world, 32 * MB)}
    assert again <= first or first <= again  # the same ring channels, whatever the size
    assert gather & first  # all-gather runs on the ring's connections
    other = {f.conn for f in flows_of("all_reduce", tuple(range(8, 16)) + tuple(range(8)), 8 * MB)}
    assert not other & first  # another communicator has its own queue pairs
    assert not {f.conn for f in flows_of("all_to_all", world, 8 * MB, "auto")} & first  # p2p has its own
    assert communicator_id("ring", world) != communicator_id("p2p", world)


def test_connection_ids_are_stable_across_processes() -> None:
    """Not Python's salted `hash`: the same id in a process with another hash seed (runs are deterministic)."""
    code = (
        "from phantora.collectives.dag import communicator_id as c, connection_id as k\n"
        "print(k(c('ring', (0, 1)), 3, 4, 1))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=60)
    assert int(out.stdout) == connection_id(communicator_id("ring", (0, 1)), 3, 4, 1) != 0


def test_the_engines_check_the_connection_field() -> None:
    from phantora.netsim.flow import FlowSimulator

    sim = FlowSimulator(star(2))
    with pytest.raises(InputError) as err:
        sim.submit([Flow(1, 0, 1, 1000, conn=1 << 64)], at=0)
    assert err.value.field == "conn"


# ----- the packet engine (ns-3) ------------------------------------------------------------------------------
def ends(done: list[Completion]) -> dict[int, int]:
    return {c.flow_id: c.end_ns for c in done}


def one_ns(size: int, payload: int = 1000, header: int = 48, bps: int = 100 * G) -> float:
    """A flow's wire bytes at line rate, in ns (full packets)."""
    return (size + size // payload * header) * 8 * G / bps


@pytest.mark.ns3
def test_packet_engine_sends_a_connections_messages_in_order(ns3_lib, tmp_path: Path) -> None:
    """Two 1 MB messages on one connection: the first ends as a lone flow, the second after both at line rate (a
    QP sends its work requests in order); on their own queue pairs they interleave and both end after both. The
    runner replays the recorded calls (SetConnection included) to the same FCTs."""
    from phantora.netsim.hpcc_io import format_fct_line
    from phantora.netsim.packet import Ns3Simulator, runner_path
    from phantora.netsim.packet_config import PacketConfig

    got, qps = {}, {}
    calls = tmp_path / "calls.txt"
    for shared in (True, False):
        conn = 77 if shared else 0
        with Ns3Simulator(star(2), PacketConfig(), calls=calls if shared else None) as sim:
            sim.submit([Flow(1, 0, 1, MB, conn=conn), Flow(2, 0, 1, MB, conn=conn)], at=0)
            got[shared] = ends(sim.drain())
            assert sim.finish()
            qps[shared] = sim.stats()["queue_pairs"]
            if shared:
                fct_lines = [format_fct_line(r, with_id=True) for r in sim.fct_records()]
    tail = 1048 * 8 / 100 + 2 * 1000  # the last packet's second hop and both link delays
    assert got[True][1] == pytest.approx(one_ns(MB) + tail, abs=4)
    assert got[True][2] == pytest.approx(2 * one_ns(MB) + tail, abs=4)
    assert got[False][1] == pytest.approx(2 * one_ns(MB) + tail, abs=2 * 84)
    assert (qps[True], qps[False]) == (1, 2)
    assert "SetConnection 1 77" in calls.read_text().splitlines()
    out = tmp_path / "runner"
    proc = subprocess.run([str(runner_path()), str(calls), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "fct.txt").read_text().splitlines() == fct_lines


def _after_incast(conn: bool, idle_ns: int, qp: str = "connection") -> float:
    """DCQCN: two senders incast 4 MB each into one receiver; then sender 0 sends 2 MB alone, `idle_ns` after its
    incast message ended, on the same connection or on a fresh queue pair. The lone message's FCT, ns."""
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig

    c0, c1 = (11, 12) if conn else (0, 0)
    with Ns3Simulator(star(3), PacketConfig(cc="dcqcn", qp=qp)) as sim:
        sim.submit([Flow(1, 0, 2, 4 * MB, conn=c0), Flow(2, 1, 2, 4 * MB, conn=c1)], at=0)
        sim.submit([Flow(3, 0, 2, 2 * MB, deps=(1, 2), delay_ns=idle_ns, conn=c0)], at=0)
        done = {c.flow_id: c for c in sim.drain()}
        assert sim.stats()["cnps"] > 0  # the incast was congested
    return done[3].end_ns - done[3].start_ns


@pytest.mark.ns3
def test_a_dcqcn_cut_outlives_the_message_and_recovers_with_idle_time(ns3_lib) -> None:
    """On a persistent queue pair the next message starts at the rate the incast left it (slower than line rate,
    where a fresh queue pair starts); after an idle long enough for the rate-increase timer to climb back (many
    300 us periods), it runs as a fresh one does: at line rate, within a packet."""
    fresh = _after_incast(conn=False, idle_ns=0)
    line = one_ns(2 * MB) + 1048 * 8 / 100 + 2 * 1000
    assert fresh == pytest.approx(line, abs=100)
    assert _after_incast(conn=True, idle_ns=0) > 1.3 * fresh
    assert _after_incast(conn=True, idle_ns=50_000_000) == pytest.approx(fresh, abs=100)
    assert _after_incast(conn=True, idle_ns=0, qp="flow") == fresh  # the ablation: a queue pair per flow


# ----- NCCL_IB_QPS_PER_CONNECTION and NCCL_IB_SPLIT_DATA_ON_QPS ------------------------------------------------------
def with_env(**env: str) -> AlgoOptions:
    return AlgoOptions(algorithm="ring", protocol="Simple", nccl_env=tuple(env.items()))  # wire bytes = bytes


def ring_flows(opts: AlgoOptions, nbytes: int = 64 * MB) -> list[Flow]:
    topo = rail_optimized(hosts=2, gpu="h100")
    return decompose(Collective("all_reduce", tuple(range(16)), nbytes, "bf16"), topo, opts).flows


def test_a_network_connection_has_nccl_ib_qps_per_connection_queue_pairs_used_in_turn() -> None:
    """net_ib without NCCL_IB_SPLIT_DATA_ON_QPS: message k of a connection goes whole on its queue pair k mod 4,
    each queue pair with its own ECMP key (its own UDP source port); NVLink connections have no queue pairs."""
    topo = rail_optimized(hosts=2, gpu="h100")
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    chunked = dataclasses.replace(with_env(), granularity="chunked", chunk_bytes=MB)
    four_qps = dataclasses.replace(chunked, nccl_env=(("NCCL_IB_QPS_PER_CONNECTION", "4"),))
    one, four = ring_flows(chunked), ring_flows(four_qps)
    assert [f.size for f in one] == [f.size for f in four]  # the same messages
    by_conn: dict[tuple[int, int, int], list[Flow]] = {}
    for f in one:
        if not is_credit(f):  # the messages, not the clear-to-sends going back on their own queue pair
            by_conn.setdefault((f.src, f.dst, f.conn), []).append(f)
    by_id = {f.id: f for f in four}
    net = many = 0
    for (src, dst, _), msgs in by_conn.items():
        qps = [(by_id[m.id].conn, by_id[m.id].key) for m in msgs]
        if host[src] == host[dst]:
            assert len(set(qps)) == 1
            continue
        net += 1
        many += len(msgs) >= 4
        assert len({c for c, _ in qps}) == min(4, len(msgs)) == len({k for _, k in qps})
        assert all(qps[k] == qps[k % 4] for k in range(len(qps)))  # in turn: 0, 1, 2, 3, 0, ...
    assert net > 0 and many > 0


def test_the_queue_pair_counter_runs_on_across_a_communicators_collectives() -> None:
    """NCCL's per-connection message counter lives as long as the communicator: with 4 QPs, a collective that
    follows one of m messages on a connection starts that connection on QP m mod 4, not on QP 0 again. An all-gather
    ring: 15 steps a pass of a Simple chunk's 2 slices, 30 messages, so its connections end mid-cycle (an
    all-reduce's 60 a pass would not)."""
    topo = rail_optimized(hosts=2, gpu="h100")
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    opts = dataclasses.replace(with_env(NCCL_IB_QPS_PER_CONNECTION="4"), granularity="chunked", chunk_bytes=MB)
    coll = Collective("all_gather", tuple(range(16)), 48 * MB, "bf16")
    sent: dict[tuple[int, int, int, int], int] = {}
    first = decompose(coll, topo, opts, sent=sent).flows
    second = decompose(coll, topo, opts, first_flow_id=len(first), sent=sent).flows
    alone = decompose(coll, topo, opts).flows  # without the run's counters: each call starts at QP 0

    def per_connection(flows: list[Flow]) -> dict[tuple[int, int, int], list[int]]:
        out: dict[tuple[int, int, int], list[int]] = {}
        for f in flows:
            if host[f.src] != host[f.dst] and not is_credit(f):
                out.setdefault((f.src, f.dst, (f.key or 0) & ((1 << 56) - 1)), []).append(f.conn)
        return out

    a, b, c = per_connection(first), per_connection(second), per_connection(alone)
    assert a.keys() == b.keys() == c.keys() and a
    shifted = 0
    for conn, msgs in a.items():
        qp_of = {q: i for i, q in enumerate(dict.fromkeys(c[conn]))}  # queue pair ids in the order QP 0, 1, ...
        m = len(msgs)
        assert [qp_of[q] for q in b[conn]] == [(m + k) % 4 for k in range(len(b[conn]))]
        assert [qp_of[q] for q in c[conn]] == [k % 4 for k in range(len(c[conn]))]
        shifted += m % 4 != 0
    assert shifted > 0  # the case checks something: some connection ended mid-cycle
    assert sum(sent.values()) == sum(map(len, a.values())) + sum(map(len, b.values()))


def test_a_coarse_flow_stands_for_many_messages_and_is_split_over_the_queue_pairs() -> None:
    """Coarse granularity: one flow per channel and hop stands for all its messages, which NCCL posts to the QPs
    in turn; it is split over them as NCCL_IB_SPLIT_DATA_ON_QPS=1 splits a message."""
    coarse = ring_flows(with_env(NCCL_IB_QPS_PER_CONNECTION="4"))
    split = ring_flows(with_env(NCCL_IB_QPS_PER_CONNECTION="4", NCCL_IB_SPLIT_DATA_ON_QPS="1"))
    assert [(f.src, f.dst, f.size, f.conn) for f in coarse] == [(f.src, f.dst, f.size, f.conn) for f in split]
    assert any(f.tag.endswith("/qp3") for f in coarse)


def test_split_data_on_qps_posts_each_message_over_every_queue_pair_in_128_byte_multiples() -> None:
    one = ring_flows(with_env(), nbytes=48 * MB + 7)
    split = ring_flows(with_env(NCCL_IB_QPS_PER_CONNECTION="3", NCCL_IB_SPLIT_DATA_ON_QPS="1"), nbytes=48 * MB + 7)
    topo = rail_optimized(hosts=2, gpu="h100")
    host = {n: topo.nodes[n].host for n in topo.endpoints}
    net = [f for f in one if host[f.src] != host[f.dst]]
    parts = [f for f in split if "/qp" in f.tag]
    joins = [f for f in split if f.tag.endswith("/join")]
    assert len(joins) == len([f for f in net if f.size > 128])  # a message of one part needs no join
    for f in net:
        size = f.size
        want = math.ceil(math.ceil(size / 3) / 128) * 128
        mine = [p for p in parts if (p.tag.rsplit("/qp", 1)[0], p.src, p.dst) == (f.tag, f.src, f.dst)]
        assert sum(p.size for p in mine) == size
        assert all(p.size == want for p in mine[:-1]) and 0 < mine[-1].size <= want
        assert len({p.conn for p in mine}) == len(mine)
    assert sum(f.size for f in split) == sum(f.size for f in one)  # joins carry nothing


def test_bad_queue_pair_counts_are_refused_naming_the_variable() -> None:
    for bad in ("0", "129", "many"):
        with pytest.raises(InputError) as err:
            ring_flows(with_env(NCCL_IB_QPS_PER_CONNECTION=bad))
        assert err.value.field == "NCCL_IB_QPS_PER_CONNECTION"
