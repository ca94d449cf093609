"""The coordinator process: authenticates peers, feeds `CoordinatorCore`, keeps heartbeats going.

Run by the launcher as ``python -m bridge.coordinator --setup <run_dir>/setup.msgpack
[--net-endpoint E]``, with the run token in ``PHANTORA_TOKEN`` (or, under a zygote home, forked as that from a warm
interpreter: bridge/warm_start.py). The engine lives in this process
(flow mode, by default) or in the network server at ``--net-endpoint``. It binds one ROUTER,
publishes it in ``<run_dir>/coord.endpoint``, and serves ranks and the supervisor on it.

Exit codes: 0 run complete (the outcome went to the supervisor), 3 the run failed (the
diagnostic went to every peer), 4 lost the supervisor.

With `RunSpec.progress_s` it passes the network's progress from inside long engine calls on to the supervisor
(`progress` messages): the network server's, which it asks for (`RemoteSimulator.beat`), or an ns-3 engine's in
this process (`phantora.netsim.heartbeat.attach_beats`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from bridge.core import BARRIER, DONE, TEST, WAIT, CoordinatorCore
from bridge.errors import BridgeError, ProtocolError, RunFailed
from bridge.jobs import JobTable
from bridge.launcher_pid import launcher_pid
from bridge.liveness import Silence
from bridge.protocol import (
    E_AUTH,
    E_ENGINE,
    E_INTERNAL,
    E_PEER,
    E_PROTOCOL,
    INF_NS,
    Message,
    decode,
    encode,
    flow_from_wire,
)
from bridge.remote import RemoteSimulator
from bridge.runspec import RunSpec
from bridge.server_start import server_arguments, start_server
from bridge.transport import (
    HEARTBEAT_S,
    STARTUP_TIMEOUT_S,
    RejectionLog,
    process_log,
    token_ok,
    write_endpoint_file,
)
from bridge.workers import spawn_workers
from phantora.errors import PhantoraError
from phantora.netsim.base import NetworkSimulator
from phantora.netsim.factory import make_engine
from phantora.netsim.gc_pause import policy_line, use_run_policy
from phantora.netsim.heartbeat import attach_beats
from phantora.progress import Beat
from phantora.results.write import write_engine_json, write_packet_traces

log = process_log("coordinator")


class Coordinator:
    """The socket side of the coordinator."""

    def __init__(self, spec: RunSpec, sock: zmq.Socket, token: str) -> None:
        self.spec = spec
        self.sock = sock
        self.token = token
        self.rank_of: dict[bytes, int] = {}
        self.ident_of: dict[int, bytes] = {}
        self.supervisor: bytes | None = None
        self.for_supervisor: list[bytes] = []  # what it was told before its hello was read: sent after its welcome
        self.launcher = Silence(launcher_pid())  # the launcher's silence: busy is not silent (bridge/liveness.py)
        self.last_beat = 0.0
        self.core: CoordinatorCore | None = None
        self.rejections = RejectionLog(log)
        self.t_started = time.monotonic()
        self.t_all_connected: float | None = None  # wall clock when the last rank said hello
        self.cpu_all_connected = 0.0
        self.jobs: JobTable | None = None  # several jobs (set by attach)
        self.warnings: list[str] = []  # the engine's, known when it was built: told to the launcher in its welcome

    def attach(self, engine: NetworkSimulator) -> None:
        spec = self.spec
        self.jobs = JobTable(spec.jobs) if spec.jobs else None
        self.core = CoordinatorCore(
            engine,
            spec.topology,
            spec.world,
            window_ns=spec.window_ns,
            algo=spec.algo_options(),
            send=self.send_rank,
            keep_flows=spec.keep_flows,
            live=spec.live or None,
            jobs=self.jobs,
            all_or_nothing=spec.all_or_nothing,
            background=[flow_from_wire(row) for row in spec.background],
        )
        self.core.on_round = self.heartbeat  # a long run of engine advances must not look like silence
        self.core.on_job_failed = self.job_failed
        if isinstance(engine, RemoteSimulator):  # the packet engine's per-flow counters live on the server
            self.core.transport_rows = engine.flow_transport_rows
        if spec.progress_s > 0:
            if isinstance(engine, RemoteSimulator):
                engine.beat, engine.on_beat = spec.progress_s, self.pass_beat
            else:
                attach_beats(engine, self.pass_beat, time.process_time(), spec.progress_s)

    def pass_beat(self, beat: Beat) -> None:
        """The network's progress from inside an engine call, to the launcher."""
        self.send_supervisor(encode("progress", beat.sim_ns, **beat.fields()), keep=False)

    def job_failed(self, job: int, code: str, text: str) -> None:
        """Only one job ended: say so in the log and to the launcher, which stops that job's processes."""
        assert self.jobs is not None
        log(f"job {self.jobs.jobs[job].name} failed ({code}): {text}")
        self.send_supervisor(encode("jobfail", 0, job=job, code=code, text=text))

    # ----- sending -----------------------------------------------------------------------------
    def send_rank(self, rank: int, raw: bytes) -> None:
        ident = self.ident_of.get(rank)
        if ident is not None:
            self.sock.send_multipart([ident, raw])

    def send_supervisor(self, raw: bytes, keep: bool = True) -> None:
        """To the launcher; before its hello is read (a ROUTER drops what it cannot route), kept for its welcome
        unless `keep` is False (a heartbeat, a progress beat: stale by then)."""
        if self.supervisor is not None:
            self.sock.send_multipart([self.supervisor, raw])
        elif keep:
            self.for_supervisor.append(raw)

    def heartbeat(self) -> None:
        """About once a second: tell blocked ranks and the supervisor we are alive."""
        if time.monotonic() - self.last_beat < HEARTBEAT_S:
            return
        self.last_beat = time.monotonic()
        beat = encode("heartbeat", 0)
        self.send_supervisor(beat, keep=False)
        if self.core is not None:
            for rs in self.core.ranks:
                if rs.state in (WAIT, TEST, BARRIER):
                    self.send_rank(rs.rank, beat)
            self.core.engine.keepalive()

    # ----- receiving ---------------------------------------------------------------------------
    def reject(self, ident: bytes, code: str, text: str) -> None:
        self.rejections(text)
        self.sock.send_multipart([ident, encode("error", 0, code=code, text=text)])

    def on_frames(self, frames: list[bytes]) -> None:
        ident, raw = frames[0], b"".join(frames[1:])
        try:
            msg = decode(raw, self.spec.max_message_bytes)
        except ProtocolError as exc:
            self.reject(ident, exc.code, str(exc))
            return
        if msg.type == "hello":
            self.on_hello(ident, msg)
            return
        if ident == self.supervisor:
            self.launcher.heard()
            self.on_supervisor(msg)
            return
        rank = self.rank_of.get(ident)
        if rank is None:
            self.reject(ident, E_AUTH, f"{msg.type!r} from a peer that has not said hello with the run token")
            return
        if msg.type == "heartbeat":
            return
        assert self.core is not None
        self.core.on_message(rank, msg)

    def on_hello(self, ident: bytes, msg: Message) -> None:
        if not token_ok(msg["token"], self.token):
            self.reject(ident, E_AUTH, f"hello from pid {msg['pid']} with a wrong run token")
            return
        role = msg["role"]
        info: dict[str, Any] = {"pid": os.getpid()}
        window = self.spec.window_ns
        world = self.spec.world
        if role == "supervisor":
            self.launcher.heard()
            if self.warnings:
                info = {**info, "warnings": self.warnings}
            if self.t_all_connected is not None:  # the ranks were quicker: what they did waits in for_supervisor
                log(
                    f"the launcher said hello after the ranks had joined, {time.monotonic() - self.t_started:.1f} s "
                    "after the coordinator began"
                )
        elif role == "rank":
            live = self.spec.live_ranks
            rank, world, why = self._hello_rank(msg)
            if why:
                self.reject(ident, E_PROTOCOL, why)
                return
            if rank in self.ident_of:
                self.reject(ident, E_PROTOCOL, f"rank {rank} is already connected")
                return
            failed = self.core.failed_job_of(rank) if self.core is not None else None
            if failed is not None:  # a rank of a job that failed before this rank started
                self.sock.send_multipart([ident, encode("error", 0, code=failed["code"], text=failed["text"])])
                return
            self.rank_of[ident] = rank
            self.ident_of[rank] = ident
            if len(self.ident_of) == live:
                self.t_all_connected = time.monotonic()
                took = self.t_all_connected - self.t_started
                log(f"all {live} live ranks joined, {took:.1f} s after the coordinator began")  # start-up is over
                self.cpu_all_connected = time.process_time()
                self.send_supervisor(encode("joined", 0, ranks=live))  # start-up is over
        else:
            self.reject(ident, E_AUTH, f"unknown role {role!r}")
            return
        lease = window if window else INF_NS
        if role == "rank":
            info = {**info, "live": live}  # rank deduplication: the live ranks standing for the world
        self.sock.send_multipart(
            [ident, encode("welcome", 0, role="coordinator", world=world, window_ns=window, lease=lease, info=info)]
        )
        if role == "supervisor" and self.supervisor is None:
            self.supervisor = ident
            kept, self.for_supervisor = self.for_supervisor, []
            for raw in kept:
                self.send_supervisor(raw)

    def _hello_rank(self, msg: Message) -> tuple[int, int, str]:
        """(global rank, the world the rank belongs to, "") of a rank's hello, or the reason to refuse it."""
        rank, world, job = msg["rank"], msg["world"], msg.get("job")
        if self.jobs is None:
            live = self.spec.live_ranks
            if rank is None or not 0 <= rank < live or world != self.spec.world or job not in (None, 0):
                return 0, 0, f"hello from rank {rank} of {world}: this run has {self.spec.world} ranks, {live} live"
            return rank, world, ""
        if not isinstance(job, int) or not 0 <= job < len(self.jobs):
            return 0, 0, f"hello from rank {rank} with job {job!r}: this run has jobs 0..{len(self.jobs) - 1}"
        j = self.jobs.jobs[job]
        if rank is None or not 0 <= rank < j.ranks or world != j.ranks:
            return 0, 0, f"hello from rank {rank} of {world} in job {j.name}, which has {j.ranks} ranks"
        return j.offset + rank, world, ""

    def on_supervisor(self, msg: Message) -> None:
        if msg.type == "exited" and msg["who"] == "rank" and msg["rank"] is not None:
            assert self.core is not None
            rs = self.core.ranks[msg["rank"]]
            if rs.state != DONE:
                self.drain_queued()  # a mismatch or protocol error the ranks already sent is the real cause
                self.core.rank_exited(rs.rank, msg["code"])
        elif msg.type == "shutdown":
            raise RunFailed(E_PEER, f"stopped by the launcher: {msg['reason']}")
        elif msg.type == "where":
            now = self.core.engine.now() if self.core is not None else 0
            self.send_supervisor(encode("stood", now, ranks=self.core.stood() if self.core is not None else []))

    def drain_queued(self) -> int:
        """Handle every message already queued on the socket (without waiting for more); return how many."""
        n = 0
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return n
            n += 1
            self.on_frames(frames)
            self.heartbeat()  # a burst of requests (each collective decomposed) must not look like silence

    # ----- the loop ----------------------------------------------------------------------------
    def fail(self, code: str, text: str) -> None:
        """Tell every peer the run failed."""
        log(f"run failed ({code}): {text}")
        err = encode("error", self.core.engine.now() if self.core else 0, code=code, text=text)
        for ident in self.ident_of.values():
            self.sock.send_multipart([ident, err])
        self.send_supervisor(err)

    def serve(self) -> int:
        core = self.core
        assert core is not None
        parent = os.getppid()
        unanswered = 0  # messages taken after the last progress(): act on them before sleeping again
        while True:
            if unanswered or self.sock.poll(int(HEARTBEAT_S * 1000)):
                self.drain_queued()
            core.progress()
            if core.all_finished() and self.supervisor is not None:  # the outcome needs the launcher's hello
                outcome = core.finalize()
                outcome["rejected"] = self.rejections.count
                outcome["sim_wall_s"] = time.monotonic() - (self.t_all_connected or time.monotonic())
                outcome["coordinator_cpu_s"] = time.process_time() - self.cpu_all_connected
                self.send_supervisor(encode("outcome", core.engine.now(), outcome=outcome))
                return 0
            self.heartbeat()
            # The launcher's heartbeats queue up while the engine runs (an ns-3 advance can take
            # minutes): read them before judging its silence, or busy time would count as silence.
            # Ranks' requests read here are answered at once by the next round, not after a poll.
            unanswered = self.drain_queued()
            if os.getppid() != parent:
                log("the launcher died; exiting")
                return 4
            if self.launcher.silent_s() > self.spec.peer_timeout_s:
                log(f"no word from the launcher for {self.spec.peer_timeout_s:.0f} s; exiting")
                return 4


