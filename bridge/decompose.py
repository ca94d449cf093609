"""`DecomposedSimulator`: the packet side split into link-disjoint pieces, run by parallel ns-3 workers.

Each worker is a network server process (`bridge.netserver`, our ZeroMQ bridge: msgpack, the run's token,
heartbeats, timeouts) hosting an ordinary `NicLatencySimulator` over the FULL topology (same node ids, ECMP
hashes and per-switch random streams as one engine), fed only the flows of its pieces
(`phantora.netsim.pieces`; pieces go round-robin onto workers). This engine keeps every dependency itself
and hands each worker its flows without deps, each with the ns it is posted at.

Synchronisation is conservative, with the NIC latency L as lookahead: a flow posted at P sends its first
packet at P + L, and nothing is posted before the completion (or submission) that releases it. If E is
the earliest time anything can still happen (the minimum of the workers' next event times, the flows not
yet handed over and the caller's `until`), every flow not yet known starts at E + L or later, so all
workers may run, in parallel, every event up to E + L - 1 (a "round": send every worker its request,
then gather). The flows' earliest ends are refined as they run: each reply carries the workers' completion
bounds (unsent bytes at line rate + least propagation), so a round ends near the next completion that matters.
Completions wait here and are handed out one ns at a time, as `advance_to_completion`
promises, so nvlink=fluid (`phantora.netsim.hybrid`) sits on top unchanged. The result equals one engine
with the same nic_latency to the ns (docs/packet-model.md, "Decomposition").

Placement: local subprocesses (`workers=N`, ipc in a private directory), or processes started by Ray actors
(`ray=local|auto|ADDRESS`, tcp; beyond loopback CurveZMQ with a per-run key pair here and one per worker).
A worker that dies ends the run within about a second, named; workers exit with this process.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq

from bridge.curve import ClientCurve, KeyPair
from bridge.errors import BridgeError
from bridge.protocol import E_TIMEOUT, INF_NS, encode, flow_to_wire, records_from_wire
from bridge.ray_workers import RayPlacement
from bridge.remote import RemoteSimulator
from bridge.runspec import RunSpec, options_to_dict
from bridge.transport import HEARTBEAT_S, STARTUP_TIMEOUT_S, make_run_dir, new_token, remove_run_dir
from phantora.errors import PhantoraError
from phantora.netsim.base import (
    Completion,
    Flow,
    RunsByCompletion,
)
from phantora.netsim.flow import CausalityError
from phantora.netsim.hybrid import topological_order
from phantora.netsim.nic_latency import Releases, gate_key, uses_nic
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
    Trim,
)
from phantora.netsim.packet import check_packet_batch, check_packet_fields
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.pieces import NO_PIECE, PieceRoutes, fabric_pieces
from phantora.topology.model import Topology

DRIVER = -1  # the owner of markers (no NIC): they complete in the driver
WORKER_PEER_TIMEOUT_S = 120.0  # a worker exits after this much silence from us (we also heartbeat it)
CALL_TIMEOUT_S = 3600.0  # one round may legitimately run this long


class WorkerDiedError(PhantoraError):
    """A decomposition worker exited (or stopped answering) mid-run."""


@dataclasses.dataclass
class Worker:
    """One worker process and our link to it."""

    index: int
    pieces: list[int]
    pid: int
    proc: subprocess.Popen[bytes] | None  # a local process; None when a Ray actor started it
    log: Path | None
    host: Any = None  # the Ray actor that started it
    placement: RayPlacement | None = None
    endpoint: str | None = None  # a Ray worker's, reported by its actor
    server_key: bytes | None = None  # its CurveZMQ public key, reported with the endpoint
    remote: RemoteSimulator | None = None

    def exit_code(self) -> int | None:
        """The worker's exit code once it has exited, else None."""
        if self.proc is not None:
            return self.proc.poll()
        assert self.placement is not None
        return self.placement.poll(self.host)

    def check(self) -> None:
        """WorkerDiedError naming the worker if it has exited."""
        code = self.exit_code()
        if code is not None:
            tail = ""
            if self.log is not None and self.log.exists():
                lines = self.log.read_text(errors="replace").strip().splitlines()[-3:]
                tail = ("; its last words: " + " | ".join(lines)) if lines else ""
            elif self.placement is not None:
                words = self.placement.tail(self.host)
                tail = f"; its last words: {words}" if words else ""
            raise WorkerDiedError(
                f"decomposition worker {self.index} (pid {self.pid}, pieces {self.pieces}) exited with code {code} "
                f"mid-run{tail}"
            )


