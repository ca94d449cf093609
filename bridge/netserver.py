"""The network server: a process hosting one `NetworkSimulator` (flow or ns-3) behind the protocol.

Run by the launcher as ``python -m bridge.netserver --setup <run_dir>/setup.msgpack``, with the run
token in ``PHANTORA_TOKEN`` (or, under a zygote home, forked as that from a warm interpreter: bridge/warm_start.py).
With ``PHANTORA_CURVE_CLIENTS`` (the driver's public key; required to bind
beyond loopback) it is a CurveZMQ server that lets in that key only, and publishes its own public key in
``<run_dir>/net.key`` (`bridge.curve`). It binds, publishes its endpoint in ``<run_dir>/net.endpoint``, builds
the engine (for ns-3 this pays the module import once), and only then answers the coordinator's
hello: the welcome is the "ready" report, with the start-up time in ``info``.

Bad messages get an error reply and a log line on stderr; they never stop the server. It exits
when told to, when the coordinator has been silent for the peer timeout, or when its parent dies.

A run call (advance, drain, post) with ``beat`` S > 0 (seconds) runs its ns-3 engine in chunks of about S CPU
seconds (`phantora.netsim.heartbeat`: the same events) and sends the peer a ``progress`` message between two, at
most every S: its clock, events and CPU seconds (a decomposition driver's: its workers', merged).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from bridge.columns import completions_to_columns, flows_from_columns
from bridge.curve import clients_from_env
from bridge.errors import BridgeError, ProtocolError
from bridge.liveness import Silence
from bridge.plan_groups import packed_replies
from bridge.protocol import (
    E_AUTH,
    E_ENGINE,
    E_PROTOCOL,
    MAX_MESSAGE_BYTES,
    Message,
    completion_to_wire,
    decode,
    encode,
    flow_from_wire,
    records_to_wire,
    transport_row,
)
from bridge.server_start import server_arguments, start_server
from bridge.stepping import advance_watching
from bridge.transport import (
    HEARTBEAT_S,
    RejectionLog,
    beyond_loopback,
    process_log,
    token_ok,
    write_endpoint_file,
)
from bridge.workers import spawn_workers
from phantora.errors import PhantoraError
from phantora.netsim.base import Completion, NetworkSimulator
from phantora.netsim.decompose import FREEZE_MIN
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.engine_warnings import Tell, to_stderr
from phantora.netsim.factory import make_engine
from phantora.netsim.fluid_proc_server import serve_in_thread
from phantora.netsim.fluid_proc_wire import WORKER_SOCKET
from phantora.netsim.gc_pause import gc_paused, policy_line, use_run_policy
from phantora.netsim.heartbeat import attach_beats, beat_now, detach_beats
from phantora.netsim.hybrid_worker import HybridWorker
from phantora.netsim.nic_latency import NicLatencySimulator
from phantora.netsim.packet import keep_fct_records
from phantora.netsim.raised_bounds import RaisedBounds
from phantora.progress import Beat
from phantora.results.scenario import engine_outcome
from phantora.results.write import write_fabric_traces
from phantora.topology.model import Topology

log = process_log("netserver")


def _plain(stats: dict[str, object]) -> dict[str, Any]:
    """Engine stats restricted to msgpack-able values."""
    out: dict[str, Any] = {}
    for k, v in stats.items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[str(k)] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (int, float, str)) for x in v):
            out[str(k)] = list(v)
        else:
            out[str(k)] = repr(v)
    return out


class NetServer:
    """Serves one engine to one authenticated coordinator."""

    def __init__(
        self,
        sock: zmq.Socket,
        engine: NetworkSimulator,
        token: str,
        info: dict[str, Any],
        max_bytes: int,
        local: bool = True,
        topology: Topology | None = None,
    ) -> None:
        """`local`: the coordinator runs on this machine (ipc or loopback), so its progress can be seen; `topology`:
        the run's, which `plan_groups` plans on (a decomposition worker's)."""
        self.sock = sock
        self.topology = topology
        self.max_bytes = max_bytes
        self.engine = engine
        self.token = token
        self.info = info
        self.peer: bytes | None = None
        self.silence = Silence()  # the coordinator's: busy is not silent (bridge/liveness.py)
        self.local = local
        self.running = True
        self.cpu0 = time.process_time()  # CPU spent serving (the engine is built by now)
        self.rejections = RejectionLog(log)
        self.bounds = RaisedBounds()  # a decomposition worker's completion bounds as last reported
        self.beating: list[Any] | None = None  # what `attach_beats` set, while the peer asks for progress
        self.beat_s = 0.0  # ... at most this often
        self.last_beat = float("-inf")
        self.beats_sent = 0

    def _state_fields(self) -> dict[str, Any]:
        eng = self.engine
        return {"now": eng.now(), "in_flight": eng.in_flight(), "next": eng.next_event_time()}

    def _state(self, type_: str, done: list[Completion] | None = None, **extra: Any) -> bytes:
        eng = self.engine
        fields = self._state_fields()
        if done is not None:
            fields["done"] = [completion_to_wire(c) for c in done]
        return encode(type_, eng.now(), **fields, **extra)

    def _raised_bounds(self, eng: NicLatencySimulator | HybridWorker) -> list[int]:
        """The started flows' completion bounds that rose since the last report, flat: [id, ns, id, ns, ...]."""
        return self.bounds.update(*eng.completion_bound_columns())

    def handle(self, ident: bytes, raw: bytes) -> bytes | None:
        """One request -> its reply (None for one-way messages)."""
        try:
            msg = decode(raw, self.max_bytes)
        except ProtocolError as exc:
            self.rejections(str(exc))
            return encode("error", 0, code=exc.code, text=str(exc))
        if msg.type == "hello":
            return self._hello(ident, msg)
        if ident != self.peer:
            self.rejections(f"{msg.type!r} from an unauthenticated peer")
            return encode("error", 0, code=E_AUTH, text="not authenticated: send hello with the run token first")
        try:
            return self._serve(msg)
        except (PhantoraError, AssertionError, ValueError, KeyError) as exc:
            log(f"{msg.type} failed: {exc}")
            return encode("error", self.engine.now(), code=E_ENGINE, text=f"{type(exc).__name__}: {exc}")

    def _hello(self, ident: bytes, msg: Message) -> bytes:
        if not token_ok(msg["token"], self.token):
            self.rejections(f"hello from pid {msg['pid']}: wrong token")
            return encode("error", 0, code=E_AUTH, text="wrong run token")
        if msg["role"] != "coordinator":
            return encode("error", 0, code=E_AUTH, text=f"the network server serves the coordinator, not {msg['role']}")
        self.peer = ident
        if self.local:
            self.silence.watch(int(msg["pid"]))
        return encode("welcome", 0, role="server", world=None, window_ns=0, lease=0, info=self.info)

    def _beats(self, every_s: float) -> None:
        """Progress from inside the run calls to come, at most every `every_s` (the request's ``beat``; 0: none)."""
        if every_s == self.beat_s:
            return
        if self.beating is not None:
            detach_beats(self.beating)
            self.beating = None
        self.beat_s = every_s
        if every_s > 0:
            self.beating = attach_beats(self.engine, self._send_beat, self.cpu0, every_s)

    def _beat_due(self) -> None:
        """At the end of a run call: a `progress` message if one is due (calls shorter than a chunk report none
        from inside: a decomposition worker's rounds, a live run's advances)."""
        if self.beating is not None and time.monotonic() - self.last_beat >= self.beat_s:
            beat = beat_now(self.beating, self.cpu0)
            if beat is not None:
                self._send_beat(beat)

    def _send_beat(self, beat: Beat) -> None:
        now = time.monotonic()
        if self.peer is None or now - self.last_beat < self.beat_s:
            return
        self.last_beat = now
        self.beats_sent += 1
        self.sock.send_multipart([self.peer, encode("progress", beat.sim_ns, **beat.fields())])  # (never blocks)

    def _serve(self, msg: Message) -> bytes | None:
        eng = self.engine
        if msg.type == "heartbeat":
            return None
        if msg.type in ("advance", "drain", "post"):
            beat = msg.get("beat", 0)
            self._beats(float(beat) if isinstance(beat, (int, float)) and 0 < beat < 3600 else 0.0)
        if msg.type == "submit":
            eng.submit([flow_from_wire(r) for r in msg["flows"]], at=msg["at"])
            return self._state("state")
        if msg.type == "advance":
            done = advance_watching(eng, msg["until"], set(msg["watch"]), msg["earliest"])
            self._beat_due()
            return self._state("completions", done)
        if msg.type == "drain":
            done = eng.drain(msg["limit"])
            self._beat_due()
            return self._state("completions", done)
        if msg.type == "get_transport":
            fabric = eng.fabric()
            rows = [] if fabric is None else [transport_row(t) for t in fabric.flow_transport().values()]
            return encode("transport", eng.now(), rows=rows)
        if msg.type == "post":
            if not isinstance(eng, (NicLatencySimulator, HybridWorker)):
                raise PhantoraError("this server hosts no decomposition worker (post needs nic_latency > 0)")
            cpu0, wall0 = time.process_time(), time.perf_counter()
            _trust_posts(eng)
            with gc_paused():  # (a round makes no cycles; its first, a DAG's worth of flows, set off full passes)
                gates = [(int(g[0]), int(g[1])) for g in msg["gates"]]
                flows = flows_from_columns(msg["flows"])
                eng.post(flows, msg["at"], set(msg["gated"]), gates)
                if len(flows) >= FREEZE_MIN:  # a DAG's worth, kept for the run: out of the collector's full passes
                    gc.freeze()
                ran: list[Completion] = []
                while got := eng.advance_to_completion(msg["until"]):  # INF_NS: until nothing can happen any more
                    ran += got
                bounds = self._raised_bounds(eng)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            self._beat_due()
            state = self._state_fields()
            cols = completions_to_columns(ran, nested=True)  # (what the driver books apart: `rest` read later)
            return encode("posted", eng.now(), **state, done=cols, bounds=bounds, cpu=cpu, wall=wall)
        if msg.type == "plan_groups":
            return self._plan_groups(msg["jobs"])
        if msg.type == "get_records":
            fabric = eng.fabric()
            if fabric is None:
                raise PhantoraError("this server's engine observes no fabric")
            return encode("records", eng.now(), records=records_to_wire(fabric, msg["elapsed"]))
        if msg.type == "get_stats":
            stats = _plain(eng.stats())
            stats["server_cpu_s"] = time.process_time() - self.cpu0
            stats["server_rejected_messages"] = self.rejections.count
            return encode("stats", eng.now(), stats=stats)
        if msg.type == "get_scenario":
            return encode("scenario", eng.now(), scenario=engine_outcome(eng) or {})
        if msg.type == "shutdown":
            self.running = False
            return None
        return encode("error", eng.now(), code=E_PROTOCOL, text=f"the network server does not take {msg.type!r}")

    def _plan_groups(self, jobs: list[Any]) -> bytes:
        """Each job's group of ops planned here (`bridge.plan_groups`), with the CPU seconds it took."""
        if self.topology is None:
            raise PhantoraError("this server was started with no topology to plan on")
        cpu0 = time.process_time()
        packed = packed_replies(self.topology, jobs, MAX_MESSAGE_BYTES - 1024)
        return encode("groups_planned", self.engine.now(), replies=packed, cpu=time.process_time() - cpu0)

    def serve(self, peer_timeout_s: float) -> int:
        """Answer requests until shutdown (0), or until the coordinator is silent too long (4).

        Silence is counted only while the server waits. The time it spends on a request (an ns-3
        advance can take minutes) is its own busy time: the coordinator's heartbeats queue up
        meanwhile, so the clock restarts when the reply has gone, not when the request came. Nor does
        the coordinator's own busy time count (`bridge.liveness.Silence`).
        """
        parent = os.getppid()
        self.silence.heard()
        while self.running:
            if self.sock.poll(int(HEARTBEAT_S * 1000)):
                frames = self.sock.recv_multipart()
                ident, raw = frames[0], b"".join(frames[1:])
                reply = self.handle(ident, raw)
                if reply is not None:
                    self.sock.send_multipart([ident, reply])
                if ident == self.peer:
                    self.silence.heard()
            if os.getppid() != parent:
                log("the launcher died; exiting")
                return 4
            if self.silence.silent_s() > peer_timeout_s:
                log(f"no word from the coordinator for {peer_timeout_s:.0f} s; exiting")
                return 4
        return 0


