"""A partition worker process (issue 38): one switch group's share of a packet-level run, windows peer to peer.

Started by `bridge.cut_pool` as ``python -m bridge.cut_worker --setup FILE`` with the run's token in PHANTORA_TOKEN. The
setup (msgpack) holds the topology, the engine spec (its PacketConfig with ``partition_worker`` this worker's group),
the batches of flows (submit time, columns), their HPCC destination ports, the run limit, where to write the result, and
how to reach the other workers (the directory of their endpoint files; on one machine without CurveZMQ plain Unix
stream sockets, `bridge.cut_unix`; else ZeroMQ, ipc or tcp on a host, with CurveZMQ or not: `bridge.cut_peers`).
The worker builds its engine with `make_engine`, adds every flow (the engine keeps the ends it owns), runs the
windows (`phantora.netsim.cut_windows`) with the other workers, and writes its
records (msgpack), each with the order key of the event that made it, for the pool to merge. Any failure exits non-zero
with the reason on stderr. With ``beat`` S > 0 in the setup (a progress display's) the C++ window loop writes its
stdout, a pipe to the pool, a beat after a window every S CPU seconds: [clock ns, events, the run's CPU ns], msgpack.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgpack

from bridge.columns import completions_to_columns, flows_from_columns
from bridge.cut_peers import ZmqPeers
from bridge.cut_unix import UnixPeers, is_local
from bridge.peak_rss import peak_rss_kb
from bridge.runspec import topology_from_dict
from bridge.transport import LOOPBACK, STARTUP_TIMEOUT_S
from phantora.netsim.cut_windows import WindowStats
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet import Ns3Simulator

# the records the pool merges by their events' order keys: this module's name -> DrainRecordKeys' kind
KEYED_RECORDS = {"fct": "fct", "pfc": "pfc", "marks": "ecn", "cnps": "cnps", "drops": "drops", "trims": "trims"}


def as_rows(records: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Flat dataclass records (of one class, two fields or more) as tuples of their fields: what
    `dataclasses.astuple` gives them, without its deep copy (about 30x faster: 60,000 PFC frames in 0.06 s)."""
    if not records:
        return []
    get = attrgetter(*(f.name for f in fields(records[0])))
    return [get(r) for r in records]


def records(sim: Ns3Simulator, done: list[Any]) -> dict[str, Any]:
    """What the worker recorded, as plain lists, with the order key of the event that made each record of
    `KEYED_RECORDS` (in "keys", by name: the pool merges them by it, `phantora.netsim.record_order`)."""
    return {
        "done": completions_to_columns(done),
        "fct": as_rows(sim.fct_records()),
        "pfc": as_rows(sim.pfc_events()),
        "marks": as_rows(sim.ecn_mark_events()),
        "cnps": as_rows(sim.cnp_events()),
        "drops": as_rows(sim.drops()),
        "trims": as_rows(sim.trims()),  # (DLCP: loss-tolerant packets cut to their header)
        "transport": as_rows([t for _, t in sorted(sim.flow_transport().items())]),
        "transport_tail": sim.cut_transport_tail(),
        "channels": sim.channel_rows(),
        "stats": sim.stats(),
        "effective": sim.effective_pairs(),
        "keys": {name: sim.record_keys(kind) for name, kind in KEYED_RECORDS.items()},
        "queues": as_rows(sim.queue_samples()),  # the switches it runs, in (ns, node, port, class) order
    }


@dataclass
class WorkerStart:
    """A started partition worker: its setup, its engine, its peers, and the wall and CPU clocks at its start."""

    setup: dict[str, Any]
    sim: Ns3Simulator
    peers: ZmqPeers | UnixPeers
    wall0: float
    cpu0: float
    setup_events: int  # the events its engine ran building the fabric, every node's (a worker runs them all)