@dataclasses.dataclass
class _Outbox:
    """What a worker gets in the next round: flows (with their submit ns; `gated` ones wait for a gate too) and
    gates opened, [flow id, ns]."""

    flows: list[list[Any]] = dataclasses.field(default_factory=list)  # wire rows (`flow_to_wire`), local deps only
    at: list[int] = dataclasses.field(default_factory=list)
    gated: list[int] = dataclasses.field(default_factory=list)
    gates: list[list[int]] = dataclasses.field(default_factory=list)

    def empty(self) -> bool:
        return not self.flows and not self.gates


class DecomposedSimulator(RunsByCompletion):
    """A `CompletionStepper` (and `FabricObserver`) over N worker processes, each running some pieces."""

    def __init__(self, topology: Topology, config: PacketConfig) -> None:
        if config.workers < 1 or config.nic_latency < 1:
            raise PhantoraError("decomposition needs workers >= 1 and nic_latency > 0")
        topology.use_ecmp(config.ecmp_hash or topology.ecmp_hash)  # as Ns3Simulator does: the workers' routes
        self.topology = topology
        self.config = config.with_updates(ecmp_hash=topology.ecmp_hash)
        self.latency = config.nic_latency
        self.pieces = fabric_pieces(topology)
        self._routes = PieceRoutes(topology, self.pieces)
        count = max(self.pieces) + 1
        n = min(config.workers, max(count, 1))
        self._piece_worker = [p % n for p in range(count)]
        self._now = 0
        self._wtime = 0  # every completion at or before this ns is gathered (the workers ran that far)
        self._buffer: list[tuple[int, int, Completion]] = []  # gathered completions not handed out: (end, id, c)
        self._owner: dict[int, int] = {}  # flow id -> its worker, DRIVER for markers (they complete here)
        self._ends: dict[int, int] = {}  # flow id -> end ns, as gathered
        self._lb: dict[int, int] = {}  # unfinished flow -> the earliest ns it can complete (`_horizon`); only grows
        self._step: dict[int, int] = {}  # unfinished flow -> delay_ns + its transfer bound: lb >= a dep's lb + step
        self._dependents: dict[int, list[int]] = {}  # unfinished flow -> the flows waiting on it
        self._unfinished: list[set[int]] = [set() for _ in range(n)]  # per worker
        self._ext: set[int] = set()  # unfinished fabric flows a gate or a marker here waits on
        self._rel = Releases()  # gates (pseudo flows, id gate_key(flow)) and markers, waiting on their deps
        self._out: list[_Outbox] = [_Outbox() for _ in range(n)]
        self._wnow = [0] * n  # each worker's now()
        self._next: list[int | None] = [None] * n
        self._in_flight = [0] * n
        self._gates_held = 0
        self.reacts: Callable[[int], bool] | None = None  # set by the caller: does it act on this completion?
        self.prechecked = False  # set by a caller that runs `check_flow_batch` on every batch it submits (hybrid)
        self.rounds = 0
        self.round_wall_s = 0.0
        self.bound_wall_s = 0.0
        self.critical_cpu_s = 0.0  # per round, the CPU of its busiest worker, summed: the wall on free cores
        self.critical_wall_s = 0.0  # per round, the wall its slowest worker took to serve it, summed
        self.gather_wall_s = 0.0  # inside rounds: reading replies, bounds and releases here
        self.between_wall_s = 0.0  # between rounds: the caller (fluid NVLink side, submits) and the bound
        self._round_end: float | None = None
        self._round_cpu = [0.0] * n  # per worker, the CPU its rounds took
        self._records: dict[str, list[Any]] | None = None
        self._records_at = -1
        self._closed = False
        self._placement: RayPlacement | None = None
        self._curve: KeyPair | None = None  # ours, when the workers are CurveZMQ servers
        self._ctx = zmq.Context()
        self._root = make_run_dir()
        self.workers: list[Worker] = []
        try:
            self._start(n)
        except BaseException:
            self.close()
            raise

    # ----- workers -----------------------------------------------------------------------------
    def _start(self, n: int) -> None:
        token = new_token()
        spec = RunSpec(
            topology=self.topology,
            world=self.topology.num_ranks,
            network="ns3",
            engine_options={**options_to_dict(self.config), "side": "packet"},
            peer_timeout_s=WORKER_PEER_TIMEOUT_S,
        ).to_bytes()
        if self.config.ray:
            self._placement = RayPlacement(self.config.ray, n)
            self._curve = KeyPair.new() if self._placement.curve else None
            ours = self._curve.public if self._curve is not None else None
            actors = [self._placement.start(spec, token, ours) for _ in range(n)]  # they start in parallel
            for i, actor in enumerate(actors):
                mine = [p for p, w in enumerate(self._piece_worker) if w == i]
                w = Worker(i, mine, -1, None, None, actor, self._placement)
                self.workers.append(w)
                w.pid, w.endpoint, w.server_key = self._placement.endpoint(actor)
        else:
            for i in range(n):
                mine = [p for p, w in enumerate(self._piece_worker) if w == i]
                self.workers.append(self._local_worker(i, mine, spec, token))
        self._poller = zmq.Poller()
        for w in self.workers:
            try:
                w.remote = RemoteSimulator(
                    self._ctx,
                    _endpoint(w, self._root / f"w{w.index}"),
                    token,
                    startup_timeout_s=STARTUP_TIMEOUT_S,
                    call_timeout_s=CALL_TIMEOUT_S,
                    on_wait=w.check,
                    curve=self._client_curve(w),
                )
            except BridgeError as exc:
                raise BridgeError(f"decomposition worker {w.index} (pid {w.pid}): {exc}", code=exc.code) from None
            self._poller.register(w.remote.sock, zmq.POLLIN)

    def _client_curve(self, w: Worker) -> ClientCurve | None:
        """Our CURVE keys and the worker's public key, when the workers are CURVE servers."""
        if self._curve is None:
            return None
        assert w.server_key is not None  # RayPlacement.endpoint checked it
        return ClientCurve(self._curve, w.server_key)

    def _local_worker(self, i: int, pieces: list[int], spec: bytes, token: str) -> Worker:
        d = self._root / f"w{i}"
        d.mkdir(mode=0o700)
        setup = d / "setup.msgpack"
        setup.write_bytes(spec)
        setup.chmod(0o600)
        log = d / "worker.log"
        env = {**os.environ, "PHANTORA_TOKEN": token}
        with log.open("wb") as err:
            prof = os.environ.get("PHANTORA_WORKER_PROFILE")  # cProfile each worker into DIR (docs)
            pre = ["-m", "cProfile", "-o", f"{prof}/w{i}.{os.getpid()}.prof"] if prof else []
            proc = subprocess.Popen(
                [sys.executable, *pre, "-m", "bridge.netserver", "--setup", str(setup)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        return Worker(i, pieces, proc.pid, proc, log)

    def _remote(self, w: Worker) -> RemoteSimulator:
        assert w.remote is not None
        return w.remote

    def _round(self, horizon: int) -> None:
        """Hand every worker its new flows and gates and run all of them, in parallel, to `horizon` (INF_NS:
        until idle); gather the completions. A worker whose next event is past `horizon` is skipped."""
        t0 = time.perf_counter()
        if self._round_end is not None:
            self.between_wall_s += t0 - self._round_end
        sent = []
        for w in self.workers:
            out = self._out[w.index]
            nxt = self._next[w.index]
            if out.empty() and nxt is not None and nxt > horizon:
                continue  # (None: no flow in flight, but ACKs and timers may still run: records count them)
            self._out[w.index] = _Outbox()
            until = max(horizon, self._wnow[w.index])
            raw = encode(
                "post", self._wtime, flows=out.flows, at=out.at, gated=out.gated, gates=out.gates,
                until=until,
            )  # fmt: skip
            self._remote(w).send(raw)
            sent.append(w)
        pending = {w.index for w in sent}
        busiest = slowest = gather = 0.0
        last_check = time.monotonic()
        while pending:
            ready = dict(self._poller.poll(int(HEARTBEAT_S * 1000)))
            for w in sent:
                remote = self._remote(w)
                if w.index in pending and remote.sock in ready:
                    try:
                        msg = remote.reply("posted")
                    except BridgeError as exc:
                        raise WorkerDiedError(f"decomposition worker {w.index} (pid {w.pid}): {exc}") from None
                    pending.discard(w.index)
                    g0 = time.perf_counter()
                    self._gathered(remote.completions(msg))
                    self._bounds(msg["bounds"])
                    gather += time.perf_counter() - g0
                    self._round_cpu[w.index] += msg["cpu"]
                    busiest = max(busiest, msg["cpu"])
                    slowest = max(slowest, msg["wall"])
                    self._wnow[w.index] = remote.now()
                    self._next[w.index] = remote.next_event_time()
                    self._in_flight[w.index] = remote.in_flight()
            if pending and time.monotonic() - last_check >= HEARTBEAT_S:
                last_check = time.monotonic()
                for w in self.workers:
                    if w.index in pending:
                        w.check()
                    else:
                        self._remote(w).keepalive()
        self._wtime = horizon if horizon < INF_NS else max(self._wtime, *self._wnow)
        self.rounds += 1
        self.critical_cpu_s += busiest
        self.critical_wall_s += slowest
        self.gather_wall_s += gather
        self._round_end = time.perf_counter()
        self.round_wall_s += self._round_end - t0

    def _gathered(self, done: list[Completion]) -> None:
        """Completions from a worker: buffered for the caller; what they release here (gates, markers) goes out."""
        for c in done:
            lb = self._lb.get(c.flow_id, 0)
            if c.end_ns < lb:
                raise PhantoraError(f"internal: flow {c.flow_id} ended at {c.end_ns} ns, before its bound {lb} ns")
            heapq.heappush(self._buffer, (c.end_ns, c.flow_id, c))
        self._arrived(done)

    def _bounds(self, flat: list[int]) -> None:
        """A worker's completion bounds of its started flows ([id, ns, ...], those that rose): lb only grows."""
        lbs, waiting = self._lb, self._dependents
        for fid, ns in zip(flat[0::2], flat[1::2], strict=True):
            if ns > lbs.get(fid, INF_NS):
                if fid in waiting:
                    self._raise(fid, ns)
                else:
                    lbs[fid] = ns  # (what `_raise` does for a flow nothing waits on)

    def _raise(self, fid: int, ns: int) -> None:
        """lb(fid) >= ns, and so on down its dependents: each ends no earlier than a dep's lb + its step."""
        lbs, waiting, step = self._lb, self._dependents, self._step
        todo = [(fid, ns)]
        while todo:
            f, t = todo.pop()
            if t <= lbs.get(f, INF_NS):
                continue
            lbs[f] = t
            todo.extend((j, t + step[j]) for j in waiting.get(f, ()) if j in step)

    def _arrived(self, done: list[Completion]) -> None:
        """Record ends; open the gates and complete the markers they release (markers may release more)."""
        while done:
            for c in done:
                self._ends[c.flow_id] = c.end_ns
                self._lb.pop(c.flow_id, None)
                self._step.pop(c.flow_id, None)
                for j in self._dependents.pop(c.flow_id, ()):
                    if j in self._step:  # (not done yet)
                        self._raise(j, c.end_ns + self._step[j])
                w = self._owner[c.flow_id]
                if w != DRIVER:
                    self._unfinished[w].discard(c.flow_id)
                    self._ext.discard(c.flow_id)
            markers = []
            for g, p in self._rel.complete(done):
                if g.id < 0:  # a gate: the flow's deps on other workers and markers are done at p
                    fid = -1 - g.id
                    self._gates_held -= 1
                    self._check_post(fid, p)
                    self._out[self._owner[fid]].gates.append([fid, p])
                else:
                    c = Completion(g.id, p, p, g.size, g.src, g.dst, g.tag)
                    heapq.heappush(self._buffer, (p, g.id, c))
                    markers.append(c)
            done = markers

    def _check_post(self, fid: int, p: int) -> None:
        """A flow released at p sends from p + L: its worker must not have run past p + L - 1."""
        w = self._owner[fid]
        if p + self.latency - 1 < self._wnow[w]:
            raise CausalityError(f"internal: flow {fid} posted at {p} ns, but worker {w} is at {self._wnow[w]} ns")

    # ----- NetworkSimulator --------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows eligible from `at` (>= now()); a fabric flow must stay inside one piece."""
        if at < self._now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {self._now} ns")
        if self.prechecked:
            check_packet_fields(flows)
        else:
            check_packet_batch(flows, self.topology, self._owner.__contains__)
        xfer = {}
        owner, of, piece_worker, latency = self._owner, self._routes.of, self._piece_worker, self.latency
        for f in flows:
            if uses_nic(f):
                piece, propagation, bottleneck = of(f)
                owner[f.id] = piece_worker[piece]
                xfer[f.id] = latency + propagation + f.size * 8_000_000_000 // bottleneck
            else:
                owner[f.id] = DRIVER
                xfer[f.id] = 0
        if self._wtime >= INF_NS:
            self._wtime = self._now
        released: list[Completion] = []
        for f in topological_order(flows, {f.id: f for f in flows}):
            w = self._owner[f.id]
            a, lb = at, at
            local: list[int] = []
            cross: list[int] = []
            for d in dict.fromkeys(f.deps):
                end = self._ends.get(d)
                if end is not None:
                    a, lb = max(a, end), max(lb, end)
                    continue
                lb = max(lb, self._lb[d])
                self._dependents.setdefault(d, []).append(f.id)
                (local if w != DRIVER and self._owner[d] == w else cross).append(d)
            self._step[f.id] = f.delay_ns + xfer[f.id]
            self._lb[f.id] = lb + self._step[f.id]
            self._ext.update(d for d in cross if self._owner[d] != DRIVER)
            if w == DRIVER:
                bare = f if len(cross) == len(f.deps) else f.with_deps(tuple(cross))
                for m, p in self._rel.add([bare], a):
                    c = Completion(m.id, p, p, m.size, m.src, m.dst, m.tag)
                    heapq.heappush(self._buffer, (p, m.id, c))
                    released.append(c)
                continue
            self._check_post(f.id, a)
            self._unfinished[w].add(f.id)
            out = self._out[w]
            out.flows.append(flow_to_wire(f, local))
            out.at.append(a)
            if cross:
                out.gated.append(f.id)
                self._rel.add([Flow(gate_key(f.id), f.src, f.dst, 0, tuple(cross))], a)
                self._gates_held += 1
        self._arrived(released)

    def advance_to_completion(self, until: int) -> list[Completion]:
        """Run to `until` but return right after the first ns at which any flow completes (now() is that ns).
        With no limit it also returns once nothing can happen any more."""
        if until < self._now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self._now} ns")
        while True:
            if self._buffer and self._buffer[0][0] <= min(self._wtime, until):
                end = self._buffer[0][0]
                got = []
                while self._buffer and self._buffer[0][0] == end:
                    got.append(heapq.heappop(self._buffer)[2])
                self._now = end
                return got
            if until < INF_NS and self._wtime >= until:
                self._now = until
                return []
            if until >= INF_NS and (self.in_flight() == 0 or self._earliest() is None):
                return []
            horizon, ended = self._horizon(until), len(self._ends)
            self._round(horizon)
            if horizon >= INF_NS and len(self._ends) == ended and not self._buffer:
                if all(o.empty() for o in self._out):
                    return []  # nothing moved in an unbounded round: what is left waits forever

    def _horizon(self, until: int) -> int:
        """How far every worker may run: up to E + L - 1, E the earliest ns at which a flow could be handed to
        any worker: `until` (the caller submits nothing before), or the earliest end of a flow a gate or a
        marker here waits on, or one the caller acts on (`reacts`; every flow when unset), or a marker ahead
        in the buffer. A flow's earliest end is max(its bound lb, its worker's next event, now + 1); lb starts
        static (at submit) and rises with the workers' completion bounds (`_bounds`) and its deps' (`_raise`)."""
        t0 = time.perf_counter()
        react, ext, lbs = self.reacts, self._ext, self._lb
        e = until
        for w, ids in enumerate(self._unfinished):
            if not ids:
                continue
            if react is None:
                m = min(lbs[f] for f in ids)
            else:
                m = min((lbs[f] for f in ids if f in ext or react(f)), default=INF_NS)
            if m >= e:
                continue
            nxt = self._next[w]
            floor = self._wtime + 1 if not self._out[w].empty() or nxt is None else max(self._wtime + 1, nxt)
            e = min(e, max(m, floor))
        for t, fid, _ in self._buffer:
            if t > self._wtime and (react is None or react(fid)):
                e = min(e, t)
        self.bound_wall_s += time.perf_counter() - t0
        return e + self.latency - 1 if e < INF_NS else INF_NS

    def _earliest(self) -> int | None:
        """The earliest ns anything can still happen: workers' next events, flows not handed over, buffered ends."""
        times = [t for t in self._next if t is not None]
        times += [a + self.latency for out in self._out for a in out.at]
        times += [p + self.latency for out in self._out for _, p in out.gates]
        if self._buffer:
            times.append(self._buffer[0][0])
        return min(times) if times else None

    def next_event_time(self) -> int | None:
        return self._earliest()

    def now(self) -> int:
        return self._now

    def in_flight(self) -> int:
        markers = self._rel.held() - self._gates_held
        return markers + sum(self._in_flight) + sum(len(o.flows) for o in self._out) + len(self._buffer)

    def stats(self) -> dict[str, object]:
        """The workers' counters summed (busiest switch link: max, least busy: min), per worker in `workers`."""
        per = []
        out: dict[str, object] = {}
        for w in self.workers:
            s = self._remote(w).stats()
            s = {k: v for k, v in s.items() if k not in ("decompose", "approximations")}
            per.append({"worker": w.index, "pid": w.pid, "pieces": w.pieces, **s})
            for k, v in s.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or k == "nic_latency_ns":
                    out.setdefault(k, v)
                elif k == "switch_link_bytes_min":
                    out[k] = min(v, out.get(k, v))  # type: ignore[call-overload]
                elif k == "switch_link_bytes_max":
                    out[k] = max(v, out.get(k, v))  # type: ignore[call-overload]
                else:
                    out[k] = out.get(k, 0) + v  # type: ignore[operator]
        out["workers"] = per
        out["decompose"] = {
            **self.config.decompose_settings(),
            "workers": len(self.workers),
            "curve": self._curve is not None,  # the workers' sockets are CurveZMQ (encrypted, allow-listed)
            "pieces": max(self.pieces) + 1,
            "rounds": self.rounds,
            "round_wall_s": round(self.round_wall_s, 6),
            "bound_wall_s": round(self.bound_wall_s, 6),
            "critical_cpu_s": round(self.critical_cpu_s, 6),
            "critical_wall_s": round(self.critical_wall_s, 6),  # per round, the slowest worker's serving wall
            "gather_wall_s": round(self.gather_wall_s, 6),  # inside rounds: replies, bounds, releases here
            "between_wall_s": round(self.between_wall_s, 6),  # between rounds: the caller and the bound
            "round_cpu_s": [round(c, 6) for c in self._round_cpu],
        }
        out["approximations"] = self.config.approximations()  # decomposition is exact: not listed
        return out

    def close(self) -> None:
        """Tell every worker to exit, wait a little, then end the ones still there (ours only, by pid)."""
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            if w.remote is not None:
                w.remote.close()
        # An idle worker exits within milliseconds of being told; one still there after a second is inside a
        # long ns-3 call or still starting (the run was interrupted): it has nothing left to write, so end it.
        deadline = time.monotonic() + 1.0
        for w in self.workers:
            if w.proc is not None:
                try:
                    w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
        if self._placement is not None:
            self._placement.stop([w.host for w in self.workers if w.host is not None])
        self._ctx.destroy(linger=0)  # also a socket an interrupted start left open (term() would wait for it)
        remove_run_dir(self._root)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def keepalive(self) -> None:
        for w in self.workers:
            if w.remote is not None:
                w.remote.keepalive()

    def channels(self) -> DecomposedSimulator:
        return self

    def fabric(self) -> DecomposedSimulator:
        return self

    # ----- FabricObserver: each link's records come from the worker owning it ---------------------------
    def _gather(self, elapsed: int | None = None) -> dict[str, list[Any]]:
        at = self._now if elapsed is None else elapsed
        if self._records is not None and self._records_at == at:
            return self._records
        merged: dict[str, list[Any]] = {}
        for w in self.workers:
            msg = self._remote(w)._call(encode("get_records", self._now, elapsed=at), CALL_TIMEOUT_S, "records")
            for k, rows in records_from_wire(msg["records"]).items():
                merged.setdefault(k, []).extend(rows)
        now = self._now  # the workers may have run up to L - 1 ns further: hand out what happened by now only
        for k, rows in merged.items():
            if k == "transport":
                rows[:] = [t for t in rows if self._ends.get(t.flow_id, INF_NS) <= now]
            elif k != "usage":
                rows[:] = [r for r in rows if r.time_ns <= now]
            rows.sort(key=dataclasses.astuple)
        self._records, self._records_at = merged, at
        return merged

    def channel_usage(self, elapsed_ns: int | None = None) -> list[PacketChannelUsage]:
        return list(self._gather(elapsed_ns)["usage"])

    def pfc_events(self) -> list[PfcEvent]:
        return list(self._gather()["pfc"])

    def queue_samples(self) -> list[QueueSample]:
        return list(self._gather()["queues"])

    def drops(self) -> list[Drop]:
        return list(self._gather()["drops"])

    def trims(self) -> list[Trim]:
        return list(self._gather()["trims"])

    def cnp_events(self) -> list[CnpEvent]:
        return list(self._gather()["cnps"])

    def ecn_mark_events(self) -> list[EcnMark]:
        return list(self._gather()["marks"])

    def flow_transport(self) -> dict[int, FlowTransport]:
        return {t.flow_id: t for t in self._gather()["transport"]}


def _endpoint(w: Worker, d: Path) -> str:
    """Wait for a local worker's published endpoint (a Ray worker's came back from its actor)."""
    if w.endpoint is not None:
        return w.endpoint
    path = d / "net.endpoint"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not path.exists():
        w.check()
        if time.monotonic() > deadline:
            raise BridgeError(
                f"decomposition worker {w.index} did not start within {STARTUP_TIMEOUT_S:.0f} s", code=E_TIMEOUT
            )
        time.sleep(0.02)
    return path.read_text().strip()


def decomposed_engine(topo: Topology, config: PacketConfig) -> Any:
    """nvlink=fluid over a `DecomposedSimulator`: the engine `--set workers=N` asks for."""
    from phantora.netsim.factory import fluid_nvlink

    packet = DecomposedSimulator(topo, config)
    engine = fluid_nvlink(topo, config, packet=packet)
    packet.reacts = engine.reacts_to  # type: ignore[attr-defined]
    packet.prechecked = True  # the hybrid checks each batch whole at its submit: ids, ends, deps, cycles
    return engine


__all__ = ["NO_PIECE", "DecomposedSimulator", "WorkerDiedError", "decomposed_engine"]