def _trust_posts(eng: NicLatencySimulator | HybridWorker) -> None:
    """A decomposition worker's flows come from its driver, which checked the whole DAG (`check_packet_batch`: ids,
    endpoints, fields, deps, no cycle) and each flow's route inside its worker's piece, and refuses a bad flow itself
    (`tests/test_worker_side_cost.py`): so neither the NIC-latency layer nor ns-3 checks a posted batch again (a pass
    over the worker's part of the DAG in its first round, on the critical path, and ns-3's at each insertion), as a
    hybrid worker already does (`HybridWorker`). Flows `submit`ted to this server are still checked on entry."""
    if isinstance(eng, NicLatencySimulator):
        eng.trust_posts()


def open_engine(spec: EngineSpec, topo: Topology, warn: Tell = to_stderr) -> NetworkSimulator:
    """The engine a network server hosts: `make_engine`'s, keeping no FCT records (no request of the protocol asks
    for them; a long live run would keep one a flow in ns-3); `warn` is given its warnings when it is built."""
    keep_fct_records(False)
    return make_engine(spec, topo, spawner=spawn_workers, warn=warn)


def write_engine_traces(out: Path, engine: NetworkSimulator, topo: Topology, spec: EngineSpec | None = None) -> None:
    """At a clean shutdown: pfc.csv, queues.csv, drops.csv, links.csv and engine.json (what it ran by, with the
    run's `spec`) of an engine that observes the fabric."""
    fabric = engine.fabric()
    if fabric is None:
        return
    write_fabric_traces(out, fabric, topo, engine.now(), spec)
    log(f"wrote the engine's traces to {out}")


