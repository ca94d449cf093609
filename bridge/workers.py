"""Decomposition workers: network server processes, started here, and the rounds to them.

`spawn_workers` is the `phantora.netsim.decompose.Spawner` the bridge hands to the decomposed engine. Each
worker is a network server process (`bridge.netserver`: msgpack, the run's token, heartbeats, timeouts) hosting
the packet side (``side="packet"``) over the full topology. Placement: local subprocesses (ipc in a private
directory), or processes started by Ray actors (`ray=local|auto|ADDRESS`, tcp; beyond loopback CurveZMQ with a
per-run key pair here and one per worker, `bridge.ray_workers`). A worker that dies ends the run within about a
second, named; workers exit with this process. With `on_beat` set, each round asks the workers for their progress
from inside it (`progress` messages, `bridge.netserver`), passed on merged: the slowest worker's clock (of those the
round waits for), every worker's events and CPU seconds summed. Groups of a workload's ops are planned on the
workers (`ServerPool.plan`): by local workers started inside `plan_split.jobs_ahead` as they start, before they load
ns-3 (their setup holds them, `bridge.plan_first` plans them, their answers come back as files: `bridge.plan_groups`),
else once they have started.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import zmq

from bridge.columns import completion_columns, flows_to_columns
from bridge.curve import ClientCurve, KeyPair
from bridge.errors import BridgeError
from bridge.liveness import Silence
from bridge.plan_groups import PLANNED, read_planned
from bridge.protocol import E_TIMEOUT, encode, records_from_wire
from bridge.ray_workers import RayPlacement, last_words
from bridge.remote import RemoteSimulator
from bridge.runspec import RunSpec
from bridge.transport import HEARTBEAT_S, STARTUP_ENV, STARTUP_TIMEOUT_S, make_run_dir, new_token, remove_run_dir
from phantora.netsim.decompose import Outbox, RoundReply, WorkerDiedError
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.fluid_proc_wire import WORKER_SOCKET
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.proc_watch import STOPPED, proc_state
from phantora.plan_split import ahead
from phantora.progress import Beat
from phantora.topology.model import Topology

WORKER_PEER_TIMEOUT_S = 120.0  # a worker exits after this much silence from us (we also heartbeat it)
CALL_TIMEOUT_S = 3600.0  # one round may legitimately run this long
WORKER_SILENCE_S = 30.0  # a local worker silent this long in a round while doing no work (stopped, blocked) ends it


def worker_spec(
    topology: Topology, config: PacketConfig, side: str = "packet", plan_jobs: list[dict[str, Any]] | None = None
) -> RunSpec:
    """What each worker is started with (its `setup.msgpack`): the full topology, `config`, its engine's side, and
    the groups of ops it plans as it starts (`plan_jobs`)."""
    return RunSpec(
        topology=topology,
        world=topology.num_ranks,
        engine=EngineSpec(network="ns3", packet=config, side=side),
        peer_timeout_s=WORKER_PEER_TIMEOUT_S,
        plan_jobs=list(plan_jobs or ()),
    )


def deal(jobs: int, workers: int) -> dict[int, list[int]]:
    """Jobs dealt round-robin: worker index -> its job indices (the workers that get none left out)."""
    return {i: list(range(i, jobs, workers)) for i in range(min(workers, jobs))}


def post_message(t: int, out: Outbox, until: int, beat_s: float = 0.0) -> bytes:
    """A round's request to one worker: its outbox as flow columns (each flow with its deps on that worker), the ns
    every completion is known to (`t`) and how far to run (`until`); `beat_s` > 0: with its progress from inside,
    at most this often (s)."""
    flows = flows_to_columns([f for f, _ in out.flows], [local for _, local in out.flows])
    more = {"beat": beat_s} if beat_s > 0 else {}
    return encode("post", t, flows=flows, at=out.at, gated=out.gated, gates=out.gates, until=until, **more)


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
            words = ""
            if self.log is not None and self.log.exists():
                words = last_words(self.log)
            elif self.placement is not None:
                words = self.placement.tail(self.host)
            tail = f"; its last words: {words}" if words else ""
            raise WorkerDiedError(
                f"decomposition worker {self.index} (pid {self.pid}, pieces {self.pieces}) exited with code {code} "
                f"mid-run{tail}"
            )

    def link(self) -> RemoteSimulator:
        assert self.remote is not None
        return self.remote


class ServerPool:
    """Network server workers (a `phantora.netsim.decompose.WorkerPool`), one per list of pieces."""

    def __init__(
        self, topology: Topology, config: PacketConfig, assignment: list[list[int]], side: str = "packet"
    ) -> None:
        self.workers: list[Worker] = []
        self._placement: RayPlacement | None = None
        self._curve: KeyPair | None = None  # ours, when the workers are CurveZMQ servers
        self._ctx = zmq.Context()
        self._root = make_run_dir()
        self._closed = False
        self.on_beat: Callable[[Beat], None] | None = None  # set by a display: the workers' merged progress ...
        self.beat_s = 0.5  # ... at most this often (s)
        self._beats: list[Beat | None] = [None] * len(assignment)  # each worker's last
        self._stopped_since: dict[int, float] = {}  # worker index -> when it was first seen stopped while it starts
        self._at = [0] * len(assignment)  # each worker's clock as last heard (a beat or a reply)
        self._pending: set[int] = set()  # the workers the round in progress waits for
        self._beat_sent = float("-inf")
        self._shown = 0  # the clock last passed on
        self._connecting: threading.Thread | None = None  # local workers' start, in the background (`_ready`)
        self._connect_error: BaseException | None = None  # its error, raised by `_ready`
        self._ahead: list[dict[str, Any]] | None = None  # groups of ops the local workers plan as they start (`plan`)
        try:
            self._start(topology, config, assignment, side)
        except BaseException:
            self.close()
            raise

    @property
    def curve(self) -> bool:
        return self._curve is not None

    def _start(self, topology: Topology, config: PacketConfig, assignment: list[list[int]], side: str) -> None:
        token = new_token()
        spec = worker_spec(topology, config, side).to_bytes()
        jobs = None if config.ray else ahead()  # (a Ray worker's files are on its host: it plans once started)
        dealt = deal(len(jobs), len(assignment)) if jobs else {}
        self._ahead = jobs if dealt else None
        if config.ray:
            self._placement = RayPlacement(config.ray, len(assignment))
            self._curve = KeyPair.new() if self._placement.curve else None
            ours = self._curve.public if self._curve is not None else None
            actors = [self._placement.start(spec, token, ours) for _ in assignment]  # they start in parallel
            for i, (actor, mine) in enumerate(zip(actors, assignment, strict=True)):
                w = Worker(i, mine, -1, None, None, actor, self._placement)
                self.workers.append(w)
                w.pid, w.endpoint, w.server_key = self._placement.endpoint(actor)
        else:
            for i, mine in enumerate(assignment):
                theirs = [jobs[j] for j in dealt[i]] if jobs and i in dealt else None
                setup = worker_spec(topology, config, side, theirs).to_bytes() if theirs else spec
                self.workers.append(self._local_worker(i, mine, setup, token, bool(theirs)))
        self._poller = zmq.Poller()
        self.waited_s = 0.0  # how long the first round waited for the workers to be connected
        if config.ray:  # (their endpoints are known by now)
            self._connect(token)
            return
        # Local workers are connected (each its hello, once it has built its engine) in the background: the caller's
        # first submit runs meanwhile, not after their start (issue 38, item 2). The first round waits (`_ready`).
        self._connecting = threading.Thread(
            target=self._connect_kept, args=(token,), name="phantora-workers-connect", daemon=True
        )
        self._connecting.start()

    @property
    def starting(self) -> bool:
        """Whether the workers are still starting (not all connected): what the caller does now runs beside that."""
        thread = self._connecting
        return thread is not None and thread.is_alive()

    def _ready(self) -> None:
        """Wait for the workers to be connected; their start's error, if any, raised here."""
        thread = self._connecting
        if thread is None:
            return
        t0 = time.perf_counter()
        thread.join()
        self.waited_s += time.perf_counter() - t0
        self._connecting = None
        if self._connect_error is not None:
            raise self._connect_error

    def _connect_kept(self, token: str) -> None:
        """`_connect` in the background thread, its error kept for `_ready`."""
        try:
            self._connect(token)
        except BaseException as exc:  # noqa: BLE001 - raised by `_ready`, in the caller's thread
            self._connect_error = exc

    def _connect(self, token: str) -> None:
        """Each worker's hello, in index order."""
        for w in self.workers:
            try:
                w.remote = RemoteSimulator(
                    self._ctx,
                    _endpoint(w, self._root / f"w{w.index}"),
                    token,
                    startup_timeout_s=STARTUP_TIMEOUT_S,
                    call_timeout_s=CALL_TIMEOUT_S,
                    on_wait=functools.partial(self._waiting, w),
                    curve=self._client_curve(w),
                )
            except BridgeError as exc:
                raise BridgeError(f"decomposition worker {w.index} (pid {w.pid}): {exc}", code=exc.code) from None
            w.remote.on_beat = functools.partial(self._worker_beat, w.index)
            self._poller.register(w.remote.sock, zmq.POLLIN)

    def _waiting(self, w: Worker) -> None:
        """While we wait for worker `w` (its start, its hello): check it, and heartbeat the ones already connected,
        which wait for their first round (a loaded machine can take many seconds to start the next worker)."""
        w.check()
        _fail_if_stopped(w, self._stopped_since)
        self.keepalive()

    def _worker_beat(self, i: int, beat: Beat) -> None:
        """Worker `i`'s progress from inside a round: passed on, merged, at most every `beat_s`: the clock of the
        slowest worker the round waits for (the network has run that far; it only grows), every worker's events and
        CPU seconds summed."""
        self._beats[i], self._at[i] = beat, beat.sim_ns
        now = time.monotonic()
        if self.on_beat is None or now - self._beat_sent < self.beat_s:
            return
        self._beat_sent = now
        slowest = min(self._pending or range(len(self._at)), key=lambda j: (self._at[j], j))
        got = [b for b in self._beats if b is not None]
        events, cpu = sum(b.events for b in got), sum(b.cpu_s for b in got)
        self._shown = max(self._shown, self._at[slowest])
        self.on_beat(Beat(self._shown, events, cpu, len(self._at), slowest))

    def _client_curve(self, w: Worker) -> ClientCurve | None:
        """Our CURVE keys and the worker's public key, when the workers are CURVE servers."""
        if self._curve is None:
            return None
        assert w.server_key is not None  # RayPlacement.endpoint checked it
        return ClientCurve(self._curve, w.server_key)

    def _local_worker(self, i: int, pieces: list[int], spec: bytes, token: str, plans: bool = False) -> Worker:
        """Worker `i` started; `plans`: its setup holds groups of ops, planned first (`bridge.plan_first`)."""
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
            entry = "bridge.plan_first" if plans else "bridge.netserver"
            proc = subprocess.Popen(
                [sys.executable, *pre, "-m", entry, "--setup", str(setup)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        return Worker(i, pieces, proc.pid, proc, log)

    def round(self, posts: dict[int, tuple[int, Outbox, int]]) -> Iterator[tuple[int, RoundReply]]:
        """Send each posted worker its round now, and return an iterator of the replies as they come (the caller
        may work while the workers run: asynchronous rounds); it keeps the others' heartbeats going and checks the
        ones we wait for about once a second."""
        self._ready()
        beat = self.beat_s if self.on_beat is not None else 0.0
        for i, (t, out, until) in posts.items():
            self._at[i] = max(self._at[i], t)  # (a worker left out of rounds had no event before them)
            self.workers[i].link().send(post_message(t, out, until, beat))
        return self._replies(set(posts))

    def _replies(self, pending: set[int]) -> Iterator[tuple[int, RoundReply]]:
        """The replies of the workers in `pending`, as they come. A local worker that stays silent for
        `WORKER_SILENCE_S` while it does no work (bridge/liveness.py: stopped, or blocked for good) ends the round
        naming it; one inside a long ns-3 call gains CPU time, and is waited for."""
        last_check = time.monotonic()
        self._pending = pending
        silences = {i: Silence(self.workers[i].pid) for i in pending if self.workers[i].proc is not None}
        while pending:
            ready = dict(self._poller.poll(int(HEARTBEAT_S * 1000)))
            for i in sorted(pending):
                w = self.workers[i]
                remote = w.link()
                if remote.sock not in ready:
                    continue
                if i in silences:
                    silences[i].heard()
                try:
                    msg = remote.take("posted")
                except BridgeError as exc:
                    raise WorkerDiedError(f"decomposition worker {w.index} (pid {w.pid}): {exc}") from None
                if msg is None:  # its progress (`_worker_beat`): the reply is still to come
                    continue
                pending.discard(i)
                self._at[i] = remote.now()
                reply = RoundReply(
                    completion_columns(msg["done"]), msg["bounds"], msg["cpu"], msg["wall"],
                    remote.now(), remote.next_event_time(), remote.in_flight(),
                )  # fmt: skip
                yield i, reply
            if pending and time.monotonic() - last_check >= HEARTBEAT_S:
                last_check = time.monotonic()
                for w in self.workers:
                    if w.index in pending:
                        w.check()
                        self._check_silence(w, silences.get(w.index))
                    else:
                        w.link().keepalive()

    @staticmethod
    def _check_silence(w: Worker, silence: Silence | None, when: str = "mid-round") -> None:
        """WorkerDiedError naming worker `w` if it has been silent and idle for `WORKER_SILENCE_S` (`when`)."""
        if silence is not None and silence.silent_s() > WORKER_SILENCE_S:
            raise WorkerDiedError(
                f"decomposition worker {w.index} (pid {w.pid}, pieces {w.pieces}) has been silent for "
                f"{WORKER_SILENCE_S:.0f} s {when} without working (no message, no CPU time): stopped or blocked"
            )

    def plan(self, jobs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
        """Each job (`phantora.plan_split.group_job`) planned by a worker, dealt round-robin, all at once: the replies
        in job order, and the CPU seconds of the busiest worker's planning. The jobs the workers were started with
        (`plan_split.jobs_ahead`) are read from their files as they come, not waiting for their start; others are
        sent to workers that have started, and refused while they start (the caller plans them meanwhile)."""
        if self._ahead is not None and jobs == self._ahead:
            self._ahead = None  # (their files answer once)
            return self._planned_ahead(jobs)
        if self.starting:
            return [{"refused": "the workers are starting"} for _ in jobs], 0.0
        self._ready()
        dealt = deal(len(jobs), len(self.workers))
        for i, mine in dealt.items():
            remote = self.workers[i].link()
            remote.send(encode("plan_groups", remote.now(), jobs=[jobs[j] for j in mine]))
        out: list[dict[str, Any]] = [{} for _ in jobs]
        busiest = 0.0
        pending = set(dealt)
        silences = {i: Silence(self.workers[i].pid) for i in pending if self.workers[i].proc is not None}
        while pending:
            ready = dict(self._poller.poll(int(HEARTBEAT_S * 1000)))
            for i in sorted(pending):
                w = self.workers[i]
                if w.link().sock not in ready:
                    continue
                if i in silences:
                    silences[i].heard()
                try:
                    msg = w.link().take("groups_planned")
                except BridgeError as exc:
                    raise WorkerDiedError(f"decomposition worker {w.index} (pid {w.pid}): {exc}") from None
                if msg is None:
                    continue
                pending.discard(i)
                replies = msgpack.unpackb(msg["replies"], raw=False, strict_map_key=True)
                for j, reply in zip(dealt[i], replies, strict=True):
                    out[j] = reply
                busiest = max(busiest, float(msg["cpu"]))
            for w in self.workers if pending else ():  # (as a round: a worker that died or stopped ends the plan)
                if w.index in pending:
                    w.check()
                    self._check_silence(w, silences.get(w.index))
                else:
                    w.link().keepalive()
        return out, busiest

    def _planned_ahead(self, jobs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
        """`plan`'s answer from the files the local workers write as they start (`bridge.plan_groups.write_planned`).
        A worker that dies, stays silent and idle for `WORKER_SILENCE_S` or has not planned within the start-up
        timeout ends the plan, named."""
        dealt = deal(len(jobs), len(self.workers))
        out: list[dict[str, Any]] = [{} for _ in jobs]
        busiest = 0.0
        pending = set(dealt)
        silences = {i: Silence(self.workers[i].pid) for i in pending}
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while pending:
            for i in sorted(pending):
                w = self.workers[i]
                path = self._root / f"w{i}" / PLANNED
                if not path.exists():
                    w.check()
                    self._check_silence(w, silences[i], "before it planned its groups of ops")
                    continue
                try:
                    replies, cpu = read_planned(path, len(dealt[i]))
                except (OSError, ValueError) as exc:
                    raise WorkerDiedError(f"decomposition worker {w.index} (pid {w.pid}): {exc}") from None
                pending.discard(i)
                for j, reply in zip(dealt[i], replies, strict=True):
                    out[j] = reply
                busiest = max(busiest, cpu)
            if pending and time.monotonic() > deadline:
                named = ", ".join(f"{i} (pid {self.workers[i].pid})" for i in sorted(pending))
                raise BridgeError(
                    f"decomposition workers {named} did not plan their groups of ops within {STARTUP_TIMEOUT_S:.0f} s "
                    f"(a loaded machine may need more: {STARTUP_ENV}=SECONDS)",
                    code=E_TIMEOUT,
                )
            if pending:
                time.sleep(0.005)
        return out, busiest

    def fluid_shard(self, index: int) -> Callable[[], socket.socket] | None:
        """A connector to the fluid shard worker `index` serves in a thread (`fluid_proc_server.serve_in_thread`, a
        local worker's run directory), which waits for the worker to open it (failing, named, if the worker exits
        or takes longer than a worker's start may); None for a Ray worker (its directory is on its host)."""
        if self._placement is not None:
            return None
        w = self.workers[index]
        path = self._root / f"w{index}" / WORKER_SOCKET

        def connect() -> socket.socket:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(str(path))
                    return sock
                except (FileNotFoundError, ConnectionRefusedError):
                    sock.close()
                w.check()
                if time.monotonic() > deadline:
                    raise WorkerDiedError(
                        f"decomposition worker {index} (pid {w.pid}) opened no fluid shard socket within "
                        f"{STARTUP_TIMEOUT_S:g} s"
                    )
                time.sleep(0.005)

        return connect

    def stats(self, index: int) -> dict[str, object]:
        self._ready()
        return self.workers[index].link().stats()

    def records(self, index: int, now: int, elapsed: int) -> dict[str, list[Any]]:
        self._ready()
        msg = self.workers[index].link()._call(encode("get_records", now, elapsed=elapsed), CALL_TIMEOUT_S, "records")
        return records_from_wire(msg["records"])

    def keepalive(self) -> None:
        thread = self._connecting
        if thread is not None and thread is not threading.current_thread():
            return  # (the sockets are the connecting thread's until `_ready`: it heartbeats the connected ones)
        for w in self.workers:
            if w.remote is not None:
                w.remote.keepalive()

    def close(self) -> None:
        """Tell every worker to exit, wait a little, then end the ones still there (ours only, by pid)."""
        if self._closed:
            return
        self._closed = True
        thread = self._connecting
        if thread is not None:  # closed while the workers start: end them, so that the thread stops waiting
            for w in self.workers:
                if w.proc is not None and w.proc.poll() is None:
                    w.proc.kill()
            thread.join()
            self._connecting = None
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


def spawn_workers(
    topology: Topology, config: PacketConfig, assignment: list[list[int]], side: str = "packet"
) -> ServerPool:
    """Start one network server worker per list of pieces (locally, or through Ray with ``config.ray``), each
    hosting the packet side, or with `side` "hybrid" the fluid NVLink hybrid over it (`netsim.hybrid_worker`)."""
    return ServerPool(topology, config, assignment, side)


def _fail_if_stopped(w: Worker, since: dict[int, float]) -> None:
    """WorkerDiedError naming local worker `w` once it has been stopped (state T or t) `WORKER_SILENCE_S` on end
    (`since`: worker index -> when it was first seen stopped) while the driver waits for it outside a round: its
    start (an ns-3 import is silent for long, so only a stop counts; before, the start-up timeout, 180 s)."""
    state = proc_state(w.pid) if w.proc is not None else None
    if state not in STOPPED:
        since.pop(w.index, None)
        return
    first = since.setdefault(w.index, time.monotonic())
    if time.monotonic() - first > WORKER_SILENCE_S:
        raise WorkerDiedError(
            f"decomposition worker {w.index} (pid {w.pid}, pieces {w.pieces}) has been {STOPPED[state]} for "
            f"{WORKER_SILENCE_S:.0f} s while the driver waited for it"
        )


def _endpoint(w: Worker, d: Path) -> str:
    """Wait for a local worker's published endpoint (a Ray worker's came back from its actor)."""
    if w.endpoint is not None:
        return w.endpoint
    path = d / "net.endpoint"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    stopped: dict[int, float] = {}
    while not path.exists():
        w.check()
        _fail_if_stopped(w, stopped)
        if time.monotonic() > deadline:
            raise BridgeError(
                f"decomposition worker {w.index} did not start within {STARTUP_TIMEOUT_S:.0f} s (a loaded machine "
                f"may need more: {STARTUP_ENV}=SECONDS)",
                code=E_TIMEOUT,
            )
        time.sleep(0.02)
    return path.read_text().strip()
