"""A long live packet-mode run's network server keeps no record a flow (issue 38).

The server's engine used to keep, for every flow of the run, an FCT record nobody asks a live server for (72 bytes),
a completion time in a map (for dependencies on it) and a transport-counter map node (for flows.csv), both kept for
good, and the id in a Python set (about 300 bytes a flow: 0.12 MiB a step of a chunked gpt_ddp on testbed16). Now it
keeps no FCT records (`bridge.netserver.open_engine`), and a flow done at both ends is a bit in two id bitmaps
(`IdBits`: done, and transport counters all 0) and one in the Python `IdSet`. The test drives the server's own
request handler (no socket) with K and 4K steps of a chunked ring all-reduce and bounds what the extra 3K keep.
The same with nvlink=fluid (the hybrid kept each flow's side and end ns, and the fluid engine its route by flow id)
and with reuse=on (the id in a Python set, the route by flow id): now bits, and routes by pair where it has one path.

It runs ns-3's heap scheduler: the default wheel's 8,192 one-ns slots each keep the capacity they grew to, about
0.7 MB once every slot has been used (some 700 steps here): bounded, but longer than a test's warm-up.
"""

from __future__ import annotations

import gc
import os
import sys

import pytest

from bridge.netserver import NetServer, open_engine
from bridge.protocol import INF_NS, MAX_MESSAGE_BYTES, decode, encode, flow_to_wire
from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.packet import Ns3Simulator, keep_fct_records
from phantora.netsim.packet_config import PacketConfig
from phantora.procmem import heap_in_use_bytes
from phantora.topology.generators import leaf_spine

pytestmark = pytest.mark.ns3

WORLD, CHUNK = 4, 16 * 1024
FLOWS_A_STEP = 2 * (WORLD - 1) * WORLD  # a ring all-reduce: 2(n-1) steps, each rank sending one chunk


class Server:
    """A network server's handler as the coordinator talks to it, without the socket."""

    def __init__(self, gpus_per_host: int = 1, gap_ns: int = 0, **config: str) -> None:
        topo = leaf_spine(1, WORLD, 0, nic_rate="100Gbps", latency="1us", gpus_per_host=gpus_per_host)
        cfg = PacketConfig(scheduler="ns3::HeapScheduler", **config)  # type: ignore[arg-type]
        self.engine = open_engine(EngineSpec("ns3", cfg), topo)
        self.server = NetServer(None, self.engine, "token", {}, MAX_MESSAGE_BYTES, local=False)  # type: ignore[arg-type]
        self.ask("hello", token="token", role="coordinator", rank=None, world=None, pid=os.getpid())
        self.next_id = 0
        self.gap_ns = gap_ns  # idle ns before each all-reduce (a compute phase: the fabric goes quiet)

    def ask(self, type_: str, **fields: object) -> dict:
        reply = decode(self.server.handle(b"coordinator", encode(type_, 0, **fields)) or b"")
        assert reply.type != "error", reply.fields
        return reply.fields

    def all_reduce(self) -> None:
        """One chunked ring all-reduce at the engine's time (after `gap_ns` idle), run until its last flows are done."""
        if self.gap_ns:
            self.ask("advance", until=self.engine.now() + self.gap_ns, watch=[], earliest=None)
        flows, into = [], {}
        for _ in range(2 * (WORLD - 1)):
            now = {}
            for r in range(WORLD):
                deps = (into[r],) if r in into else ()
                flows.append(Flow(self.next_id, r, (r + 1) % WORLD, CHUNK, deps=deps, tag="all_reduce/ring"))
                now[(r + 1) % WORLD] = self.next_id
                self.next_id += 1
            into = now
        at = self.ask("submit", flows=[flow_to_wire(f) for f in flows], at=self.engine.now())["now"]
        watch = set(into.values())
        while watch:
            done = self.ask("advance", until=INF_NS, watch=sorted(watch), earliest=at)["done"]
            watch -= {row[0] for row in done}


def kept_after(server: Server, steps: int) -> tuple[int, int]:
    """(malloc's bytes in use, Python's allocated blocks) after `steps` more all-reduces."""
    for _ in range(steps):
        server.all_reduce()
    gc.collect()
    heap = heap_in_use_bytes()
    assert heap is not None
    return heap, sys.getallocatedblocks()


@pytest.fixture
def server(ns3_lib, request):
    s = Server(**getattr(request, "param", {}))
    yield s
    s.engine.close()
    keep_fct_records(True)  # the process's setting, for the tests after this one


def check_what_is_kept(server: Server, k: int = 25) -> None:
    """K and 4K all-reduces: the extra 3K keep under 16 bytes and 0.25 Python blocks a flow."""
    heap0, blocks0 = kept_after(server, k)
    heap1, blocks1 = kept_after(server, 3 * k)
    flows = 3 * k * FLOWS_A_STEP
    assert (heap1 - heap0) / flows < 16, f"{(heap1 - heap0) / flows:.0f} bytes kept a flow"
    assert (blocks1 - blocks0) / flows < 0.25, f"{(blocks1 - blocks0) / flows:.2f} blocks kept a flow"


def check_long_done_flow_still_answers(server: Server) -> None:
    """A flow on flow 0 (done long ago, state dropped) starts at its submission; flow 0 again is a duplicate."""
    at = server.engine.now() + 1000
    server.ask("submit", flows=[flow_to_wire(Flow(server.next_id, 0, 1, 0, deps=(0,)))], at=at)
    (done,) = server.ask("advance", until=INF_NS, watch=[server.next_id], earliest=at)["done"]
    assert done[:3] == [server.next_id, at, at]  # an empty flow: it starts and ends at its submission
    server.next_id += 1
    reply = decode(server.server.handle(b"coordinator", encode("submit", 0, flows=[flow_to_wire(Flow(0, 0, 1, 8))],
                                                                 at=server.engine.now())))  # fmt: skip
    assert reply.type == "error" and "duplicate flow id" in reply["text"]