def main(argv: list[str] | None = None) -> int:
    args = server_arguments("python -m bridge.netserver", __doc__).parse_args(argv)
    try:
        start = start_server(args.setup, args.transport, "net", args.bind, clients_from_env())
    except (BridgeError, ValueError, zmq.ZMQError) as exc:
        log(str(exc))
        return 2
    spec, run_dir, token, sock, endpoint = start.spec, start.run_dir, start.token, start.sock, start.endpoint
    try:
        write_endpoint_file(run_dir, "net", endpoint, start.curve_public)
        local = not beyond_loopback(endpoint)
        if local and spec.engine.side == "packet" and spec.engine.packet.nvlink == "fluid":
            # (a decomposition worker: the driver may run a shard of its fluid NVLink side here, on this process's
            # core, beside the packet side: `fluid_procs.ProcShardedFluid`'s links; opened before the engine is
            # built, so a socket that cannot be opened ends the worker at once, named in its last words)
            try:
                serve_in_thread(Path(run_dir) / WORKER_SOCKET)
            except PhantoraError as exc:
                log(str(exc))
                return 3
        t0 = time.perf_counter()
        warnings: list[str] = []  # the engine's, known when it is built: the welcome hands them on (to the launcher)
        try:
            engine = open_engine(spec.engine, spec.topology, warnings.extend)
        except (PhantoraError, ImportError) as exc:
            log(f"cannot build the {spec.network} engine: {exc}")
            return 3
        info = {"network": spec.network, "engine": type(engine).__name__, "startup_s": time.perf_counter() - t0}
        info["pid"] = os.getpid()  # the coordinator judges a silent server by this process's progress (liveness)
        log(f"{info['engine']} ready in {info['startup_s']:.2f} s at {endpoint}")
        for w in warnings:
            log(f"warning: {w}")
        if warnings:
            info["warnings"] = warnings
        use_run_policy()  # (set-up done: what it made lives for the run)
        log(policy_line())
        try:
            server = NetServer(sock, engine, token, info, spec.max_message_bytes, local, spec.topology)
            rc = server.serve(spec.peer_timeout_s)
            if rc == 0 and spec.trace_dir:
                write_engine_traces(Path(spec.trace_dir), engine, spec.topology, spec.engine)
            return rc
        finally:
            engine.close()
    except BridgeError as exc:
        log(str(exc))
        return 3
    finally:
        start.close()


if __name__ == "__main__":
    sys.exit(main())