def start_worker(prog: str, argv: list[str] | None) -> WorkerStart | None:
    """Read ``--setup FILE`` from `argv`, check the run's token (PHANTORA_TOKEN), build the worker's engine for its
    group and connect it to the other workers (ipc on loopback unless the setup says otherwise). None, after one
    line on stderr naming `prog`, when the token is missing."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--setup", required=True)
    args = ap.parse_args(argv)
    setup = msgpack.unpackb(Path(args.setup).read_bytes(), raw=False, strict_map_key=False)
    token = os.environ.get("PHANTORA_TOKEN", "")
    if not token:
        print(f"{prog}: PHANTORA_TOKEN is not set", file=sys.stderr)
        return None
    wall0, cpu0 = time.perf_counter(), time.process_time()
    topo = topology_from_dict(setup["topology"])
    spec = EngineSpec.from_dict(setup["engine"])
    group, groups = spec.packet.partition_worker, spec.packet.partition
    sim = make_engine(spec, topo)
    assert isinstance(sim, Ns3Simulator)
    setup_events = int(sim.stats()["events"])  # type: ignore[call-overload]
    peers: ZmqPeers | UnixPeers
    if is_local(setup):  # one machine, no CurveZMQ: plain Unix stream sockets (`bridge.cut_unix`)
        peers = UnixPeers(Path(setup["run_dir"]), group, groups, token, startup_timeout_s=STARTUP_TIMEOUT_S)
    else:
        peers = ZmqPeers(Path(setup["run_dir"]), group, groups, token, transport=setup.get("transport", "ipc"),
                         host=setup.get("host", LOOPBACK), curve=bool(setup.get("curve")),
                         startup_timeout_s=STARTUP_TIMEOUT_S)  # fmt: skip
    return WorkerStart(setup, sim, peers, wall0, cpu0, setup_events)


def main(argv: list[str] | None = None) -> int:
    started = start_worker("bridge.cut_worker", argv)
    if started is None:
        return 2
    setup, sim, peers, wall0, cpu0 = started.setup, started.sim, started.peers, started.wall0, started.cpu0
    try:
        setup_cpu = time.process_time() - cpu0
        dports = {int(fid): int(port) for fid, port in setup["dports"]}
        for at, cols in setup["batches"]:
            batch = flows_from_columns(cols)
            sim.submit(batch, int(at), dports={f.id: dports[f.id] for f in batch if f.id in dports})
        stats = WindowStats()
        sim.cut_warm_up(peers)
        beat = float(setup.get("beat") or 0)
        if beat > 0 and isinstance(peers, UnixPeers):  # a progress display's: beats on stdout, a pipe to the pool
            os.set_blocking(sys.stdout.fileno(), False)
            peers.beat_to(sys.stdout.fileno(), beat)
        c0, r0 = time.process_time(), time.perf_counter()
        sim.run_cut_windows(peers, setup["until"], stats, finish=bool(setup.get("finish")))
        run_cpu, run_wall = time.process_time() - c0, time.perf_counter() - r0
        out = records(sim, sim.take_completions())
        out["windows"] = {
            "windows": stats.windows, "exchanges": stats.exchanges, "bytes_out": stats.bytes_out,
            "lockstep_rounds": stats.lockstep_rounds, "ended_by": stats.ended_by, "widths": stats.widths,
            "ns3_cpu_s": stats.run_cpu_s, "exchange_wall_s": stats.exchange_wall_s, "run_cpu_s": run_cpu,
            "run_wall_s": run_wall,
            "setup_cpu_s": setup_cpu, "wall_s": time.perf_counter() - wall0, "setup_events": started.setup_events,
            "maxrss_kb": peak_rss_kb(), "rejected": peers.rejected,
            "curve": peers.curve,
            "cut": sim.cut_stats(),
        }  # fmt: skip
        tmp = Path(setup["out"] + ".tmp")
        tmp.write_bytes(msgpack.packb(out))
        tmp.rename(setup["out"])
    finally:
        peers.close()
        sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
