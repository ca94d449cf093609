"""`CosimRun`: start a co-simulation (network server, coordinator, N ranks), supervise it, collect results.

    from bridge.run import CosimRun
    result = CosimRun(topo, EngineSpec("flow"), rank_cmd=[sys.executable, "train.py"], world_size=8).run()

The launcher (this process) is the supervisor: it watches every child, and the death of any of
them stops the whole run within about a second, naming the culprit (`BridgeError`). Ranks are
arbitrary commands; each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, PHANTORA_ENDPOINT, PHANTORA_TOKEN, PHANTORA_RUN_DIR (and PHANTORA_NETWORK) and talks
to the coordinator with `bridge.client.RankClient.from_env()`.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from bridge import torchrun_env, warm_start
from bridge.client import PEER_LOST_EXIT
from bridge.completion_log import alone_from
from bridge.errors import BridgeError, ProtocolError
from bridge.forkclient import ForkServer
from bridge.jobs import JobInfo, JobProcs, JobTable
from bridge.liveness import Silence
from bridge.protocol import (
    MAX_MESSAGE_BYTES,
    completion_from_wire,
    decode,
    encode,
    flows_to_wire,
    transport_from_rows,
)
from bridge.rank_watch import RankWatch, kill
from bridge.runspec import RunSpec, options_to_dict
from bridge.supervisor import Child, spawn, stop_all
from bridge.transport import (
    HEARTBEAT_S,
    OUTCOME_MAX_BYTES,
    STARTUP_TIMEOUT_S,
    TRANSPORTS,
    connect_dealer,
    endpoint_file,
    make_run_dir,
    new_token,
    remove_run_dir,
    send_heartbeat,
)
from phantora.collectives.nccl import with_nccl_env
from phantora.collectives.nccl.settings import RUN_ENV, run_env_value
from phantora.collectives.spec import AlgoOptions
from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.engine_warnings import Tell, to_stderr
from phantora.netsim.ns3_build import ensure_built
from phantora.netsim.observe import ChannelUsage, FlowTransport, PacketChannelUsage
from phantora.netsim.standalone import Alone
from phantora.progress import Beat
from phantora.results import schema
from phantora.results.run_dir import RunDir
from phantora.results.write import flows_csv_count, write_flows_csv, write_links_csv
from phantora.topology.model import Topology

RankCmd = Sequence[str] | Callable[[int], Sequence[str]]


@dataclass
class CosimResult:
    """What a co-simulation run produced."""

    ranks: dict[int, Any]  # rank -> the results dict it passed to finish()
    finish_ns: dict[int, int]  # rank -> its clock at finish()
    collectives: list[dict[str, Any]]  # one record per collective/transfer, in launch order
    completions: list[Completion]  # every flow (empty with keep_flows=False or past core.MAX_KEPT_FLOWS)
    rounds: int  # engine advances (barrier rounds in window mode)
    wall_s: float  # whole run, launch to last exit
    sim_wall_s: float  # the co-simulation proper: from the last rank's hello to the outcome (no start-up)
    makespan_ns: int  # the network's time at the end
    window_ns: int
    network: str
    engine_stats: dict[str, Any]
    messages: int
    late_collectives: int  # started later than requested (window mode error)
    rejected_messages: int  # malformed, unauthenticated or oversized messages the coordinator refused
    logs: dict[str, str] = field(default_factory=dict)  # "rank 0", "coordinator", "server" -> log text
    startup_s: float = 0.0  # launch until the coordinator answered the launcher (network server ready)
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU of the run phase: coordinator, server, ranks
    flows_note: str = ""  # why `completions` is empty although flows ran
    # per-channel traffic of an engine in the coordinator (links.csv); the network server writes its own
    links: list[ChannelUsage | PacketChannelUsage] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)  # several jobs: name, offset, ranks, status, error ...
    background: list[Completion] = field(default_factory=list)  # the recorded jobs' flows (CosimRun(background=))
    alone: dict[int, Alone] = field(default_factory=dict)  # flow id -> ECMP key and rate cap (not the defaults) kept
    transport: dict[int, FlowTransport] = field(default_factory=dict)  # packet engine: flow id -> its counters
    # bytes of the ranks' flows: "network" (between endpoints), "fabric" (of those, routed through a switch)
    traffic_bytes: dict[str, int] = field(default_factory=dict)
    scenario: dict[str, Any] = field(default_factory=dict)  # a scenario's engine: link actions applied, steps started
    coordinator_busy_s: float = 0.0  # its longest silence spent working, not counted against it (bridge/liveness.py)
    warnings: list[str] = field(default_factory=list)  # the engine's, told when it was built (engine_warnings)

    def collective(self, name: str) -> dict[str, Any]:
        """The record of the collective issued under `name`."""
        for rec in self.collectives:
            if rec["name"] == name:
                return rec
        raise KeyError(name)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TRACE_WAIT_S = 600.0  # after the run, the network server writes the fabric traces: wait for it this long at most
VICTIM_GRACE_S = 2.0  # how long a rank that lost a peer's connection waits to be blamed (see PEER_LOST_EXIT)
LAST_WORDS_S = 5.0  # how long a coordinator that exited with code 0 has for its outcome to arrive
STOOD = {"wait": "waiting", "test": "polling", "barrier": "at its window's barrier"}  # the coordinator's rank states
WHERE_S = 3.0  # how long a run past its bound asks the coordinator where the ranks stood (it may be in the network)
SPAWNER_LOG = "spawner"  # logs/spawner.log: the output of a program that starts its ranks itself


def _module_form(cmd: Sequence[str], python: str) -> bool:
    """Is `cmd` `python -m MODULE ...` with this interpreter (so a fork server can run it)?"""
    return len(cmd) >= 3 and cmd[0] == python and cmd[1] == "-m"


def _rank_hosts(topo: Topology, world: int, offset: int = 0) -> list[Any]:
    """The host of each of the ranks offset..offset+world-1 (a job's), None where the topology names none."""
    return [topo.nodes[topo.node_of_rank(offset + r)].host for r in range(world)]


def _local_ranks(hosts: Sequence[Any]) -> list[tuple[int, int]]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) of each rank among the ranks on its host (`_rank_hosts`: one host if any is
    unknown)."""
    if any(h is None for h in hosts):
        return [(r, len(hosts)) for r in range(len(hosts))]
    size = Counter(hosts)
    seen: Counter[Any] = Counter()
    out = []
    for h in hosts:
        out.append((seen[h], size[h]))
        seen[h] += 1
    return out


class CosimRun:
    """One co-simulation run: configure in the constructor, then `run()` (once)."""

    def __init__(
        self,
        topology: Topology,
        engine: EngineSpec | None = None,
        *,
        rank_cmd: RankCmd | None = None,
        spawner_cmd: Sequence[str] | None = None,
        jobs: Sequence[JobProcs] = (),
        all_or_nothing: bool = True,
        background: Sequence[Flow] = (),
        world_size: int | None = None,
        live_ranks: int | None = None,
        engine_in_coordinator: bool | None = None,
        algo: AlgoOptions | None = None,
        env: dict[str, str] | None = None,
        rank_env: dict[str, str] | None = None,
        out_dir: str | Path | None = None,
        transport: str = "ipc",
        keep_flows: bool = True,
        timeout_s: float | None = None,
        peer_timeout_s: float = 30.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        cwd: str | None = None,
        python: str = sys.executable,
        rank_preload: Sequence[str] = (),
        on_progress: Callable[[Beat], None] | None = None,
        progress_s: float = 0.5,
        on_warnings: Tell = to_stderr,
    ) -> None:
        """`engine`: the network engine and the window W (default: the flow engine, exact).
        `engine_in_coordinator`: None = yes for flow, no for ns3 (ns-3 in the coordinator works, but
        stops its heartbeats during long engine calls).
        `live_ranks`: rank deduplication: start only ranks 0..live_ranks-1, each standing for itself and
        its shifts by multiples of live_ranks (phantora.collectives.mirrors); it must divide the world size.
        `rank_preload`: modules a fork server (bridge.forkserver) imports once, before it forks every
        rank whose command is `python -m MODULE ...` with the same interpreter; empty: every rank is a
        fresh interpreter. `jobs`: several jobs instead of `rank_cmd` (bridge.jobs): job j's ranks are the
        global ranks after job j-1's, each job has its own world and rendezvous, and unless `all_or_nothing`
        one job's failure ends only that job (`CosimResult.jobs` says which failed and why). `background`:
        recorded jobs' flow DAG (ids 0..n-1), run by the same engine from time 0 (`CosimResult.background`).
        `spawner_cmd` instead of `rank_cmd`: the program starts its ranks itself (torch.multiprocessing.spawn): the
        run starts this one launching process, no rank, with the ranks' common environment, LOCAL_WORLD_SIZE = the
        world (its host's GPUs) and PHANTORA_LOG_DIR; the processes it starts are the ranks (phantora.runtime.spawned)
        and write their own logs there. Its exit ends nothing by itself; a non-zero exit stops the run.
        `on_progress`: given the network's progress from inside long engine calls (a `Beat` at most every
        `progress_s`, from the network server or its workers, or an ns-3 engine in the coordinator). `on_warnings`:
        given the engine's warnings as soon as the coordinator's welcome brings them, when the engine is built
        (`phantora.netsim.engine_warnings`; default: stderr); `CosimResult.warnings` keeps them.
        `env`: added to every rank's environment and the fork server's; `rank_env`: added to the ranks' only, under
        `env` (settings the ranks read when they start their script, never at import: a fork server's start-up, and
        so its zygote (bridge/zygote.py), is then the same for runs that differ only in them)."""
        engine = engine or EngineSpec()
        if transport not in TRANSPORTS:
            raise InputError(f"unknown transport {transport!r} (known: {', '.join(TRANSPORTS)})", field="transport")
        if jobs:
            if rank_cmd is not None or live_ranks is not None:
                raise InputError("several jobs take their own commands and run every rank live", field="jobs")
            world_size = world_size or sum(j.ranks for j in jobs)
        elif (rank_cmd is None) == (spawner_cmd is None):
            raise InputError("a run needs rank_cmd or spawner_cmd (or jobs)", field="rank_cmd")
        world = topology.num_ranks if world_size is None else world_size
        if not 1 <= world <= topology.num_ranks:
            raise InputError(
                f"world size {world} does not fit '{topology.name}' ({topology.num_ranks} endpoints)",
                field="world_size",
            )
        live = world if live_ranks is None else live_ranks
        if not 1 <= live <= world or world % live:
            raise InputError(
                f"live ranks must divide the world size ({world}) and be at least 1, got {live_ranks}",
                field="live_ranks",
            )
        in_coord = engine.network == "flow" if engine_in_coordinator is None else engine_in_coordinator
        self.jobs = list(jobs)
        infos, offset = [], 0
        for j in self.jobs:
            infos.append(JobInfo(j.name, offset, j.ranks, j.priority).to_dict())
            offset += j.ranks
        if jobs and offset != world:
            raise InputError(f"the jobs have {offset} ranks, the run {world}", field="world_size")
        self.job_table = JobTable(infos) if infos else None
        run_algo = with_nccl_env(algo or AlgoOptions(), env)
        self.nccl_env = run_algo.nccl_env or ()  # the NCCL_* the coordinator's model holds (ranks: RUN_ENV)
        self.spec = RunSpec(
            topology=topology,
            world=world,
            live=live if live < world else 0,
            engine=engine,
            engine_in_coordinator=in_coord,
            algo=options_to_dict(run_algo),
            keep_flows=keep_flows,
            peer_timeout_s=peer_timeout_s,
            max_message_bytes=max_message_bytes,
            trace_dir=str(Path(out_dir).resolve()) if out_dir is not None else "",
            jobs=infos,
            all_or_nothing=all_or_nothing,
            background=flows_to_wire(background),
            progress_s=progress_s if on_progress is not None else 0.0,
        )
        self.on_progress = on_progress
        self.on_warnings = on_warnings
        self.warnings: list[str] = []
        self.rank_cmd = rank_cmd
        self.spawner_cmd = None if spawner_cmd is None else [str(c) for c in spawner_cmd]
        if self.spawner_cmd is not None and live != world:
            raise InputError("the ranks a program starts itself are all live (no deduplication)", field="live_ranks")
        self.env = dict(env or {})
        self.rank_env = dict(rank_env or {})
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.transport = transport
        self.timeout_s = timeout_s
        self.cwd = cwd
        self.python = python
        self.rank_preload = tuple(rank_preload)
        self.children: list[Child] = []
        self.job_failures: dict[int, dict[str, str]] = {}  # several jobs: job -> its failure (from the coordinator)
        self._deaths: dict[int, str] = {}  # several jobs: job -> how its first dead rank died (log tail)
        self.coordinator_silence: Silence | None = None  # the launcher's silence clock on the coordinator
        self._forker: ForkServer | None = None
        self._server_forkers: list[ForkServer] = []  # those that forked the coordinator and network server
        self.run_dir: Path | None = None

    # ----- start-up ----------------------------------------------------------------------------
    def _wait_endpoint(self, name: str, child: Child, timeout_s: float) -> str:
        assert self.run_dir is not None
        path = endpoint_file(self.run_dir, name)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if child.proc.poll() is not None:
                raise BridgeError(f"{child.label} {child.exit_text()} during start-up:\n{child.log_tail()}")
            if time.monotonic() > deadline:
                raise BridgeError(f"{child.label} did not publish its endpoint within {timeout_s:.0f} s")
            time.sleep(0.01)
        return path.read_text()

    def _base_env(self, ranks: bool = False) -> dict[str, str]:
        """The environment of every rank minus the run's endpoints and its rank variables; without `rank_env`
        unless `ranks`: the fork server's."""
        env = dict(os.environ)
        # One intra-op thread per rank unless the user says otherwise (as torchrun does): many rank
        # processes share few cores, and each one's idle OpenMP threads would spin on them
        # (10-20x the CPU per step of gpt_ddp.py with 4 ranks on 2 cores; docs/runtime.md).
        env.setdefault("OMP_NUM_THREADS", "1")
        if ranks:
            env.update(self.rank_env)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _common_env(self, endpoint: str, token: str, port: int) -> dict[str, str]:
        """The environment every rank shares."""
        return {
            **self._base_env(ranks=True),
            "WORLD_SIZE": str(self.spec.world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PHANTORA_ENDPOINT": endpoint,
            "PHANTORA_TOKEN": token,
            "PHANTORA_RUN_DIR": str(self.run_dir),
            "PHANTORA_NETWORK": self.spec.network,
            "PHANTORA_PEER_TIMEOUT_S": str(self.spec.peer_timeout_s),
            RUN_ENV: run_env_value(self.nccl_env),  # a rank whose own NCCL_* differ sends them (a job's `env` table)
        }

    @staticmethod
    def _rank_env(
        common: dict[str, str], rank: int, local: tuple[int, int], node: tuple[int, int] = (0, 1)
    ) -> dict[str, str]:
        """A rank's environment as torchrun's worker has it (node: GROUP_RANK, GROUP_WORLD_SIZE; torchrun_env)."""
        world = int(common["WORLD_SIZE"])
        ids = {"RANK": str(rank), "LOCAL_RANK": str(local[0]), "LOCAL_WORLD_SIZE": str(local[1])}
        return {**common, **torchrun_env.worker_env(rank, world, node), **ids}

    def _start(self, token: str, logs: RunDir) -> str:
        """Start server (if any) and coordinator; return the coordinator's endpoint."""
        assert self.run_dir is not None
        setup = self.run_dir / "setup.msgpack"
        self.spec.write(setup)
        env = dict(os.environ, PHANTORA_TOKEN=token, PYTHONUNBUFFERED="1")
        args = ["--setup", str(setup), "--transport", self.transport]
        if not self.spec.engine_in_coordinator:
            server = self._start_server("server", "bridge.netserver", args, env, logs)
            args += ["--net-endpoint", self._wait_endpoint("net", server, 60.0)]
        coord = self._start_server("coordinator", "bridge.coordinator", args, env, logs)
        return self._wait_endpoint("coord", coord, 60.0)

    def _start_server(self, role: str, module: str, args: list[str], env: dict[str, str], logs: RunDir) -> Child:
        """`python -m module args...` as a child of the run, forked from a zygote under a home (bridge/warm_start)."""
        assert self.run_dir is not None
        child, forker = warm_start.start(role, module, args, self.python, env, logs.log(role), self.cwd, self.run_dir)
        if forker is not None:
            self._server_forkers.append(forker)
        self.children.append(child)
        return child

    def _rank_cmds(self) -> list[list[str]]:
        if self.job_table is not None:
            return [[str(c) for c in self.jobs[self.job_table.job_of(r)].cmd] for r in range(self.spec.world)]
        if self.spawner_cmd is not None:
            return [self.spawner_cmd]
        cmd = self.rank_cmd
        assert cmd is not None
        return [[str(c) for c in (cmd(r) if callable(cmd) else cmd)] for r in range(self.spec.live_ranks)]

    def _start_fork_server(self, cmds: list[list[str]], logs: RunDir) -> None:
        """Start the fork server first, so its imports overlap the server's and coordinator's start-up."""
        if self.rank_preload and any(_module_form(c, cmds[0][0]) for c in cmds):
            self._forker = ForkServer.start(
                cmds[0][0], self.rank_preload, self._base_env(), logs.log("forkserver"), self.cwd
            )
            self.children.append(self._forker.child)

    @staticmethod
    def _beat_every(sock: zmq.Socket) -> Callable[[], None]:
        """A tick that sends the coordinator a heartbeat at most every HEARTBEAT_S: starting the ranks can take
        longer than its silence limit (the fork server imports torch first, minutes on a loaded machine)."""
        last = [time.monotonic()]

        def tick() -> None:
            if time.monotonic() - last[0] >= HEARTBEAT_S:
                send_heartbeat(sock, encode("heartbeat", 0))
                last[0] = time.monotonic()

        return tick

    def _start_ranks(
        self, cmds: list[list[str]], endpoint: str, token: str, logs: RunDir, tick: Callable[[], None]
    ) -> None:
        common = self._common_env(endpoint, token, _free_port())
        if self.job_table is not None:
            self._start_job_ranks(cmds, common, logs, tick)
            return
        if self.spawner_cmd is not None:
            env = {**common, "LOCAL_WORLD_SIZE": str(self.spec.world), "PHANTORA_LOG_DIR": str(logs.logs)}
            child = self._start_rank(-1, self.spawner_cmd, env, logs.log(SPAWNER_LOG), cmds[0][0], tick)
            child.role, child.rank = "spawner", None
            self.children.append(child)
            return
        hosts = _rank_hosts(self.spec.topology, self.spec.world)
        local, nodes = _local_ranks(hosts), torchrun_env.node_ranks(hosts)
        for r, cmd in enumerate(cmds):
            env, log = self._rank_env(common, r, local[r], nodes[r]), logs.log(f"rank{r}")
            self.children.append(self._start_rank(r, cmd, env, log, cmds[0][0], tick))

    def _start_rank(
        self, r: int, cmd: list[str], env: dict[str, str], log: Path, python: str, tick: Callable[[], None]
    ) -> Child:
        tick()
        if self._forker is not None and _module_form(cmd, python):
            return self._forker.fork(r, cmd[2], cmd[3:], env, log, self.cwd, tick)
        return spawn("rank", r, cmd, env, log, self.cwd)

    def _start_job_ranks(
        self, cmds: list[list[str]], common: dict[str, str], logs: RunDir, tick: Callable[[], None]
    ) -> None:
        """Each job's ranks: its own world, rank numbers, rendezvous port, environment and logs."""
        assert self.job_table is not None
        for j, (job, info) in enumerate(zip(self.jobs, self.job_table.jobs, strict=True)):
            base = {**common, **job.env, "WORLD_SIZE": str(job.ranks), "MASTER_PORT": str(_free_port())}
            base["PHANTORA_JOB"] = str(j)
            hosts = _rank_hosts(self.spec.topology, job.ranks, info.offset)
            local, nodes = _local_ranks(hosts), torchrun_env.node_ranks(hosts)
            for r in range(job.ranks):
                g = info.offset + r
                env, log = self._rank_env(base, r, local[r], nodes[r]), logs.log(f"{job.name}.rank{r}")
                child = self._start_rank(g, cmds[g], env, log, cmds[0][0], tick)
                child.job, child.local = job.name, r
                self.children.append(child)

    # ----- supervision -------------------------------------------------------------------------
    def _supervise(self, sock: zmq.Socket, t0: float) -> tuple[dict[str, Any], float, float]:
        """Watch children and the coordinator until the outcome; raise BridgeError on any failure."""
        coord = next(c for c in self.children if c.role == "coordinator")
        silence = self.coordinator_silence = Silence(coord.pid)  # busy is not silent: bridge/liveness.py
        last_beat = 0.0
        welcomed_at: float | None = None
        joined = False  # every live rank has connected to the coordinator: start-up is over
        victim_until: dict[int, float] = {}  # pid of a rank that exited with PEER_LOST_EXIT -> when to blame it
        isolate = self.job_table is not None and not self.spec.all_or_nothing
        assert self.run_dir is not None
        watch = RankWatch(self.run_dir, self.spec.peer_timeout_s)  # stopped or wedged ranks (bridge/rank_watch.py)
        while True:
            if sock.poll(100):
                msg = self._recv(sock)
                silence.heard()
                if msg.type == "welcome" and welcomed_at is None:
                    welcomed_at = time.monotonic()
                    self.warnings = [str(w) for w in (msg.get("info") or {}).get("warnings") or []]
                    if self.warnings:
                        self.on_warnings(self.warnings)
                elif msg.type == "joined":
                    joined = True
                elif msg.type == "progress" and self.on_progress is not None:
                    self.on_progress(Beat.from_fields(msg.fields))
                elif msg.type == "jobfail":
                    self._job_failed(msg["job"], msg["code"], msg["text"])
                elif msg.type == "outcome":
                    return msg["outcome"], welcomed_at or t0, time.monotonic()
                elif msg.type == "error":
                    raise BridgeError(msg["text"], code=msg["code"])
            now = time.monotonic()
            for c in self.children:
                if c.reported or c.proc.poll() is None:
                    continue
                if c.role == "rank" and c.proc.returncode == PEER_LOST_EXIT:
                    # a victim: it lost a connection to a peer that died first; give that peer's
                    # death a moment to be seen, so the run names it instead
                    if now < victim_until.setdefault(c.pid, now + VICTIM_GRACE_S):
                        continue
                c.reported = True
                if c.role == "coordinator" and c.proc.returncode == 0 and (late := self._last_words(sock)) is not None:
                    return late, welcomed_at or t0, time.monotonic()  # its outcome left just before it exited
                if c.role == "rank" and c.proc.returncode == 0:
                    sock.send(encode("exited", 0, who="rank", rank=c.rank, code=0))
                    continue
                if c.role == "spawner" and c.proc.returncode == 0:
                    if joined:
                        continue  # its ranks have ended (it joins them); their outcome is on its way
                    raise BridgeError(
                        f"{c.label} ended before its {self.spec.world} ranks had joined: a process the program started "
                        "never called init_process_group, or it started fewer than --nproc",
                        code="peer-died",
                    )
                when = "mid-run" if joined else "during start-up (before every rank had joined)"
                if isolate and c.role == "rank":  # only its job ends: the coordinator answers with a jobfail
                    assert self.job_table is not None and c.rank is not None
                    job = self.job_table.job_of(c.rank)
                    if job not in self.job_failures:
                        self._deaths.setdefault(job, f"{c.label} {c.exit_text()} {when}.\n{c.log_tail()}")
                        sock.send(encode("exited", 0, who="rank", rank=c.rank, code=c.proc.returncode or 0))
                    continue
                died = f"{c.label} {c.exit_text()} {when}; the run was stopped.\n{c.log_tail()}{_rank_verdict(c)}"
                if welcomed_at is not None:  # the coordinator serves: it may know the real cause
                    self._check_error_first(sock, c, died)
                raise BridgeError(died, code="peer-died", rank=c.rank if c.role == "rank" else None)
            self._check_ranks_live(watch, isolate)
            if now - last_beat >= HEARTBEAT_S:
                send_heartbeat(sock, encode("heartbeat", 0))
                last_beat = now
            limit = self.spec.peer_timeout_s if welcomed_at is not None else STARTUP_TIMEOUT_S
            if silence.silent_s() > limit:
                raise BridgeError(
                    f"{coord.label} has been silent for {limit:.0f} s without working (no message, no CPU time); "
                    "the run was stopped",
                    code="timeout",
                )
            if self.timeout_s is not None and now - t0 > self.timeout_s:
                raise BridgeError(self._timed_out(sock, welcomed_at is not None), code="timeout")

    def _check_ranks_live(self, watch: RankWatch, isolate: bool) -> None:
        """BridgeError naming a rank stopped or wedged for the peer timeout (its pid and state); with `isolate`, kill
        it instead, so only its job ends, saying why. The ranks' fork server and a program that starts its ranks
        itself are judged too: they never beat, so only a stop counts (a stopped fork server reaps no rank, and the
        death of one would go unseen)."""
        watched = ("rank", "forkserver", "spawner")
        live = [c for c in self.children if c.role in watched and not c.reported and c.proc.poll() is None]
        stuck = watch.check(live, others=self.spawner_cmd is not None)
        if stuck is None:
            return
        pid, rank, why = stuck
        if isolate and rank is not None:
            assert self.job_table is not None
            self._deaths.setdefault(self.job_table.job_of(rank), f"{why}; it was killed (SIGKILL)")
            kill(pid)  # its death is then handled as any other: only its job ends
            return
        raise BridgeError(f"{why}; the run was stopped", code="timeout", rank=rank)

    def _timed_out(self, sock: zmq.Socket, serving: bool) -> str:
        """The one line of a run past its bound: the ranks still running, where the coordinator saw each (asked for
        up to WHERE_S) and their logs, where each writes its threads' stacks as it is stopped (stop_stacks.py)."""
        stood: dict[int, list[Any]] = {}
        if serving:
            sock.send(encode("where", 0))
            deadline = time.monotonic() + WHERE_S
            while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
                msg = self._recv(sock)
                if msg.type == "stood":
                    stood = {int(r[0]): r for r in msg["ranks"]}
                    break
        running = [c for c in self.children if c.role in ("rank", "spawner") and c.proc.poll() is None]
        parts = []
        for c in running:
            seen = stood.get(c.rank) if c.rank is not None else None
            if seen is None:
                parts.append(c.label)
                continue
            _, state, ns, last = seen
            where = f"running, last reported at {ns} ns" if state == "run" else f"{STOOD.get(state, state)} at {ns} ns"
            parts.append(f"{c.label}: {where}, {f'last call {last}' if last else 'no call yet'}")
        text = f"the run did not finish within {self.timeout_s:.0f} s"
        if not running:
            return text
        if not serving:
            text += " (in start-up: the coordinator was not serving yet)"
        elif not stood:
            text += f" (the coordinator did not say where the ranks stood within {WHERE_S:.0f} s)"
        logs = ", ".join(str(c.log_path) for c in running) if self.out_dir is not None else "CosimRun.logs"
        return f"{text}; still running: {'; '.join(parts)}; their stacks as they were stopped in {logs}"

    def _last_words(self, sock: zmq.Socket) -> dict[str, Any] | None:
        """A coordinator exits with code 0 only after sending the outcome; on a loaded machine the process can be
        seen gone before the message is read. Read what is queued, for up to LAST_WORDS_S: its outcome, or None."""
        deadline = time.monotonic() + LAST_WORDS_S
        while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
            msg = self._recv(sock)
            if msg.type == "outcome":
                return dict(msg["outcome"])
            if msg.type == "error":
                raise BridgeError(msg["text"], code=msg["code"])
        return None

    def _job_failed(self, job: int, code: str, text: str) -> None:
        """The coordinator ended one job: stop the processes it has left; the other jobs run on."""
        assert self.job_table is not None
        if job in self.job_failures:
            return
        self.job_failures[job] = {"code": code, "text": text}
        name = self.job_table.jobs[job].name
        mine = [c for c in self.children if c.role == "rank" and c.job == name]
        stop_all([c for c in mine if c.proc.poll() is None])
        for c in mine:
            c.reported = True

    @staticmethod
    def _recv(sock: zmq.Socket) -> Any:
        try:
            return decode(sock.recv(), OUTCOME_MAX_BYTES)  # only the coordinator talks to the launcher
        except ProtocolError as exc:
            raise BridgeError(f"bad message from the coordinator: {exc}") from None

    def _check_error_first(self, sock: zmq.Socket, child: Child, died: str) -> None:
        """A child died: ask the coordinator whether the run had already failed, as that is the real cause.

        Asked only once the coordinator serves (it welcomed the launcher): before that it has read no
        rank's message, so it has nothing to add, and it may be waiting for the network server to build
        its engine (seconds for the ns-3 import), which must not delay the end of the run.

        A rank that dies mid-run is often the victim: gloo aborts a rank whose peer sent a buffer
        of the wrong size, before the coordinator's mismatch diagnostic arrives. The coordinator
        handles every request already queued before it answers this `exited`, so a mismatch or
        deadlock the ranks' own messages revealed is reported, deterministically, instead.
        """
        if child.role == "rank":
            code = child.proc.returncode if child.proc.returncode is not None else -1
            sock.send(encode("exited", 0, who="rank", rank=child.rank, code=code))
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            if sock.poll(50):
                msg = self._recv(sock)
                if msg.type == "error":
                    if msg["code"] == "peer-died":
                        return  # the coordinator knows no more than the death itself
                    raise BridgeError(f"{msg['text']}\n({died.splitlines()[0]})", code=msg["code"])
            elif child.role != "rank":
                return  # no coordinator answer to expect for a dead server or coordinator

    def _finish_children(self, grace_s: float) -> None:
        """After the outcome: give ranks and coordinator `grace_s` to exit by themselves."""
        deadline = time.monotonic() + grace_s
        for c in self.children:
            if c.role in ("server", "forkserver"):
                continue
            while c.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)

    def _exit_watch(self) -> RankWatch:
        """A watch on a process the run waits for after its outcome (it never beats: only a stop counts)."""
        assert self.run_dir is not None
        return RankWatch(self.run_dir, self.spec.peer_timeout_s)

    @staticmethod
    def _fail_if_stopped(watch: RankWatch, c: Child, when: str) -> None:
        """BridgeError naming `c` if `watch` finds it stopped for the peer timeout (rather than wait TRACE_WAIT_S)."""
        stuck = watch.check([c])
        if stuck is not None:
            c.reported = True
            raise BridgeError(f"{stuck[2]} {when}; the run was stopped", code="timeout")

    def _await_spawner(self) -> None:
        """After the outcome: the program's launching process runs on after its ranks end (what follows its
        `mp.spawn(...)`); wait for it, at most TRACE_WAIT_S, and fail the run if it fails."""
        for c in self.children:
            if c.role != "spawner":
                continue
            deadline = time.monotonic() + TRACE_WAIT_S
            watch = self._exit_watch()
            while c.proc.poll() is None and time.monotonic() < deadline:
                self._fail_if_stopped(watch, c, "after its ranks ended")
                time.sleep(0.01)
            c.reported = True
            if c.proc.returncode != 0:
                what = c.exit_text() if c.proc.returncode is not None else f"did not exit {TRACE_WAIT_S:.0f} s after"
                raise BridgeError(f"{c.label} {what} after its ranks ended.\n{c.log_tail()}", code="peer-died")

    def _await_server_traces(self) -> None:
        """After the outcome: the process holding the engine (the network server, or the coordinator when the
        engine runs there) writes the fabric traces (pfc, queues, drops, ...) and exits.

        Its traces can take seconds to write (a lossy run has millions of ECN marks and CNPs), so it is not
        stopped with the others: the run waits for it to exit by itself, and a process that fails there, or is
        still writing after `TRACE_WAIT_S`, fails the run instead of leaving it without its traces.
        """
        if not self.out_dir:
            return
        holder = "coordinator" if self.spec.engine_in_coordinator else "server"
        for c in self.children:
            if c.role != holder:
                continue
            deadline = time.monotonic() + TRACE_WAIT_S
            watch = self._exit_watch()
            while c.proc.poll() is None and time.monotonic() < deadline:
                self._fail_if_stopped(watch, c, "while it wrote the fabric traces")
                time.sleep(0.01)
            c.reported = True
            if c.proc.poll() is None:
                raise BridgeError(
                    f"{c.label} was still writing the fabric traces {TRACE_WAIT_S:.0f} s after the run ended; "
                    "it was stopped and the run's traces are incomplete",
                    code="timeout",
                )
            if c.proc.returncode != 0:
                raise BridgeError(
                    f"{c.label} {c.exit_text()} after the run ended, before its fabric traces were written.\n"
                    f"{c.log_tail()}",
                    code="peer-died",
                )

    # ----- the run -----------------------------------------------------------------------------
    def run(self) -> CosimResult:
        """Run to the end; raise BridgeError (a PhantoraError) naming the cause if anything fails."""
        if self.run_dir is not None:
            raise BridgeError("a CosimRun runs once; make a new one")
        t0 = time.monotonic()
        self.run_dir = make_run_dir()
        token = new_token()
        logs = RunDir(self.out_dir if self.out_dir is not None else self.run_dir)  # its logs/ folder
        logs.logs.mkdir(parents=True, exist_ok=True)
        ctx = zmq.Context()
        sock = None
        try:
            if self.spec.engine.network == "ns3":  # before the start-up clocks run (ns3_build.ensure_built)
                ensure_built()
            cmds = self._rank_cmds()
            self._start_fork_server(cmds, logs)
            endpoint = self._start(token, logs)
            sock = connect_dealer(ctx, endpoint, OUTCOME_MAX_BYTES)
            sock.send(encode("hello", 0, role="supervisor", token=token, rank=None, world=None, pid=os.getpid()))
            self._start_ranks(cmds, endpoint, token, logs, self._beat_every(sock))
            try:
                outcome, t_ready, t_end = self._supervise(sock, t0)
            except BridgeError as exc:
                if exc.code != "peer-died":
                    self._finish_children(2.0)  # ranks print the coordinator's diagnostic and exit by themselves
                raise
            self._finish_children(5.0)
            self._await_spawner()
            self._await_server_traces()
            result = self._result(outcome, t0, t_ready, t_end)
        finally:
            stop_all(self.children)
            for forker in [self._forker, *self._server_forkers]:
                if forker is not None:
                    forker.close()
            if sock is not None:
                sock.close(0)
            ctx.term()
            self._collect_logs()
            remove_run_dir(self.run_dir)
        result.logs = self.logs
        result.wall_s = time.monotonic() - t0
        if self.out_dir is not None:
            self._write(result)
        return result

    def _collect_logs(self) -> None:
        self.logs: dict[str, str] = {}
        for c in self.children:
            key = (f"rank {c.rank}" if c.job is None else f"job {c.job} rank {c.local}") if c.role == "rank" else c.role
            self.logs[key] = _read_log(c.log_path)
            if c.role == "spawner":  # the ranks it started wrote their own logs beside its
                for r in range(self.spec.world):
                    self.logs[f"rank {r}"] = _read_log(c.log_path.with_name(f"rank{r}.log"))

    def _result(self, outcome: dict[str, Any], t0: float, t_ready: float, t_end: float) -> CosimResult:
        return CosimResult(
            ranks={r: out for r, out, _ in outcome["ranks"]},
            finish_ns={r: t for r, _, t in outcome["ranks"]},
            collectives=outcome["collectives"],
            completions=[completion_from_wire(row) for row in outcome["completions"]],
            alone=completion_alone(outcome),
            transport=transport_from_rows(outcome.get("transport", [])),
            flows_note=str(outcome.get("flows_note", "")),
            links=[_usage(row) for row in outcome.get("links", [])],
            traffic_bytes={str(k): int(v) for k, v in (outcome.get("traffic_bytes") or {}).items()},
            rounds=outcome["rounds"],
            wall_s=0.0,
            sim_wall_s=float(outcome.get("sim_wall_s", t_end - t_ready)),
            makespan_ns=outcome["now"],
            window_ns=outcome["window_ns"],
            network=self.spec.network,
            engine_stats=outcome["engine_stats"],
            messages=outcome["messages"],
            late_collectives=outcome["late_collectives"],
            rejected_messages=int(outcome.get("rejected", 0)),
            startup_s=t_ready - t0,
            cpu_s={
                "coordinator": float(outcome.get("coordinator_cpu_s", 0.0)),
                "server": float(outcome["engine_stats"].get("server_cpu_s", 0.0)),
                "ranks": float(sum(outcome.get("rank_cpu_s", []))),
            },
            jobs=self._jobs_result(outcome.get("jobs") or []),
            background=[completion_from_wire(row) for row in outcome.get("background") or []],
            scenario=dict(outcome.get("scenario") or {}),
            coordinator_busy_s=self.coordinator_silence.busy_s if self.coordinator_silence is not None else 0.0,
            warnings=self.warnings,
        )

    def _jobs_result(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The coordinator's per-job outcome, with how a failed job's dead rank died (its log's tail)."""
        out = []
        for i, j in enumerate(jobs):
            j = dict(j)
            if i in self._deaths and j.get("error"):
                j["error"] = {**j["error"], "text": f"{j['error']['text']}\n{self._deaths[i]}"}
            out.append(j)
        return out

    def _write(self, result: CosimResult) -> None:
        assert self.out_dir is not None
        summary = {
            "schema": schema.COSIM,
            "network": result.network,
            "window_ns": result.window_ns,
            "granularity": self.spec.algo.get("granularity", "coarse"),  # the collectives' flows (AlgoOptions)
            "rounds": result.rounds,
            "wall_s": result.wall_s,
            "sim_wall_s": result.sim_wall_s,
            "makespan_ns": result.makespan_ns,
            "messages": result.messages,
            "late_collectives": result.late_collectives,
            "rejected_messages": result.rejected_messages,
            "coordinator_busy_s": result.coordinator_busy_s,
            "engine_stats": result.engine_stats,
            "ranks": {str(r): v for r, v in result.ranks.items()},
            "collectives": result.collectives,
        }
        if result.flows_note:
            summary["flows_note"] = result.flows_note
        if result.jobs:
            summary["jobs"] = result.jobs
        out = RunDir(self.out_dir)
        listed = self.job_table is None and (result.completions or not result.flows_note)  # jobs: caller knows keys
        if listed:  # flows.csv's rows and the zero-byte flows it leaves out: with them, every planned flow
            summary["flows_csv"] = flows_csv_count(result.completions)
        out.write_json(schema.COSIM_JSON, summary, indent=1, sort_keys=False)
        if listed:
            write_flows_csv(
                out.file(schema.FLOWS_CSV),
                self.spec.topology,
                result.completions,
                transport=result.transport or None,
                alone=result.alone,
            )
        if result.links:  # an engine in the coordinator (flow mode); the network server writes its own
            write_links_csv(out.file(schema.LINKS_CSV), self.spec.topology, result.links)


def completion_alone(outcome: dict[str, Any]) -> dict[int, Alone]:
    """Flow id -> ECMP key, rate cap and NIC route of the outcome's completions whose key is not their id, that have a
    cap or go through the NICs (`completion_alone`: a key, a cap and 1 if through the NICs a completion, in order;
    none kept: {})."""
    flat = outcome.get("completion_alone") or []
    ids = [row[0] for row in outcome["completions"]]
    if not flat:
        return {}
    if len(flat) != 3 * len(ids):
        raise ProtocolError(
            f"the coordinator's outcome holds {len(flat)} keys, caps and NIC flags for {len(ids)} completions"
        )
    return alone_from(ids, flat)


def _rank_verdict(c: Child) -> str:
    """For the program's launching process: the first of its ranks' one-line failures (logs/rank<R>.log, in the order
    they were written), if its own log does not end on one already."""
    tail = c.log_tail().splitlines()
    if c.role != "spawner" or (tail and tail[-1].startswith("phantora: ")):
        return ""
    said = []
    for log in c.log_path.parent.glob("rank*.log"):
        lines = [ln for ln in _read_log(log).splitlines() if ln.startswith("phantora: rank ")]
        if lines:
            said.append((log.stat().st_mtime, lines[-1]))
    return f"\n{min(said)[1]}" if said else ""


def _read_log(path: Path) -> str:
    """The last 64 KiB of a process's log ("" if it wrote none)."""
    try:
        return path.read_text(errors="replace")[-65536:]
    except OSError:
        return ""


def _usage(row: dict[str, Any]) -> ChannelUsage | PacketChannelUsage:
    """A channel's traffic as the coordinator sent it (the packet engine's record has its counters too)."""
    return PacketChannelUsage(**row) if "paused_ns" in row else ChannelUsage(**row)


def replay_workload(
    topology: Topology, workload: str | Path, engine: EngineSpec | None = None, **options: Any
) -> CosimResult:
    """Co-simulate a workload file with one `phantora.egraph.replay_rank` process per rank (options: `CosimRun`'s)."""
    cmd = [options.pop("python", sys.executable), "-m", "phantora.egraph.replay_rank", str(Path(workload).resolve())]
    return CosimRun(topology, engine, rank_cmd=cmd, **options).run()
