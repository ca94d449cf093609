"""Stepped partition workers (issue 38): the `WorkerPool` of `phantora.netsim.partition_stepped.SteppedPartition`.

`SteppedPool` (started by `bridge.cut_stepped_start.spawn_stepped`) runs `config.partition` local worker processes
(`bridge.cut_stepper`) in a private run directory (0700) with a fresh token; they exchange their cut-cable windows
peer to peer (`bridge.cut_peers`, ipc), and this process talks to each through its stdin and stdout (msgpack). To
the driver they are one worker: a round goes to every one of them and their replies come back merged (completions in
(end, flow id) order, each from the worker of its receiver; bounds of every worker, the driver keeps the highest;
the busiest worker's CPU). A completion's start is the one engine's: its post ns, or the end of the last dependency
it waited for in ns-3 (the receiver's worker does not see a release made elsewhere), plus its delay. Records merge
as one keyed engine's, only the new ones each time (`bridge.cut_stepped_records`).
A worker that exits ends the run, named with its last words; the workers exit with this process (stdin closes).
With `on_beat` set (a progress display), every round asks the workers' C++ window loops for beats from inside it
(`beat_s`; msgpack arrays on stdout before the reply, `bridge.cut_stepper`), and a round at most every `beat_s` asks
for their events in its reply: each gives a `Beat` (at most every `beat_s`): their least clock, events and CPU
summed, and the busiest worker.
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgpack

from bridge.columns import completions_from_columns, flows_to_columns
from bridge.cut_pool import PartitionResult
from bridge.cut_stepped_records import SteppedRecords
from bridge.cut_watch import StopWatch
from bridge.ray_workers import last_words
from bridge.runspec import topology_to_dict
from bridge.transport import make_run_dir, new_token, remove_run_dir
from phantora.errors import PhantoraError
from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.decompose import Outbox, RoundReply, WorkerDiedError
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.hybrid import SHARED_DEPS_MIN
from phantora.netsim.packet_config import PacketConfig
from phantora.progress import Beat
from phantora.topology.model import Topology

POLL_S = 0.25  # how often a wait checks that every worker is still there
DEP_END_KEPT = 64  # wide deps lists whose last end `_started` keeps (cleared when full)


@dataclasses.dataclass
class Handle:
    """The one logical worker the driver sees (`DecomposedSimulator.workers`)."""

    index: int
    pid: int
    pieces: list[int]


@dataclasses.dataclass
class _Proc:
    group: int
    proc: subprocess.Popen[bytes]
    log: Path
    unpacker: Any = dataclasses.field(default_factory=lambda: msgpack.Unpacker(raw=False, strict_map_key=False,
                                                                               max_buffer_size=1 << 31))  # fmt: skip

    def died(self) -> WorkerDiedError:
        code = self.proc.poll()
        words = last_words(self.log)
        how = f"exited with code {code}" if code is not None else "closed its output"
        tail = f"; its last words: {words}" if words else ""
        return WorkerDiedError(f"partition worker {self.group} (pid {self.proc.pid}) {how} mid-run{tail}")


class SteppedPool:
    """`config.partition` stepped partition workers, seen by the driver as one worker."""

    def __init__(self, topology: Topology, config: PacketConfig) -> None:
        self.topology = topology
        self._root = make_run_dir()
        self._procs: list[_Proc] = []
        self._closed = False
        self._post: dict[int, tuple[int, tuple[int, ...], int]] = {}  # flow -> (post ns, ns-3 deps, delay)
        self._ends: dict[int, int] = {}  # completed flow -> end ns (for the starts of flows with deps)
        # id of a deps tuple that flows share (a wide list: an all-to-all's dependents) -> (it, its deps' last end),
        # read at its first sharer's completion, when every dep has ended (`_started`); a few kept, not a run's
        self._dep_end: dict[int, tuple[tuple[int, ...], int]] = {}
        self._merged: tuple[int, PartitionResult] | None = None
        self._records = SteppedRecords(config.partition, topology)  # what the workers recorded, merged so far
        self._rounds = 0
        self._wall0 = time.perf_counter()
        self.round_cpu = [0.0] * config.partition
        self.quiet = True  # every worker quiet after the last round (profile reuse's episode end: `SteppedPartition`)
        # set by the driver before each round: the flows it reacts to, flat [id, reaction ns, ...] (None: none are
        # said, the round runs to its horizon); after it, the ns a reacting completion stopped the workers at
        self.reacting: list[int] | None = None
        self.finishing = False  # the driver's: the round stops at the last completion's event (`cut_stepper`)
        self.stopped: int | None = None
        # after each round: a lower bound on the last completion of the flows the workers hold (the greatest of
        # theirs, `cut_round.last_send_end`; None: none left to send)
        self.last_end: int | None = None
        try:
            self._start(topology, config)
        except BaseException:
            self.close()
            raise
        self.workers = [Handle(0, self._first_pid(), [0])]
        self.on_beat: Callable[[Beat], None] | None = None  # a progress display's (`phantora.netsim.heartbeat`) ...
        self.beat_s = 0.5  # ... at most this often (s)
        self._beat_at = float("-inf")
        self._inside: dict[int, list[int]] = {}  # this round's beats from inside, by worker: [clock, events, CPU ns]
        self._known = [(0, 0)] * config.partition  # each worker's (clock, events) as last heard

    @property
    def curve(self) -> bool:
        return False

    def _first_pid(self) -> int:
        return self._procs[0].proc.pid

    def _start(self, topology: Topology, config: PacketConfig) -> None:
        token = new_token()
        for g, setup in enumerate(worker_setups(topology, config)):
            d = self._root / f"w{g}"
            d.mkdir(mode=0o700)
            path = d / "setup.msgpack"
            path.write_bytes(msgpack.packb({**setup, "run_dir": str(self._root)}))
            path.chmod(0o600)
            log = d / "worker.log"
            with log.open("wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "bridge.cut_stepper", "--setup", str(path)],
                    env={**os.environ, "PHANTORA_TOKEN": token},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                )
            self._procs.append(_Proc(g, proc, log))

    # ----- talking to the workers ---------------------------------------------------------------
    def _send(self, msg: dict[str, Any]) -> None:
        raw = msgpack.packb(msg)
        for p in self._procs:
            stdin: IO[bytes] | None = p.proc.stdin
            assert stdin is not None
            try:
                stdin.write(raw)
                stdin.flush()
            except (BrokenPipeError, OSError):
                raise p.died() from None

    def _gather(self) -> list[dict[str, Any]]:
        """One reply from every worker, in group order; a worker that exits first ends the run, named."""
        got: dict[int, dict[str, Any]] = {}
        sel = selectors.DefaultSelector()
        for p in self._procs:
            assert p.proc.stdout is not None
            sel.register(p.proc.stdout.fileno(), selectors.EVENT_READ, p)
        stops = StopWatch([(f"partition worker {p.group} (pid {p.proc.pid})", p.proc) for p in self._procs])
        try:
            while len(got) < len(self._procs):
                stops.look(i for i, p in enumerate(self._procs) if p.group not in got)  # a stopped one, named
                for key, _ in sel.select(POLL_S):
                    p = key.data
                    chunk = os.read(key.fd, 1 << 22)
                    if not chunk:
                        raise p.died()
                    p.unpacker.feed(chunk)
                    for msg in p.unpacker:
                        if isinstance(msg, list):  # a beat from inside the round (`bridge.cut_stepper`)
                            self._inside_beat(p.group, msg)
                            continue
                        got[p.group] = msg
                        sel.unregister(key.fd)
                        break
                for p in self._procs:
                    if p.group not in got and p.proc.poll() is not None:
                        raise p.died()
        finally:
            sel.close()
        return [got[p.group] for p in self._procs]

    def _inside_beat(self, g: int, row: list[Any]) -> None:
        """Worker `g`'s beat from inside a round: passed on with the others' (at most every `beat_s`)."""
        if len(row) != 3 or not all(isinstance(x, int) for x in row):
            return
        self._inside[g], self._known[g] = row, (row[0], row[1])
        now = time.monotonic()
        if self.on_beat is None or now - self._beat_at < self.beat_s:
            return
        self._beat_at = now
        rows = self._inside
        busiest = max(rows, key=lambda w: rows[w][2])
        cpu = sum(self.round_cpu) + sum(r[2] for r in rows.values()) / 1e9  # (rounds done, then this one so far)
        clock = min(c for c, _ in self._known)
        self.on_beat(Beat(clock, sum(e for _, e in self._known), cpu, len(self._procs), busiest))

    # ----- WorkerPool ---------------------------------------------------------------------------------
    def round(self, posts: dict[int, tuple[int, Outbox, int]]) -> Iterator[tuple[int, RoundReply]]:
        self.stopped = None
        if not posts:
            return iter(())
        ((_, out, until),) = posts.values()
        if out.gated or out.gates:
            raise PhantoraError("internal: stepped partition workers take no gates (markers run on the fluid side)")
        groups: list[list[Any]] = []
        flows: list[Flow] = []
        shared: dict[int, tuple[int, ...]] = {}  # id of a deps list flows share (the driver's wide lists) -> one tuple
        for (f, deps), at in zip(out.flows, out.at, strict=True):
            if groups and groups[-1][0] == at:
                groups[-1][1].append((f, deps))
            else:
                groups.append([at, [(f, deps)]])
            if deps:
                kept = shared.get(id(deps))
                if kept is None:
                    kept = shared[id(deps)] = tuple(deps)
                self._post[f.id] = (at, kept, f.delay_ns)
            flows.append(f)
        wire = [[at, flows_to_columns([f for f, _ in fs], [d for _, d in fs])] for at, fs in groups]
        msg: dict[str, Any] = {"k": "round", "groups": wire, "until": None if until >= INF_NS else until}
        if self.reacting is not None:
            msg["react"] = self.reacting
        if self.finishing:
            msg["finish"] = True
        if self.on_beat is not None:
            msg["beat_s"] = self.beat_s
            if time.monotonic() - self._beat_at >= self.beat_s:
                self._beat_at = time.monotonic()
                msg["beat"] = True
        self._inside = {}
        self._send(msg)
        self._rounds += 1
        return self._replies()  # (gathered as the caller reads them: it runs its own work first, `meanwhile`)

    def _replies(self) -> Iterator[tuple[int, RoundReply]]:
        """The round's one merged reply, gathered when the caller asks for it (the workers run meanwhile)."""
        yield 0, self._reply()

    def _reply(self) -> RoundReply:
        replies = self._gather()
        done = sorted((c for r in replies for c in completions_from_columns(r["done"])),
                      key=lambda c: (c.end_ns, c.flow_id))  # fmt: skip
        done = [self._started(c) for c in done]
        bounds = [x for r in replies for x in r["bounds"]]
        for g, r in enumerate(replies):
            self.round_cpu[g] += r["cpu"]
        nexts = [r["next"] for r in replies if r["next"] is not None]
        self.quiet = all(r["quiet"] for r in replies)
        stops = {r.get("stop") for r in replies}
        if len(stops) != 1:
            raise PhantoraError(f"internal: the partition workers stopped at different ns: {sorted(map(str, stops))}")
        (self.stopped,) = stops
        ends = [r["last_end"] for r in replies if r.get("last_end") is not None]
        self.last_end = max(ends) if ends else None
        if self.on_beat is not None and "events" in replies[0]:
            self._known = [(int(r["now"]), int(r["events"])) for r in replies]
            busiest = max(range(len(replies)), key=lambda g: replies[g]["cpu"])
            events = sum(e for _, e in self._known)
            self.on_beat(Beat(min(r["now"] for r in replies), events, sum(self.round_cpu), len(replies), busiest))
        return RoundReply(
            done, bounds, max(r["cpu"] for r in replies), max(r["wall"] for r in replies),
            max(r["now"] for r in replies), min(nexts) if nexts else None, sum(r["in_flight"] for r in replies),
        )  # fmt: skip

    def _started(self, c: Completion) -> Completion:
        """`c` with one engine's start: a flow that waited on deps in ns-3 starts at its last one's end + delay."""
        self._ends[c.flow_id] = c.end_ns
        post = self._post.pop(c.flow_id, None)
        if post is None:
            return c
        at, deps, delay = post
        memo = self._dep_end.get(id(deps))
        if memo is not None and memo[0] is deps:
            last = memo[1]
        else:
            last = max(map(self._ends.__getitem__, deps))  # (deps: not empty, all ended)
            if len(deps) >= SHARED_DEPS_MIN:
                if len(self._dep_end) >= DEP_END_KEPT:
                    self._dep_end.clear()
                self._dep_end[id(deps)] = (deps, last)
        start = max(at, last) + delay
        return c if start == c.start_ns else dataclasses.replace(c, start_ns=start)

    def merged(self, now: int) -> PartitionResult:
        """The workers' records so far, merged as one keyed engine's (`bridge.cut_pool`)."""
        if self._merged is None or self._merged[0] != self._rounds:
            self._send({"k": "records"})
            self._records.add(self._gather())
            self._merged = (self._rounds, self._records.result(time.perf_counter() - self._wall0))
        return self._merged[1]

    def stats(self, index: int) -> dict[str, object]:
        return dict(self.merged(0).stats)

    def records(self, index: int, now: int, elapsed: int) -> dict[str, list[Any]]:
        raise PhantoraError("internal: SteppedPartition reads the merged records (`merged`)")

    def keepalive(self) -> None:
        return None

    def close(self) -> None:
        """Tell every worker to exit, wait a little, then end the ones still there (ours, by pid)."""
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            try:
                assert p.proc.stdin is not None
                p.proc.stdin.write(msgpack.packb({"k": "exit"}))
                p.proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            try:
                p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
            if p.proc.stdout is not None:
                p.proc.stdout.close()
        remove_run_dir(self._root)


def worker_setups(topology: Topology, config: PacketConfig) -> list[dict[str, Any]]:
    """Each worker's setup (its topology and engine), in group order."""
    topo = topology_to_dict(topology)
    out = []
    for g in range(config.partition):
        # (reuse=on stays in the driver, over all of them: each worker runs the plain keyed engine)
        # (and nic_latency: `NicLatencySimulator` hands the driver each flow the ns before its first packet)
        worker = config.with_updates(partition_worker=g, reuse="off", nic_latency=0)
        out.append({"topology": topo, "engine": EngineSpec(network="ns3", packet=worker, side="packet").to_dict()})
    return out