def write_local_traces(out: Path, engine: NetworkSimulator, spec: RunSpec) -> None:
    """After the outcome, an engine in this process that observes the fabric (ns-3 with a scenario at a step):
    pfc.csv, queues.csv, drops.csv, cnps.csv, ecn_marks.csv and engine.json, as a network server writes them
    (links.csv came with the outcome)."""
    fabric = engine.fabric()
    if fabric is None:
        return
    write_packet_traces(out, spec.topology, fabric)
    write_engine_json(out, fabric.effective(), spec.engine, spec.topology)
    log(f"wrote the engine's traces to {out}")


def main(argv: list[str] | None = None) -> int:
    p = server_arguments("python -m bridge.coordinator", __doc__)
    p.add_argument("--net-endpoint", default=None, help="the network server; default: engine in this process")
    args = p.parse_args(argv)
    try:
        start = start_server(args.setup, args.transport, "coord")
    except BridgeError as exc:
        log(str(exc))
        return 2
    spec, run_dir, token, ctx, sock = start.spec, start.run_dir, start.token, start.ctx, start.sock
    coord = Coordinator(spec, sock, token)
    engine: Any = None
    code = 3
    try:
        write_endpoint_file(run_dir, "coord", start.endpoint)
        if args.net_endpoint:
            engine = RemoteSimulator(
                ctx,
                args.net_endpoint,
                token,
                startup_timeout_s=STARTUP_TIMEOUT_S,
                call_timeout_s=spec.server_timeout_s,
                on_wait=coord.heartbeat,
                silence_s=spec.peer_timeout_s,  # a stopped server ends the run as a stopped coordinator does
            )
            coord.warnings = list(engine.info.get("warnings") or [])
        else:
            engine = make_engine(spec.engine, spec.topology, spawner=spawn_workers, warn=coord.warnings.extend)
        for w in coord.warnings:
            log(f"warning: {w}")
        coord.attach(engine)
        use_run_policy()  # (set-up done: what it made lives for the run)
        log(policy_line())
        code = coord.serve()
        if code == 0 and not args.net_endpoint and spec.trace_dir:
            write_local_traces(Path(spec.trace_dir), engine, spec)
    except RunFailed as exc:
        coord.fail(exc.code, exc.text)
    except BridgeError as exc:
        coord.fail(exc.code if exc.code != "bridge" else E_ENGINE, str(exc))
    except PhantoraError as exc:
        coord.fail(E_ENGINE, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug: still tell the peers, so nobody hangs
        coord.fail(E_INTERNAL, f"coordinator crashed: {type(exc).__name__}: {exc}")
        raise
    finally:
        if engine is not None:
            engine.close()
        time.sleep(0.05)  # let the last messages leave before the socket closes
        sock.close(linger=3000 if code == 0 else 500)  # the outcome must reach the launcher, even when starved
        ctx.term()
    return code


if __name__ == "__main__":
    sys.exit(main())
