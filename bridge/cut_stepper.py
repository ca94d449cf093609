"""A stepped partition worker process (issue 38): one switch group's share of a run a driver steps in rounds.

Started by `bridge.cut_stepped_pool` as ``python -m bridge.cut_stepper --setup FILE`` with the run's token in
PHANTORA_TOKEN; the setup (msgpack) is `bridge.cut_worker`'s without flows. Requests come on stdin and replies go
to stdout, one msgpack map each:

- ``{"k": "round", "groups": [[at, flow columns], ...], "until": ns | None, "react": [id, ns, ...]}``: for each
  group, run the windows to its ns if the clock is behind it, then add its flows there (every worker gets every flow and
  keeps the ends it owns); then run the windows to ``until`` (every event at or before it; None: until nothing is left
  anywhere), or only to the first completion of a flow of ``react`` plus its reaction ns (the driver may hand over a
  flow then); with ``"finish": true`` (a drain's last rounds) no further than the event of the completion that leaves no
  flow in flight anywhere, as one engine's drain. The reply: the completions (columns), the completion bounds that rose
  ([id, ns, ...]), CPU and wall seconds, the clock, the ns a reacting completion stopped the run at (None: it ran to
  ``until``), the next event (None: no flow in flight), the flows in flight, whether it is quiet (`quiet`: nothing in
  flight and no live event left; profile reuse ends an episode when every worker is) and a lower bound on the last
  completion of the flows it sends (`last_end`, `cut_round.last_send_end`; None: none left); with
  ``"beat": true`` (a progress display's) also its ns-3 events so far (`events`). From the first round with
  ``"beat_s": S`` on, the C++ window loop (local workers) also writes stdout, between two replies, a beat after a
  window every S CPU seconds: a msgpack array [clock ns, events, the call's CPU ns] (`PhantoraCutPeers::SetBeat`).
- ``{"k": "records"}``: the records made since the last such request (``new``, by kind, each with its event's
  order key in ``keys``: the pool keeps the earlier ones, `bridge.cut_stepped_records`), the counters so far
  (stats, channels, transport) and the windows' counters.
- ``{"k": "exit"}``.

Every worker makes the same window calls, so their barriers line up. Any failure exits non-zero with the reason
on stderr (the pool names the worker).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import msgpack

from bridge.columns import completions_to_columns, flows_from_columns
from bridge.cut_peers import ZmqPeers
from bridge.cut_unix import UnixPeers
from bridge.cut_worker import KEYED_RECORDS, as_rows, start_worker
from bridge.peak_rss import peak_rss_kb
from phantora.netsim.cut_round import last_send_end, round_end
from phantora.netsim.cut_windows import WindowStats
from phantora.netsim.packet import Ns3Simulator

MAX_REQUEST_BYTES = 1 << 31


class Stepper:
    """One worker's engine, its peers and what it has reported."""

    def __init__(self, sim: Ns3Simulator, peers: ZmqPeers | UnixPeers) -> None:
        self.sim, self.peers = sim, peers
        self.stats = WindowStats()
        self.sent: dict[str, int] = {}  # records of each kind sent to the pool so far
        self.bounds: dict[int, int] = {}
        self.run_cpu = self.run_wall = self.records_cpu = 0.0
        self.beating = False  # the C++ window loop beats on stdout (a round's ``beat_s``)

    def _run_to(self, until: int | None, reacting: list[int] | None = None, finish: bool = False) -> int | None:
        return self.sim.run_cut_windows(self.peers, until, self.stats, reacting, finish)

    def round(self, msg: dict[str, Any]) -> dict[str, Any]:
        sim = self.sim
        c0, w0 = time.process_time(), time.perf_counter()
        beat_s = msg.get("beat_s")
        if isinstance(beat_s, (int, float)) and beat_s > 0 and not self.beating and isinstance(self.peers, UnixPeers):
            self.beating = self.peers.beat_to(sys.stdout.fileno(), float(beat_s))  # (the C++ loop's, on stdout)
        for at, cols in msg["groups"]:
            if at > sim.now():
                self._run_to(int(at))
            sim.submit(flows_from_columns(cols), int(at))
        react = msg.get("react")
        stop = self._run_to(msg["until"], None if react is None else [int(x) for x in react], bool(msg.get("finish")))
        done, now = round_end(sim)
        last = self.bounds
        raised = [x for fid, ns in now.items() if ns > last.get(fid, -1) for x in (fid, ns)]
        self.bounds = now
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        self.run_cpu += cpu
        self.run_wall += wall
        out = {"done": completions_to_columns(done), "bounds": raised, "cpu": cpu, "wall": wall, "now": sim.now(),
               "stop": stop, "next": sim.next_event_time(), "in_flight": sim.in_flight(),
               "quiet": sim.quiet(), "last_end": last_send_end(sim)}  # fmt: skip
        if msg.get("beat"):  # a progress display's: the events so far too
            out["events"] = sim.event_count()
        return out

    def records(self, setup_cpu: float, wall0: float, setup_events: int, import_cpu: float) -> dict[str, Any]:
        """The records made since the last call, with their keys (`new`, `keys`: the pool keeps the earlier
        ones), and the counters so far (stats, channels, transport, the windows', the process's CPU)."""
        c0 = time.process_time()
        sim, first = self.sim, not self.sent
        new: dict[str, list[Any]] = {}
        for name, rows in (("fct", sim.fct_records()), ("pfc", sim.pfc_events()), ("marks", sim.ecn_mark_events()),
                           ("cnps", sim.cnp_events()), ("drops", sim.drops()), ("trims", sim.trims()),
                           ("queues", sim.queue_samples())):  # fmt: skip
            new[name] = as_rows(rows[self.sent.get(name, 0) :])
            self.sent[name] = len(rows)
        out: dict[str, Any] = {
            "new": new,
            "keys": {name: sim.record_keys(kind) for name, kind in KEYED_RECORDS.items()},
            "transport": as_rows([t for _, t in sorted(sim.flow_transport().items())]),
            "transport_tail": sim.cut_transport_tail(),
            # the channels this worker sent a packet on: a channel's counters are its sending port's, one worker's
            # (the usage and the switch links' load read those with packets only)
            "channels": [row for row in sim.channel_rows() if row[5]],
            "stats": sim.stats(),
            "effective": sim.effective_pairs() if first else [],  # (the fabric's settings: once)
        }
        s = self.stats
        out["windows"] = {
            "windows": s.windows, "exchanges": s.exchanges, "bytes_out": s.bytes_out,
            "lockstep_rounds": s.lockstep_rounds, "ended_by": s.ended_by, "widths": s.widths,
            "ns3_cpu_s": s.run_cpu_s, "exchange_wall_s": s.exchange_wall_s, "run_cpu_s": self.run_cpu,
            "run_wall_s": self.run_wall, "setup_cpu_s": setup_cpu, "wall_s": time.perf_counter() - wall0,
            "setup_events": setup_events,
            "maxrss_kb": peak_rss_kb(), "rejected": self.peers.rejected,
            "curve": self.peers.curve, "cut": self.sim.cut_stats(),
        }  # fmt: skip
        self.records_cpu += time.process_time() - c0
        # the process's CPU: Python's imports before the setup, these answers, and all of it so far
        out["windows"]["process_cpu"] = {"import_s": import_cpu, "records_s": self.records_cpu,
                                         "total_s": time.process_time()}  # fmt: skip
        return out


def _requests(fd: int) -> Iterator[dict[str, Any]]:
    """The requests on `fd` as they come (a read returns what the pipe holds: no wait for a full buffer), until
    it closes."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=MAX_REQUEST_BYTES)
    while chunk := os.read(fd, 1 << 22):
        unpacker.feed(chunk)
        yield from unpacker


def main(argv: list[str] | None = None) -> int:
    started = start_worker("bridge.cut_stepper", argv)
    if started is None:
        return 2
    sim, peers, wall0, cpu0 = started.sim, started.peers, started.wall0, started.cpu0
    out = sys.stdout.buffer
    try:
        sim.cut_warm_up(peers)
        sim.prechecked = True  # the driver's hybrid checks each batch whole at its submit (factory.partitioned)
        step = Stepper(sim, peers)
        setup_cpu = time.process_time() - cpu0
        for msg in _requests(sys.stdin.fileno()):
            if msg["k"] == "exit":
                break
            reply = (
                step.round(msg) if msg["k"] == "round" else step.records(setup_cpu, wall0, started.setup_events, cpu0)
            )
            out.write(msgpack.packb(reply))
            out.flush()
    finally:
        peers.close()
        sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