def test_a_long_run_keeps_no_record_a_flow(server: Server) -> None:
    """K and 4K all-reduces: the extra 3K keep under 16 bytes and 0.25 Python blocks a flow (measured 0.9 bytes
    and 0.07 blocks; before, 282 bytes and 1.07 blocks, the id's int in a set). What was dropped is still
    answered: flows.csv's transport rows (every flow, by id, all 0 on a lossless fabric), a flow on one long done
    starts at once (its dependency waits for nothing), and that id is still refused as a duplicate."""
    if heap_in_use_bytes() is None:
        pytest.skip("no glibc mallinfo2 here")
    check_what_is_kept(server)
    eng = server.engine
    assert isinstance(eng, Ns3Simulator) and eng.fct_records() == []
    rows = server.ask("get_transport")["rows"]
    assert [r[0] for r in rows] == list(range(server.next_id))
    assert all(r[1:] == [0, 0, 0, 0] for r in rows)
    check_long_done_flow_still_answers(server)


def test_transport_rows_stay_in_id_order_with_and_without_retransmissions(ns3_lib) -> None:
    """An incast without PFC drops packets: flows that retransmit keep their counters, the lone flows around them
    (all 0) become bits; the rows merge back in id order, every flow once, and add up to the NICs' own counts."""
    senders, size = 6, 200_000
    topo = leaf_spine(1, senders + 2, 0, nic_rate="100Gbps", latency="1us")
    cfg = PacketConfig(pfc=False, buffer_bytes=300_000, rto_ns=50_000)
    flows = [Flow(2 * i, i, senders, size) for i in range(senders)]  # even ids: the incast into `senders`
    flows += [Flow(2 * i + 1, senders + 1, i, 20_000) for i in range(senders)]  # odd ids: lone flows, no loss
    with Ns3Simulator(topo, cfg) as sim:
        sim.submit(flows, 0)
        sim.drain()
        assert sim.finish()  # every sender done: each counter final
        stats = sim.stats()
        rows = sim.flow_transport()
    assert list(rows) == sorted(rows) == list(range(2 * senders))
    assert stats["drops"] > 0 and stats["retx_packets"] > 0
    assert sum(t.retx_packets for t in rows.values()) == stats["retx_packets"]
    assert sum(t.retx_bytes for t in rows.values()) == stats["retx_bytes"]
    assert all(rows[2 * i + 1].retx_packets == 0 for i in range(senders))
    assert any(rows[2 * i].retx_packets > 0 for i in range(senders))


@pytest.mark.parametrize("server", [{"gpus_per_host": 2, "nvlink": "fluid"}], indirect=True)
def test_fluid_nvlink_keeps_no_record_a_flow(server: Server) -> None:
    """nvlink=fluid, two GPUs a host: half of each ring's steps cross NVLink (the fluid engine), half the network
    (ns-3). The hybrid dropped each done flow's side and end ns (dicts, about 730 bytes a flow with the fluid
    engine's route of each flow id): now bits. A flow on the NVLink side that waits on a done fluid flow keeps no
    dep; a network flow on a done network flow keeps it (ns-3 reads it as done). flows.csv's transport rows are
    ns-3's flows: the ring steps from an odd rank (1->2, 3->0), every one, in id order."""
    if heap_in_use_bytes() is None:
        pytest.skip("no glibc mallinfo2 here")
    check_what_is_kept(server)
    rows = server.ask("get_transport")["rows"]
    assert [r[0] for r in rows] == [i for i in range(server.next_id) if i % WORLD % 2 == 1]
    check_long_done_flow_still_answers(server)
    # The NVLink step 0->1 of a new ring on the fluid side, waiting on flow 0 (done, fluid): it ends one transfer
    # after its submission, 16 KiB at NVLink's line rate plus the two hops' latency, at no later than the closed
    # form (a dep kept by mistake would wait on a flow the fluid engine never completes again: it would not end).
    at = server.engine.now() + 1000
    fid = server.next_id
    server.ask("submit", flows=[flow_to_wire(Flow(fid, 0, 1, CHUNK, deps=(0,)))], at=at)
    (done,) = server.ask("advance", until=INF_NS, watch=[fid], earliest=at)["done"]
    assert done[0] == fid and done[1] == at and done[2] > at


@pytest.mark.parametrize("server", [{"reuse": "on", "gap_ns": 50_000}], indirect=True)
def test_reuse_keeps_no_record_a_flow(server: Server) -> None:
    """reuse=on: every all-reduce after the first is served from the first's profile (ns-3 never runs it). The
    simulator kept each flow's id in a Python set and its route under its id; now a bit, and routes by pair where
    the pair has one path (one leaf). flows.csv's transport rows still name every flow, served or run, in id order."""
    if heap_in_use_bytes() is None:
        pytest.skip("no glibc mallinfo2 here")
    check_what_is_kept(server)
    stats = server.engine.stats()
    assert stats["reuse_served"] >= 99  # (the first all-reduce recorded, the others served)
    rows = server.ask("get_transport")["rows"]
    assert [r[0] for r in rows] == list(range(server.next_id))
    check_long_done_flow_still_answers(server)
