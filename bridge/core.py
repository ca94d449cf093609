"""The coordinator's logic, without sockets: rank states, rendezvous, flows, and the network clock.

Ranks are in one of five states:
- ``run``: computing; it promised to issue nothing stamped before its last reported time;
- ``wait``: blocked until one of its handles has a known completion (``wait``/``wait_any``);
- ``test``: exact mode, blocked until the network has simulated up to its time (``test``);
- ``barrier``: window mode, blocked until the network reached its window (``advance_clock``);
- ``done``: finished.

How far the network may go (the horizon H) is the smallest promise of the ranks in test and barrier, and
the earliest already-known completion a waiting rank will wake on.
In both modes the engine advances, and held rendezvous are launched, only while every live rank is blocked:
what the coordinator then knows is a function of the inputs alone (not of which rank's message came first),
so the advances (`rounds`) and every reply are the same from run to run.
- Exact mode (window 0): the engine runs to H but stops at the first completion a waiting rank
  waits on, so a woken rank can still inject at its wake time. No flow is ever submitted earlier
  than the engine's time: this is asserted, and results equal an in-process run.
- Window mode (W > 0): the engine runs in whole windows, to the last window boundary at or below
  H (and, if a rank waits, no further than the end of the window holding the next engine event).
  A woken rank may then issue a collective stamped before the engine's time; the collective
  starts at the engine's time instead (``late_ns`` in its record): that is the window error.

Completion times are per rank: a rank's part of a collective is done when its last flows (the
decomposition's ``rank_last``) have arrived, or at the start if it has none. A send/recv
completes on both sides when its flow has arrived.
"""

from __future__ import annotations

import dataclasses
import heapq
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.anysource import AnyRecv, AnySources
from bridge.completion_log import CompletionLog
from bridge.engine_pair import EnginePair
from bridge.errors import RunFailed
from bridge.jobs import JobTable
from bridge.launch_order import HeldRendezvous
from bridge.matching import Call, Matcher, Rendezvous, describe_key
from bridge.p2p_batch import P2pBatches, grouped_comm
from bridge.protocol import (
    E_DEADLOCK,
    E_ENGINE,
    E_INTERNAL,
    E_PEER,
    E_PROTOCOL,
    INF_NS,
    Message,
    completion_to_wire,
    encode,
    transport_row,
)
from bridge.stepping import advance_watching
from bridge.storage_io import StorageIO
from bridge.stream_order import StreamOrder
from bridge.values import ValueBoard
from phantora.collectives.handoff import handoff_ns, send_slots, slot_back_ns
from phantora.collectives.job_traffic import JobTraffic
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.nccl.live_launches import rank_launches
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.collectives.spec import REDOPS, REDUCING, AlgoOptions
from phantora.errors import PhantoraError
from phantora.netsim.base import Completion, Flow, NetworkSimulator
from phantora.netsim.bounds import EarliestEnds
from phantora.netsim.standalone import Alone, flow_alone
from phantora.topology.model import Topology

RUN, WAIT, TEST, BARRIER, DONE = "run", "wait", "test", "barrier", "done"
MAX_KEPT_FLOWS = 2_000_000  # per-flow records kept for the outcome (flows.csv): ~0.1 GB in the coordinator (columns)


@dataclass
class CollRecord:
    """A matched collective or transfer on its way through the network."""

    id: int
    rv: Rendezvous
    kind: str
    group: tuple[int, ...]
    nbytes: int
    dtype: str
    t_requested: int  # latest issue time
    t_start: int  # when its flows were submitted (later than t_requested only in window mode)
    first_flow: int
    nflows: int
    name: str = ""
    copies: int = 1  # rank deduplication: the group's shifts launched with it (phantora.collectives.mirrors)
    pending: dict[int, set[int]] = field(default_factory=dict)  # rank -> its last flows not yet arrived
    least: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # rank -> heap of (bound, flow): `_least`
    waiters: dict[int, list[int]] = field(default_factory=dict)  # flow -> ranks it is a last flow of
    rank_done: dict[int, int] = field(default_factory=dict)
    end_ns: int = 0
    outstanding: int = 0
    job: int | None = None  # several jobs: the job it belongs to
    key0: int = 0  # several jobs: the ECMP key of its first flow (the job's own count; keys are consecutive)
    traffic_class: int | None = None  # the class its flows were given (None: the flows' default)
    lossy: Any = None  # DLCP: (Collective, AlgoOptions) to map its flows' lost ranges to tensor bytes
    lost: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # flow id -> lost ranges
    lossless_why: str | None = None  # DLCP: asked to be loss-tolerant but kept lossless, and why
    choice: dict[str, Any] | None = None  # NCCL's algorithm, protocol and channels for it (collectives.nccl)
    comm: tuple[int, ...] = ()  # a grouped send/recv: the communicator it ran on (batch_isend_irecv)

    def to_dict(self) -> dict[str, Any]:
        key = self.rv.key
        first = next(iter(self.rv.calls.values()))
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "group": list(self.group),
            "seq": key[-1],
            "tag": key[3] if key[0] == "p2p" else None,
            "nbytes": self.nbytes,
            "dtype": self.dtype,
            "root": first.root,
            "issue": sorted([r, c.t] for r, c in self.rv.calls.items()),
            "t_requested": self.t_requested,
            "t_start": self.t_start,
            "late_ns": self.t_start - self.t_requested,
            "rank_done": sorted([r, t] for r, t in self.rank_done.items()),
            "end_ns": self.end_ns,
            "flows": self.nflows,
            "first_flow": self.first_flow,
            "copies": self.copies,
            **({"job": self.job, "key0": self.key0} if self.job is not None else {}),
            **({"class": self.traffic_class} if self.traffic_class is not None else {}),
            **({"lost_bytes": sum(n for r in self.lost.values() for _, n in r)} if self.lossy is not None else {}),
            **({"kept_lossless": self.lossless_why} if self.lossless_why else {}),
            **({"redop": first.redop} if first.redop != "sum" else {}),
            **({"nccl": self.choice} if self.choice else {}),
            **({"comm": list(self.comm)} if self.comm else {}),
            **({"names": sorted([r, c.name] for r, c in self.rv.calls.items())} if key[0] == "p2p" else {}),
            **({"nccl_env": dict(env)} if (env := dict(first.algo).get("nccl_env")) is not None else {}),
        }


@dataclass
class RankState:
    """What the coordinator knows about one rank."""

    rank: int
    state: str = RUN
    promise: int = 0  # the rank issues nothing stamped earlier
    handles: list[int] = field(default_factory=list)  # wait: handles; test: [h]
    deadline: int = INF_NS  # wait: give up (answer None) once the network passed this time
    target: int = 0  # test/barrier: the time it waits for the network to reach
    results: dict[int, int] = field(default_factory=dict)  # handle -> t_done, known
    undelivered: dict[int, int] = field(default_factory=dict)
    lost: dict[int, list[list[int]]] = field(default_factory=dict)  # DLCP: handle -> tensor byte ranges to zero
    owner: dict[int, int] = field(default_factory=dict)  # handle -> collective record id (once matched)
    issued: dict[int, Call] = field(default_factory=dict)  # handle -> call
    t_finish: int = 0
    output: Any = None
    cpu_s: float = 0.0  # CPU time the rank process spent, as it reported at finish
    gave_up: str = ""  # the first wait it gave up past a wall-clock timeout (`cancel`), described


class CoordinatorCore:
    """Rank requests in, flows to the engine, completions and replies out (through `send`)."""

    def __init__(
        self,
        engine: NetworkSimulator,
        topology: Topology,
        world: int,
        *,
        window_ns: int,
        algo: AlgoOptions,
        send: Callable[[int, bytes], None],
        keep_flows: bool = True,
        live: int | None = None,
        jobs: JobTable | None = None,
        all_or_nothing: bool = True,
        background: Sequence[Flow] = (),
    ) -> None:
        """`live`: rank deduplication, the number of live rank processes standing for the `world`
        ranks (live rank l for l, l+live, l+2*live, ...; see phantora.collectives.mirrors). None: every rank is live.
        `jobs`: several jobs (bridge.jobs), every rank live; unless `all_or_nothing`, a job's failure
        (its mismatch, deadlock, protocol error or a dead rank) ends that job only (`fail_job`).
        `background`: recorded jobs' flow DAG (ids 0..n-1, deps inside it), submitted at time 0: the engine runs
        it beside the live ranks' flows, and its completions come back in the outcome (`background`)."""
        if world > topology.num_ranks:
            raise RunFailed(
                E_PROTOCOL, f"{world} ranks do not fit the topology '{topology.name}' ({topology.num_ranks} endpoints)"
            )
        self.engine: NetworkSimulator = engine  # with the storage beside it after the first checkpoint file
        self.net = engine  # the network engine alone
        self.topology = topology
        self.world = world
        live = world if live is None else live
        if not 1 <= live <= world or world % live:
            raise RunFailed(E_PROTOCOL, f"{live} live ranks cannot stand for {world} ranks: it must divide it")
        self.mirrors = Mirrors(world, live)
        self.io = StorageIO(topology, self.mirrors)  # checkpoint files on the shared storage (bridge.storage_io)
        self.values = ValueBoard(self.mirrors)  # object collectives' bytes (bridge.values)
        self.window = window_ns
        self.planner = CollectivePlanner(topology, algo, self.mirrors)  # the collective -> flow step
        self.send = send
        self.keep_flows = keep_flows
        self.flows_note = ""  # why the per-flow records were dropped, if they were
        # the engine's per-flow transport counters (`transport_row` lists) when it runs elsewhere (a network server)
        self.transport_rows: Callable[[], list[list[int]]] | None = None
        self.ranks = [RankState(r) for r in range(live)]
        self.blocked: dict[int, RankState] = {}  # ranks in wait, test or barrier
        self.waiting: dict[int, RankState] = {}  # ranks in wait (a subset of blocked)
        self._dirty: set[int] = set()  # blocked ranks to re-check although the network did not move
        self._release_now = -1  # network time of the last full release pass
        self.live = live  # ranks not done
        # lazy heap of (promise, rank) over the ranks in test or barrier (`horizon`)
        self._promises: list[tuple[int, int]] = []
        self.held = HeldRendezvous()  # complete rendezvous not launched yet (`_launch_ready`)
        self.p2p_batches = P2pBatches()  # the grouped send/recvs launched together (rated together)
        self.streams = StreamOrder()  # each rank's collectives on one NCCL stream, in turn (parked until then)
        self.matcher = Matcher(world, self.mirrors)
        self.anys = AnySources()  # receives from any source not yet given their send (bridge/anysource.py)
        self._any_floor: int | None = None  # exact mode: the network stops short of a deferred one's start
        self.on_round: Callable[[], None] | None = None  # called between engine advances (heartbeats)
        self.records: list[CollRecord] = []
        self.flow_owner: dict[int, int] = {}
        self.flow_alone: dict[int, Alone] = {}  # in-flight flows' ECMP keys and caps, while flows are kept (flows.csv)
        self.bounds = EarliestEnds(topology)  # in-flight flows' earliest possible completions, their bytes
        self._watch_groups: list[tuple[int | None, int]] | None = None  # those of `_watch`: `watched_earliest`
        self._watch: set[int] = set()  # the last watched set, less the flows completed since
        self.steps_started: dict[int, int] = {}  # step -> ns its first rank started it (scenario `at_step`)
        self._steps_held: dict[int, int] = {}  # step -> the earliest start reported so far, not applied yet
        self.completions = CompletionLog()  # for flows.csv, as columns (bridge.completion_log)
        self.rounds = 0
        self.late_collectives = 0
        self.messages = 0
        self.jobs = jobs if jobs is not None and len(jobs) else None
        if self.jobs is not None and (self.jobs.world != world or self.mirrors.active):
            raise RunFailed(E_PROTOCOL, f"jobs of {self.jobs.world} ranks in a run of {world}, every rank live")
        self.isolate = self.jobs is not None and not all_or_nothing
        # each job's flows as if it ran alone: its own ECMP keys and class; the bytes it puts on each channel
        self.job_traffic = JobTraffic(topology, [j.priority for j in self.jobs.jobs] if self.jobs is not None else [])
        self.job_failures: dict[int, dict[str, str]] = {}  # job -> its failure (code, text)
        self.on_job_failed: Callable[[int, str, str], None] | None = None  # told of each job that failed
        self.n_background = len(background)
        self.background_done: list[Completion] = []
        if background:
            self._submit_background(background)

    def _submit_background(self, flows: Sequence[Flow], batch: int = 100_000) -> None:
        """Submit the recorded jobs' DAG at time 0, in batches (each depends only on itself and earlier ones)."""
        if any(f.id != i for i, f in enumerate(flows)):
            raise RunFailed(E_INTERNAL, "background flows must have ids 0..n-1 in order")
        try:
            for i in range(0, len(flows), batch):
                self.engine.submit(list(flows[i : i + batch]), at=0)
        except PhantoraError as exc:
            raise RunFailed(E_ENGINE, f"the engine refused the recorded jobs' flows: {exc}") from None
        self.planner.next_flow = len(flows)

    # ----- requests ----------------------------------------------------------------------------
    def _stamp(self, rs: RankState, t: int, what: str) -> None:
        """A message stamped t from rank rs: check it keeps the rank's promise, and raise it."""
        if rs.state == DONE:
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank} sent {what} after finish()")
        if t < rs.promise:
            raise RunFailed(
                E_PROTOCOL,
                f"rank {rs.rank} sent {what} stamped {t} ns, earlier than the time it already reached "
                f"({rs.promise} ns); a rank's clock never goes back",
            )
        self._promise(rs, t)

    def on_message(self, rank: int, msg: Message) -> None:
        """Dispatch one request of an authenticated rank."""
        self.messages += 1
        rs = self.ranks[rank]
        if msg.type == "cancel":  # sent while blocked in its wait: not a request of a running rank (`_handle`)
            if not (self.jobs is not None and self.jobs.job_of(rank) in self.job_failures):
                self._on_cancel(rs)
            return
        handler = {
            "coll": self._on_coll,
            "p2p": self._on_p2p,
            "io": self._on_io,
            "value": self._on_value,
            "values": self._on_values,
            "handoff": self._on_handoff,
            "plans": self._on_plans,
            "clock": self._on_clock,
            "wait": self._on_wait,
            "test": self._on_test,
            "finish": self._on_finish,
        }.get(msg.type)
        if handler is None:
            raise RunFailed(E_PROTOCOL, f"rank {rank} sent {msg.type!r}, which a rank may not send")
        if self.jobs is None:
            self._handle(handler, rs, msg)
            return
        job = self.jobs.job_of(rank)
        if job in self.job_failures:
            return  # sent before its job failed: the job is over
        try:
            self.jobs.translate(msg, job)
            self._handle(handler, rs, msg)
        except RunFailed as exc:
            if not self.isolate:
                raise
            self._fail_or_raise(job, exc)

    def _handle(self, handler: Callable[[RankState, Message], None], rs: RankState, msg: Message) -> None:
        if rs.state not in (RUN, DONE):
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank} sent {msg.type!r} while blocked in {rs.state}")
        handler(rs, msg)

    # ----- several jobs --------------------------------------------------------------------------
    def _fail_or_raise(self, job: int, exc: RunFailed) -> None:
        """A failure a job's own rank caused ends that job; an engine or internal failure ends the run."""
        if exc.code in (E_ENGINE, E_INTERNAL):
            raise exc
        self.fail_job(job, exc.code, exc.text)

    def rank_exited(self, rank: int, code: int) -> None:
        """The launcher saw a rank exit: without finish(), that fails its job (or the run)."""
        rs = self.ranks[rank]
        if rs.state == DONE:
            return
        how = f"code {code}" + (f": {_signal_name(-code)}" if code < 0 else "")  # -9: killed by SIGKILL
        exc = RunFailed(E_PEER, f"rank {rs.rank} exited ({how}) without calling finish()")
        if not self.isolate:
            raise exc
        assert self.jobs is not None
        text = f"{self.jobs.label(rank)} exited ({how}) without calling finish()"
        self.fail_job(self.jobs.job_of(rank), exc.code, text, global_ranks=False)

    def failed_job_of(self, rank: int) -> dict[str, str] | None:
        """The failure of the job of a global rank, if that job failed."""
        return self.job_failures.get(self.jobs.job_of(rank)) if self.jobs is not None else None

    def fail_job(self, job: int, code: str, text: str, global_ranks: bool = True) -> None:
        """End one job: its ranks get the error and count as done, its unmatched calls are dropped. Its flows
        already in the network run to the end (they still load the links), but nobody waits for them.
        `global_ranks`: the text names the coordinator's ranks (a note says how they map to the job's)."""
        assert self.jobs is not None
        if job in self.job_failures:
            return
        info = self.jobs.jobs[job]
        if global_ranks and info.offset and "rank" in text:  # the diagnostics name the coordinator's ranks
            text += f"\n(ranks above are the run's: rank r of job {info.name} is rank {info.offset} + r)"
        self.job_failures[job] = {"code": code, "text": text}
        err = encode("error", self.engine.now(), code=code, text=f"job {info.name}: {text}")
        for r in self.jobs.ranks_of(job):
            rs = self.ranks[r]
            if rs.state == DONE:
                continue
            self.blocked.pop(r, None)
            self.waiting.pop(r, None)
            self._dirty.discard(r)
            rs.state, rs.t_finish, rs.handles = DONE, rs.promise, []
            self.live -= 1
            self.send(r, err)
        mine = set(self.jobs.ranks_of(job))
        for key in [k for k, rv in self.matcher.pending.items() if set(rv.members) & mine]:
            del self.matcher.pending[key]
        self.held.drop(mine)
        self.streams.drop(mine)
        if self.on_job_failed is not None:
            self.on_job_failed(job, code, text)

    def _new_handle(self, rs: RankState, h: int, call: Call) -> None:
        if h in rs.issued:
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank} reused handle {h}")
        rs.issued[h] = call

    def _on_coll(self, rs: RankState, msg: Message) -> None:
        self._stamp(rs, msg.t, "a collective")
        group, root = tuple(msg["group"]), msg["root"]
        algo = self._algo(rs, msg.get("algo"), group)
        if self.mirrors.active:
            root = self.mirrors.canonical_root(group, root)
        redop = msg.get("redop", "sum")  # absent: sum (messages from before reductions travelled)
        if redop not in REDOPS or (redop != "sum" and msg["kind"] not in REDUCING):
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: bad reduction {redop!r} for a {msg['kind']}")
        call = Call(rs.rank, msg["h"], msg["kind"], msg["nbytes"], msg["dtype"], root, msg.t, msg["name"], algo)
        call = dataclasses.replace(call, redop=redop) if redop != "sum" else call
        self._new_handle(rs, call.handle, call)
        self._ordered(rs, msg, call, "a collective")
        self._joined(self.matcher.collective(call, group, msg["seq"], self._pg(rs, msg, "a collective")), call)

    @staticmethod
    def _pg(rs: RankState, msg: Message, what: str) -> int:
        """Which of the process groups over its ranks (a transfer: holding both ends) a call runs on (`pg`,
        optional: absent = 0, the first; runtime/session.py numbers them as the ranks create them)."""
        pg = msg.get("pg", 0)
        if not isinstance(pg, int) or isinstance(pg, bool) or pg < 0:
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: {what}'s pg must be an integer >= 0, got {pg!r}")
        return pg

    def _ordered(self, rs: RankState, msg: Message, call: Call, what: str) -> None:
        """Put `call` in its rank's stream order: its `stream`, `launch` and `after` (all optional)."""
        stream, launch = msg.get("stream"), msg.get("launch")
        for name, v in (("stream", stream), ("launch", launch)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: {what}'s {name} must be an integer, got {v!r}")
        after = msg.get("after") or []
        if not isinstance(after, list) or not all(
            isinstance(x, int) and x != call.handle and x in rs.issued for x in after
        ):
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: {what}'s after must list its earlier calls, got {after!r}")
        handoff = msg.get("handoff")  # a lone send within its buffer: its kernel's ns (collectives/handoff.py)
        if handoff is not None and (not isinstance(handoff, int) or isinstance(handoff, bool) or handoff < 0):
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: {what}'s handoff must be ns >= 0, got {handoff!r}")
        gate = msg.get("gate") or []  # the rank's earlier sends whose flows the lone send waits for (slot_window)
        if not isinstance(gate, list) or not all(isinstance(x, int) and x in rs.issued for x in gate):
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: {what}'s gate must list its earlier sends, got {gate!r}")
        back = slot_back_ns(self.planner.topology, rs.rank, msg["peer"]) if gate else 0  # the news of a freed slot
        handed = None if handoff is None else (msg.t, handoff, tuple(gate), back)
        self.streams.issued(rs.rank, stream, call.handle, launch, after, handed)

    def _on_p2p(self, rs: RankState, msg: Message) -> None:
        self._stamp(rs, msg.t, "a send/recv")
        kind = "send" if msg["send"] else "recv"
        comm = self._p2p_comm(rs, msg)
        algo = self._algo(rs, msg.get("algo"))
        call = Call(rs.rank, msg["h"], kind, msg["nbytes"], "uint8", None, msg.t, msg["name"], algo, comm)
        peers = msg.get("any")
        if peers is not None:  # a receive from any source: given its send later (`_resolve_any`)
            self._any_recv(rs, msg, call, peers)
            return
        self._new_handle(rs, call.handle, call)
        self._ordered(rs, msg, call, "a send/recv")
        self.p2p_batches.issued(call, msg.get("launch"))
        pg = self._pg(rs, msg, "a send/recv")
        self._joined(self.matcher.transfer(call, msg["peer"], msg["tag"], msg["seq"], msg["send"], pg), call)

    def _any_recv(self, rs: RankState, msg: Message, call: Call, peers: Any) -> None:
        """A receive from any of `peers` ([global rank, pg] pairs; gloo's recvAnysource), on no stream and in no
        NCCL group: held until `_resolve_any` gives it a send."""
        ok = (
            isinstance(peers, list)
            and peers
            and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
                for p in peers
            )
        )
        if not ok or msg["send"] or call.comm:
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: a recv's any must list [rank, pg] pairs, got {peers!r}")
        pairs = tuple((int(r), int(pg)) for r, pg in peers)
        self.matcher._check_ranks(call, tuple(r for r, _ in pairs), "a source")
        if any(r == rs.rank or pg < 0 for r, pg in pairs) or len({r for r, _ in pairs}) != len(pairs):
            raise RunFailed(E_PROTOCOL, f"{call.describe()} from any of {[list(p) for p in pairs]}: bad sources")
        if self.mirrors.active:
            raise RunFailed(
                E_PROTOCOL,
                f"{call.describe()} from any source in a deduplicated run: mirrored ranks cannot tell which rank "
                "sent it (--dedup off)",
            )
        self._new_handle(rs, call.handle, call)
        self.anys.add(AnyRecv(call, int(msg["tag"]), pairs))

    def _lower_bound(self, rs: RankState) -> int:
        """The earliest time a blocked rank can still issue a call at: its promise, or for a waiting one the earliest
        it can be woken at (a result known, or anything not yet known no earlier than the network's time). Window mode
        counts only a waiting rank's known results (it is released without the network moving; the network may pass
        any other time by a window)."""
        if rs.state == DONE:
            return INF_NS
        if rs.state != WAIT:
            return rs.promise if not self.window else INF_NS
        known = [rs.results[h] for h in rs.handles if h in rs.results]
        if len(known) < len(rs.handles):  # window mode: the network may pass any wake-up by a window; waits for none
            known.append(self.engine.now() if not self.window else INF_NS)
        return max(rs.promise, min([*known, rs.deadline]))

    def _resolve_any(self, force: bool = False) -> bool:
        """Give each receive from any source that can have one its send (bridge/anysource.py), once every live rank
        is blocked: the earliest matching send, unless a candidate could still issue an earlier one (then the network
        stops short of it: `_any_floor`), or `force` (nothing can move: the earliest issued wins). True if any was."""
        self._any_floor = None
        if not self.anys or not self.settled():
            return False
        lower = {rs.rank: self._lower_bound(rs) for rs in self.ranks}
        given = False
        for a in self.anys.in_turn():
            sends = self.anys.sends(a, self.matcher)
            pick = self.anys.first(sends)
            if pick is None:
                continue
            if not force and self.anys.may_precede(a, pick, sends, lower):
                start = max(pick.t, a.call.t)
                self._any_floor = start if self._any_floor is None else min(self._any_floor, start)
                continue
            self.anys.open.remove(a)
            rv = self.matcher.transfer(a.call, pick.src, a.tag, pick.seq, False, pick.pg)
            assert rv is not None, "the send was in: the transfer is complete"
            self.send(a.call.rank, encode("source", self.engine.now(), h=a.call.handle, src=pick.src, seq=pick.seq))
            self._hold(rv)
            given = True
        return given

    def _algo(self, rs: RankState, raw: Any, group: tuple[int, ...] = ()) -> tuple[tuple[str, Any], ...]:
        """A call's AlgoOptions overrides, hashable: `nccl_env` (the NCCL_* variables the program set before its
        group's communicator was created, runtime/program_env.py) as pairs, left out where they are the run's;
        `group_sizes` (a coalesced call's calls' bytes) and `group_dtypes` (their dtypes, where they differ) as
        tuples; a collective's `group_kinds`, `group_redops` and `group_roots` (its calls' kinds, reductions and
        roots where they differ; the roots global ranks, made indices of `group`) as tuples."""
        if raw is None:
            return ()
        if not isinstance(raw, dict):
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: a call's algo must be a map, got {raw!r}")
        out = dict(raw)
        sizes = out.get("group_sizes")  # a coalesced call's calls' bytes (Collective.group_sizes)
        if sizes is not None:
            if not isinstance(sizes, list) or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in sizes
            ):
                raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: group_sizes must be byte counts, got {sizes!r}")
            out["group_sizes"] = tuple(sizes)
        types = out.get("group_dtypes")  # their dtypes where they differ (Collective.group_dtypes)
        if types is not None:
            if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
                raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: group_dtypes must be dtype names, got {types!r}")
            out["group_dtypes"] = tuple(types)
        for name in ("group_kinds", "group_redops"):  # checked against the calls by Collective (spec.py)
            got = out.get(name)
            if got is not None:
                if not isinstance(got, list) or not all(isinstance(x, str) for x in got):
                    raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: {name} must be names, got {got!r:.80}")
                out[name] = tuple(got)
        roots = out.get("group_roots")
        if roots is not None:
            if not isinstance(roots, list) or not all(r is None or (isinstance(r, int) and r in group) for r in roots):
                raise RunFailed(
                    E_PROTOCOL, f"rank {rs.rank}: group_roots must be ranks of {list(group)}, got {roots!r:.80}"
                )
            out["group_roots"] = tuple(None if r is None else group.index(r) for r in roots)
        env = out.get("nccl_env")
        if env is not None:
            if not isinstance(env, list) or not all(
                isinstance(kv, list) and len(kv) == 2 and all(isinstance(x, str) for x in kv) for kv in env
            ):
                raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: nccl_env must be [name, value] pairs, got {env!r}")
            pairs = tuple((k, v) for k, v in env)
            if pairs == self.planner.algo.nccl_env:
                del out["nccl_env"]
            else:
                out["nccl_env"] = pairs
        return tuple(sorted(out.items()))

    def _p2p_comm(self, rs: RankState, msg: Message) -> tuple[int, ...]:
        """The communicator a grouped send/recv names (`comm`, optional): distinct ranks of the run holding the
        caller and its peer; () when none is named."""
        comm = msg.get("comm")
        if comm is None:
            return ()
        if not isinstance(comm, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in comm):
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: a p2p's comm must be a list of ranks, got {comm!r}")
        ranks = tuple(comm)
        bad = [r for r in ranks if not 0 <= r < self.matcher.world]
        if bad or len(set(ranks)) != len(ranks) or not {rs.rank, msg["peer"]} <= set(ranks):
            raise RunFailed(
                E_PROTOCOL,
                f"rank {rs.rank}: a p2p with peer {msg['peer']} names comm {list(ranks)}, which must hold distinct "
                f"ranks of the run, both ends among them",
            )
        return ranks

    def _joined(self, complete: Rendezvous | None, call: Call) -> None:
        """Hold a complete rendezvous for launch in order; fail at once if a pending one needs a rank that finished."""
        if complete is not None:
            self._hold(complete)
            self._launch_ready()
            return
        rv = next(p for p in self.matcher.pending.values() if p.calls.get(call.rank) is call)
        for m in rv.missing:
            if self.ranks[m].state == DONE:
                self._missing(m, rv)

    def _hold(self, rv: Rendezvous) -> None:
        """Hold a matched rendezvous for launch once each member's previous call on its stream has ended there
        (parked until then: `StreamOrder`), from the latest of those ends and the issue times."""
        ready = self.streams.ready(rv, lambda rank, h: self.ranks[rank].results.get(h))
        if ready is not None:
            self.held.push(ready)
            self.p2p_batches.held(ready)  # its NCCL group knows it from now on

    def _step_started(self, step: int, t: int) -> None:
        """A rank started `step` at t: the engine's scenario applies its events at that step at the earliest such
        t (or at the network's time if the network is already past it: window mode), held until no rank can still
        report an earlier one (`_launch_ready`), so the first report to arrive does not decide it."""
        from phantora.netsim.packet_faults import scenario_engine

        if scenario_engine(self.net) is None:
            raise RunFailed(
                E_ENGINE,
                "the scenario has events at a step boundary, but the network engine applies no scenario here (a "
                "network server: run it in the coordinator)",
            )
        if step not in self.steps_started:  # applied: no rank could still start it earlier
            self._steps_held[step] = min(t, self._steps_held.get(step, t))

    def _held_step(self) -> tuple[int, int] | None:
        """The held step start to apply first: (ns, step); None: none held."""
        return min(((t, k) for k, t in self._steps_held.items()), default=None)

    def _apply_step(self, t: int, step: int) -> None:
        from phantora.netsim.packet_faults import scenario_engine

        engine = scenario_engine(self.net)
        assert engine is not None
        del self._steps_held[step]
        self.steps_started[step] = t
        engine.step_started(step, max(t, self.engine.now()))

    def _may_start(self, s: int) -> bool:
        """Exact mode: no blocked rank can wake before s and the engine has run every event before s."""
        nxt = self.engine.next_event_time()
        return self.horizon() >= s and (nxt is None or nxt >= s)

    def _on_io(self, rs: RankState, msg: Message) -> None:
        """A checkpoint file read or written: a transfer on the shared storage from the rank's time (window mode:
        from the network's, if later), run beside the network (bridge.engine_pair); started with the held
        collectives (`_launch_ready`), by (time, rank, handle)."""
        self._stamp(rs, msg.t, "a storage transfer")
        call = Call(rs.rank, msg["h"], f"storage {msg['kind']}", msg["nbytes"], "uint8", None, msg.t, msg["name"])
        self._new_handle(rs, call.handle, call)
        self.io.hold(rs.rank, msg, max(msg.t, self.engine.now()))  # the network does not move until it starts

    def _start_io(self) -> None:
        """Start the held storage transfers (in their own order: `StorageIO.start_held`)."""
        for tid, bound in self.io.start_held():
            self.bounds.bounds[tid] = bound
        if self.engine is self.net and self.io.engine is not None:
            self.engine = EnginePair(self.net, self.io.engine)

    def _on_value(self, rs: RankState, msg: Message) -> None:
        """An object collective's bytes, posted before its timed collectives (bridge.values)."""
        pg = self._pg(rs, msg, "a value")
        self.values.post(rs.rank, msg["group"], msg["key"], msg["data"], bool(msg.get("reads", True)), pg)

    def _on_values(self, rs: RankState, msg: Message) -> None:
        """The posted bytes of a group's members, asked once its timed collectives are done: answered at once."""
        data = self.values.take(rs.rank, msg["group"], msg["key"], self._pg(rs, msg, "a values request"))
        self.send(rs.rank, encode("valued", self.engine.now(), data=data))

    def _on_handoff(self, rs: RankState, msg: Message) -> None:
        """How long a lone send within its connection's buffer takes to hand off (collectives/handoff.py):
        answered at once, as it needs nothing of its peer. Given the send's `tag` and `seq`, also whether its
        receive is already issued (`ready`: a real-data rank then sends from its own tensor, runtime/session.py).
        `comm` (optional): the communicator it runs on, when not the pair's own; `zero_copy` in the reply: NCCL moves
        it between registered buffers, so it does not hand off (collectives/handoff.py)."""
        over = dict(self._algo(rs, msg.get("algo")))
        comm = self._p2p_comm(rs, msg)
        args = (self.planner.topology, self.planner.algo, over, rs.rank, msg["peer"], msg["nbytes"], comm)
        ns = handoff_ns(*args)
        slots = send_slots(*args) if ns is not None else None
        more: dict[str, Any] = {"slots": list(slots.steps), "one_op": slots.one_op} if slots is not None else {}
        if slots is not None and slots.zero_copy:
            more["zero_copy"] = True
        if slots is not None and slots.back_ns:
            more["back_ns"] = slots.back_ns
        tag, seq = msg.get("tag"), msg.get("seq")  # optional: the send's match, to say whether its receive is in
        if tag is not None or seq is not None:
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (tag, seq)):
                raise RunFailed(E_PROTOCOL, f"rank {rs.rank}: a handoff's tag and seq must be integers")
            more["ready"] = self.matcher.recv_issued(rs.rank, msg["peer"], tag, seq, self._pg(rs, msg, "a handoff"))
        self.send(rs.rank, encode("handed", self.engine.now(), ns=ns, **more))

    def _on_plans(self, rs: RankState, msg: Message) -> None:
        """How many kernels a rank's NCCL group of p2p ops launches (collectives/nccl/live_launches.py), answered at
        once: it needs nothing of the peers. `ops`: [peer, bytes, send] each, in issue order, on `comm`."""
        comm, ops = msg["comm"], msg["ops"]
        ok = all(
            isinstance(op, list)
            and len(op) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) for v in op[:2])
            and isinstance(op[2], bool)
            and 0 <= op[0] < self.matcher.world
            and op[1] >= 0
            for op in ops
        )
        if not ok or len(set(comm)) != len(comm) or not all(0 <= r < self.matcher.world for r in comm):
            raise RunFailed(
                E_PROTOCOL,
                f"rank {rs.rank}: a group's plans need distinct ranks of the run as comm and [peer, bytes, send] "
                f"ops, got comm {comm!r}, ops {ops[:4]!r}",
            )
        over = dict(self._algo(rs, msg.get("algo")))
        got = rank_launches(
            self.planner.topology, self.planner.algo, over, rs.rank, tuple(comm), [(o[0], o[1], o[2]) for o in ops]
        )
        self.send(rs.rank, encode("planned", self.engine.now(), plans=got))

    def _missing(self, rank: int, rv: Rendezvous) -> None:
        first = next(iter(rv.calls.values()))
        why = self.ranks[rank].gave_up
        why = f" (it {why}: torch's Work.wait(timeout), which aborts the call's NCCL communicator)" if why else ""
        m = self.mirrors
        dedup = (
            f"; with rank deduplication {m.live} live processes run the {m.world} ranks' program (rank r as live rank "
            f"r mod {m.live}): a program whose ranks differ beyond that needs --dedup off"
            if m.active
            else ""
        )
        raise RunFailed(
            E_DEADLOCK,
            f"missing participant: rank {rank} finished at {self.ranks[rank].t_finish} ns without joining "
            f"{rv.describe()}{why}; first call: {first.describe()}{dedup}",
        )

    def _on_clock(self, rs: RankState, msg: Message) -> None:
        self._stamp(rs, msg.t, "a clock report")
        step = msg.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self._step_started(step, msg.t)
        if msg["block"]:
            rs.target = self._floor(msg.t)
            self._block(rs, BARRIER)

    def _check_handles(self, rs: RankState, handles: list[int]) -> None:
        unknown = [h for h in handles if h not in rs.issued]
        if not handles or unknown:
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank} waits on unknown handle(s) {unknown or handles}")

    def _on_wait(self, rs: RankState, msg: Message) -> None:
        self._stamp(rs, msg.t, "a wait")
        self._check_handles(rs, msg["handles"])
        if msg["until"] < msg.t:
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank} waits until {msg['until']} ns, before its clock ({msg.t} ns)")
        rs.handles, rs.deadline = list(msg["handles"]), msg["until"]
        self._block(rs, WAIT)

    def _on_cancel(self, rs: RankState) -> None:
        """The rank gave up its wait at a wall-clock deadline (torch's `Work.wait(timeout)`): it runs again, from
        where the network is if it moved on while the rank waited (as a wait that reached its `until`); what it
        waited for still completes (`rs.results`, told with its next answer). A wait answered already (the answer
        crossed the cancel) stays answered: the answer reaches the rank first. `cancelled` carries its time."""
        if rs.state == WAIT:
            if not rs.gave_up:
                calls = " | ".join(self._short(rs, h) for h in rs.handles)
                rs.gave_up = f"gave up its wait on {calls} at {rs.promise} ns past the program's wall-clock timeout"
            self._promise(rs, max(rs.promise, self.engine.now()))
            rs.state, rs.handles, rs.deadline = RUN, [], INF_NS
            del self.blocked[rs.rank]
            self.waiting.pop(rs.rank, None)
            self._dirty.discard(rs.rank)
        elif rs.state != RUN:
            raise RunFailed(E_PROTOCOL, f"rank {rs.rank} cancelled a wait while {rs.state}")
        now = self.engine.now()
        self.send(rs.rank, encode("cancelled", rs.promise, now=now, lease=self._lease()))

    def _on_test(self, rs: RankState, msg: Message) -> None:
        self._stamp(rs, msg.t, "a test")
        self._check_handles(rs, [msg["h"]])
        rs.handles, rs.target = [msg["h"]], msg.t
        self._block(rs, TEST)

    def _on_finish(self, rs: RankState, msg: Message) -> None:
        self._stamp(rs, msg.t, "finish")
        rs.state, rs.t_finish, rs.output, rs.cpu_s = DONE, msg.t, msg["results"], float(msg["cpu_s"])
        self.live -= 1
        self.send(rs.rank, encode("ack", msg.t))
        for rv in self.matcher.waiting_for(rs.rank):
            self._missing(rs.rank, rv)

    # ----- collectives -> flows ------------------------------------------------------------------
    def _launch_ready(self) -> None:
        """Launch the held rendezvous that nothing can still precede, by (start, key): the same order and the
        same engine state at each launch whatever order the ranks' messages arrived in.

        Only once every live rank is blocked (nothing can arrive before the coordinator answers; `settled`),
        after the held storage transfers and the scenario's step starts. Window mode: then all of them; the
        engine does not move between, so each starts when it would have.
        Exact mode: a rendezvous (a step) starting at s goes once every blocked rank wakes no earlier than s and
        the engine has run every event before s (a wake-up it causes comes first): `_may_start`."""
        if not self.settled():
            return
        self._resolve_any()
        self._start_io()
        while (step := self._held_step()) is not None and (self.window or self._may_start(step[0])):
            self._apply_step(*step)
        while self.held:
            s = self.held.head_start()
            assert s is not None
            if not self.window and not self._may_start(s):
                return
            self._launch(self.held.pop())

    def _launch(self, rv: Rendezvous) -> None:
        """All calls are in: decompose, submit at the latest issue time, record."""
        calls = list(rv.calls.values())
        first = calls[0]
        t_req = max(c.t for c in calls)
        now = self.engine.now()
        if t_req < now and self.window == 0:
            raise RunFailed(
                E_INTERNAL,
                f"exact mode broken: {rv.describe()} would start at {t_req} ns but the network is at {now} ns",
            )
        t_start = max(t_req, now)
        self.late_collectives += t_start > t_req
        comm: tuple[int, ...] = ()
        launch, op = None, 0
        if rv.key[0] == "p2p":
            kind, group, root = "send_recv", (rv.key[1], rv.key[2]), None
            name = next((c.name for c in calls if c.kind == "send" and c.name), first.name)
            comm = grouped_comm(rv)  # both ends in one group on the same communicator, else each its own
            launch, op = self.p2p_batches.launch_op(rv, t_req)  # its NCCL group's pairs, shared by the launch's
        else:
            kind, group, name = first.kind, rv.key[1], first.name
            root = group.index(first.root) if first.root is not None else None
        cid = len(self.records)
        call = CallSpec(
            kind, group, first.nbytes, first.dtype, root, name, dict(first.algo), comm, launch=launch, launch_op=op
        )
        call = dataclasses.replace(call, redop=first.redop) if first.redop != "sum" else call
        try:
            plan = self.planner.plan(call, name or f"coll{cid}")
        except (PhantoraError, TypeError) as exc:
            raise RunFailed(E_PROTOCOL, f"{exc} ({rv.describe()}; {first.describe()})") from None
        flows, last = plan.flows, plan.last
        job = key0 = None
        if self.jobs is not None:
            job = self.jobs.job_of(group[0])
            flows, key0 = self.job_traffic.stamp(job, flows)
        first_id = flows[0].id if flows else 0
        rec = CollRecord(cid, rv, kind, group, first.nbytes, first.dtype, t_req, t_start, first_id, len(flows))
        rec.name, rec.copies, rec.end_ns, rec.outstanding = name, plan.copies, t_start, len(flows)
        if job is not None:
            rec.job, rec.key0 = job, key0 or 0
        rec.traffic_class, rec.lossy, rec.lossless_why = plan.traffic_class, plan.lossy, plan.lossless_why
        rec.choice = plan.choice
        rec.comm = comm  # the canonical copy's; its shifts run on theirs (CollectivePlanner.plan)
        self.records.append(rec)
        for f in flows:
            self.flow_owner[f.id] = cid
        if self.keep_flows:
            self.flow_alone.update(flow_alone(flows))
        self.bounds.add(flows, t_start)
        for c in calls:
            self.ranks[c.rank].owner[c.handle] = cid
        last = self._received_with(rv, calls, last)
        for r in rv.members:
            mine = last.get(r)
            if mine:
                rec.pending[r] = mine
                for fid in mine:
                    rec.waiters.setdefault(fid, []).append(r)
            else:
                self._rank_done(rec, r, t_start)
        if flows:
            try:
                self.engine.submit(flows, at=t_start)
            except PhantoraError as exc:
                raise RunFailed(E_ENGINE, f"the engine refused {rv.describe()}: {exc}") from None

    def _received_with(self, rv: Rendezvous, calls: list[Call], last: dict[int, Any]) -> dict[int, Any]:
        """`last` (each member's last flows), where a lone send hands off, with its receiver's added to its sender's:
        its waits and the calls after it see its hand-off, and its end is when its data has arrived, which the later
        sends on its connection wait for (`StreamOrder`'s gate, `RankSession.handoff_at`: NCCL's proxy runs one send
        op a channel at a time). For a send relayed by PXN that is the relay's network sends' arrival, not its
        sender's last flows (its last NVLink step into the relay's buffer); elsewhere the same flows end both."""
        if rv.key[0] != "p2p":
            return last
        send = next((c for c in calls if c.kind == "send"), None)
        recv = next((c for c in calls if c.kind == "recv"), None)
        if send is None or recv is None or not self.streams.hands_off(send.rank, send.handle):
            return last
        theirs = last.get(recv.rank)
        if not theirs:
            return last
        return {**last, send.rank: set(last.get(send.rank) or ()) | set(theirs)}

    def _rank_done(self, rec: CollRecord, rank: int, t: int) -> None:
        rec.rank_done[rank] = t
        rs = self.ranks[rank]
        handle = rec.rv.calls[rank].handle
        rs.results[handle] = t
        rs.undelivered[handle] = t
        for rv in self.streams.woken(rank, handle):
            self._hold(rv)
        if rec.lossy is not None and rec.lost:
            zero = self.planner.lost_ranges(rec.lossy, rec.first_flow, rec.lost).get(rank)
            if zero:
                rs.lost[handle] = [[a, b] for a, b in zero]
        self._dirty.add(rank)

    def _keep(self, c: Completion) -> None:
        """Record one completion, up to MAX_KEPT_FLOWS: past it, none (a partial record would bias FCTs)."""
        if len(self.completions) < MAX_KEPT_FLOWS:
            self.completions.append(c, self.flow_alone.pop(c.flow_id, None))
            return
        self.keep_flows = False
        self.completions = CompletionLog()
        self.flow_alone = {}
        self.flows_note = f"per-flow records dropped: the run has more than {MAX_KEPT_FLOWS:,} flows"

    def _apply(self, done: list[Completion]) -> None:
        """Completions from the engine -> per-rank results."""
        for c in done:
            if c.flow_id < 0:  # a checkpoint transfer (bridge.storage_io)
                self.bounds.done(c.flow_id)
                mine = self.io.done(c)
                if mine is not None:
                    rs = self.ranks[mine[0]]
                    rs.results[mine[1]] = rs.undelivered[mine[1]] = c.end_ns
                    self._dirty.add(rs.rank)
                continue
            cid = self.flow_owner.pop(c.flow_id, None)
            self.bounds.done(c.flow_id)
            if cid is None and c.flow_id < self.n_background:
                self.background_done.append(c)
                continue
            if cid is None:
                raise RunFailed(E_ENGINE, f"the engine completed flow {c.flow_id}, which nobody submitted")
            if self.keep_flows:
                self._keep(c)
            rec = self.records[cid]
            rec.outstanding -= 1
            rec.end_ns = max(rec.end_ns, c.end_ns)
            if c.lost:
                rec.lost[c.flow_id] = c.lost
            for r in rec.waiters.pop(c.flow_id, ()):
                last = rec.pending[r]
                last.discard(c.flow_id)
                if not last:
                    del rec.pending[r]
                    rec.least.pop(r, None)
                    self._rank_done(rec, r, c.end_ns)  # completions come in end order: this is the max
            self._watch.discard(c.flow_id)  # as from every pending set holding it (`watched_earliest`)
            if not rec.outstanding:  # a dict keeps its table when emptied: a finished record keeps none
                rec.waiters, rec.pending, rec.least = {}, {}, {}

    # ----- the network clock ---------------------------------------------------------------------
    def _push(self, rs: RankState) -> None:
        heapq.heappush(self._promises, (rs.promise, rs.rank))

    def _promise(self, rs: RankState, t: int) -> None:
        """Raise a rank's promise, keeping the heap of test and barrier promises (stale entries skipped lazily)."""
        if t == rs.promise:
            return
        rs.promise = t
        if rs.state in (TEST, BARRIER):
            heap = self._promises
            self._push(rs)
            if len(heap) > 4 * len(self.ranks) + 64:  # drop the stale entries now and then
                heap[:] = [(x.promise, x.rank) for x in self.ranks if x.state in (TEST, BARRIER)]
                heapq.heapify(heap)

    def _block(self, rs: RankState, state: str) -> None:
        rs.state = state
        self.blocked[rs.rank] = rs
        self._dirty.add(rs.rank)
        if state == WAIT:
            self.waiting[rs.rank] = rs
        else:
            self._push(rs)

    def _floor(self, t: int) -> int:
        return t if self.window == 0 or t >= INF_NS else t - t % self.window

    def _wake_bound(self, rs: RankState) -> int:
        """The latest time a waiting rank can still be woken at (a known result, or its deadline)."""
        return min([rs.results[h] for h in rs.handles if h in rs.results], default=rs.deadline)

    def horizon(self) -> int:
        """The latest time the network may reach once every live rank is blocked (INF_NS: unbounded): the least
        time a rank in test or barrier waits for, and the earliest a waiting rank can wake at."""
        heap = self._promises
        while heap:
            p, r = heap[0]
            rs = self.ranks[r]
            if rs.state in (TEST, BARRIER) and rs.promise == p:
                break
            heapq.heappop(heap)
        h = heap[0][0] if heap else INF_NS
        for rs in self.waiting.values():
            h = min(h, self._wake_bound(rs))
        return h

    def watched(self) -> set[int]:
        """Flows whose completion can wake a waiting rank."""
        return self.watched_earliest()[0]

    def watched_earliest(self) -> tuple[set[int], int]:
        """`watched`, and the earliest bound among those flows (INF_NS if none): the least of each waited
        record's rank's `_least`, so a step reads no flow's bound again. The set is built again only when the
        waited groups ((record, rank), or (None, transfer)) change: else it is the last one, from which `_apply`
        took each flow as it completed, as it took it from every pending set (the caller only reads it, and an
        engine keeps no watch past its call)."""
        groups: list[tuple[int | None, int]] = []
        earliest = INF_NS
        for rank, h in self.streams.waited_on():  # a parked rendezvous starts when these end: stop there
            rs = self.ranks[rank]
            cid = rs.owner.get(h)
            if cid is not None and h not in rs.results:
                rec = self.records[cid]
                if rank in rec.pending:
                    groups.append((cid, rank))
                    earliest = min(earliest, self._least(rec, rank))
        for rs in self.waiting.values():
            for h in rs.handles:
                cid = rs.owner.get(h)
                if cid is not None and h not in rs.results:
                    rec = self.records[cid]
                    if rs.rank in rec.pending:
                        groups.append((cid, rs.rank))
                        earliest = min(earliest, self._least(rec, rs.rank))
                elif (tid := self.io.of.get((rs.rank, h))) is not None:
                    groups.append((None, tid))
                    earliest = min(earliest, self.bounds.bounds[tid])
        if groups != self._watch_groups:
            out: set[int] = set()
            for cid, x in groups:
                if cid is None:
                    out.add(x)
                else:
                    out.update(self.records[cid].pending[x])
            self._watch_groups, self._watch = groups, out
        return self._watch, earliest

    def _least(self, rec: CollRecord, rank: int) -> int:
        """The earliest bound among `rank`'s pending flows of `rec`. A heap of (bound, flow) built at the first ask
        and popped lazily: a rank's pending flows only leave, and an in-flight flow's bound never moves."""
        pending = rec.pending[rank]
        heap = rec.least.get(rank)
        if heap is None:
            bounds = self.bounds.bounds
            heap = rec.least[rank] = [(bounds[f], f) for f in pending]
            heapq.heapify(heap)
        while heap[0][1] not in pending:
            heapq.heappop(heap)
        return heap[0][0]

    def settled(self) -> bool:
        """Every live rank is blocked (and at least one is): no message can come before the coordinator answers,
        so what it knows now does not depend on the order the ranks' messages arrived in."""
        return bool(self.blocked) and len(self.blocked) == self.live

    def _step(self) -> bool:
        """One engine advance if the rules allow one; True if it ran.

        Only once every live rank is blocked (`settled`): an advance while a rank runs would go as far as that
        rank's last report, which depends on how far it got in wall-clock time, so the number of advances (and
        the replies' `now`) would too. Nobody needs the network before: it catches up then, with the same result.
        """
        if not self.settled():
            return False
        eng = self.engine
        now, nxt, hz = eng.now(), eng.next_event_time(), self.horizon()
        due = nxt is not None and nxt <= now
        watch, earliest = self.watched_earliest() if self.waiting or self.streams.parked else (set(), INF_NS)
        if self.window == 0:
            if hz < now:  # a rank released at the network's time runs, so none blocked is behind it
                raise RunFailed(E_INTERNAL, f"exact mode broken: horizon {hz} ns is behind the network ({now} ns)")
            step = self._held_step()
            for held in (self.held.head_start(), step[0] if step else None, self._any_floor):
                if held is not None:  # a held rendezvous' flows (a step's events) start before the engine runs that ns
                    hz = min(hz, held - 1)
            if hz < now or hz == INF_NS and (not watch or nxt is None):
                return False
            if hz == now and not due:
                return False
            done = advance_watching(eng, hz, watch, earliest)
        else:
            target = self._floor(hz)
            if watch and nxt is not None:  # stop in the window of the first possible wake-up
                target = min(target, max(self._floor(nxt) + self.window, self._floor(earliest)))
            if target >= INF_NS or target < now or (target == now and not due):
                return False
            done = eng.advance(target)
        self.rounds += 1
        self._apply(done)
        return True

    def _lease(self) -> int:
        """Window mode: the end of the window a released rank runs in (its barrier); exact mode: none."""
        return self.engine.now() + self.window if self.window else INF_NS

    def _reply(self, rs: RankState, h: int | None, t_done: int | None) -> None:
        now = self.engine.now()
        done = sorted([k, v] for k, v in rs.undelivered.items())
        lost = [[h, rs.lost.pop(h)] for h, _ in done if h in rs.lost]
        rs.undelivered.clear()
        lease = self._lease()
        rs.state, rs.handles, rs.deadline = RUN, [], INF_NS
        del self.blocked[rs.rank]
        self.waiting.pop(rs.rank, None)
        extra = {"lost": lost} if lost else {}
        self.send(rs.rank, encode("result", now, h=h, t_done=t_done, done=done, now=now, lease=lease, **extra))

    def _release(self) -> bool:
        """Answer every blocked rank whose answer is known; True if any was."""
        now = self.engine.now()
        released = False
        if now != self._release_now:
            self._release_now = now
            candidates = list(self.blocked.values())
        else:
            candidates = [self.blocked[r] for r in self._dirty if r in self.blocked]
        self._dirty.clear()
        for rs in candidates:
            if rs.state == WAIT:
                known = sorted((rs.results[h], h) for h in rs.handles if h in rs.results)
                limit = now + self.window if self.window else now  # window mode: anything in this window
                final = len(known) == len(rs.handles)
                if known and known[0][0] <= rs.deadline and (final or known[0][0] <= limit):
                    t_done, h = known[0]
                    self._promise(rs, max(rs.promise, t_done))
                    self._reply(rs, h, t_done)
                    released = True
                elif rs.deadline < INF_NS and (final or rs.deadline <= limit):
                    self._promise(rs, max(rs.promise, rs.deadline))
                    self._reply(rs, None, None)
                    released = True
            elif rs.state == TEST:
                h = rs.handles[0]
                t_known = rs.results.get(h)
                if t_known is not None or now >= rs.target:
                    self._reply(rs, h, t_known if t_known is not None and t_known <= rs.target else None)
                    released = True
            elif rs.state == BARRIER and now >= rs.target:
                self._reply(rs, None, None)
                released = True
        return released

    def progress(self) -> None:
        """Advance the network as far as the rules allow and answer blocked ranks.

        Raises RunFailed on a deadlock.
        """
        while True:
            self._launch_ready()
            self._release()
            while self._step():
                self._launch_ready()
                self._release()
                if self.on_round is not None:
                    self.on_round()
            if not (self._any_floor is not None and self._resolve_any(force=True)):  # stuck short of a send's time
                break
        self._check_deadlock()

    # ----- deadlock and the end ----------------------------------------------------------------
    def _describe_wait(self, rs: RankState) -> str:
        parts = []
        for h in rs.handles:
            call = rs.issued[h]
            cid = rs.owner.get(h)
            if cid is not None:
                rec = self.records[cid]
                parts.append(f"{call.describe()} (started {rec.t_start} ns, {rec.outstanding} flows in flight)")
                continue
            rv = next((p for p in self.matcher.pending.values() if p.calls.get(rs.rank) is call), None)
            a = self.anys.of(rs.rank, h) if rv is None else None
            if a is not None:
                parts.append(f"{call.describe()} from any of ranks {[r for r, _ in a.peers]}, none of which sent it")
                continue
            if rv is None:
                held = any(p.calls.get(rs.rank) is call for p in self.streams.parked.values())
                parts.append(call.describe() + (", matched, held behind an earlier call on its stream" if held else ""))
                continue
            who = []
            for m in rv.missing:
                other = self.ranks[m]
                if other.state == DONE:
                    who.append(f"rank {m} (finished at {other.t_finish} ns)")
                elif other.state == WAIT:
                    blocking = ", ".join(self._short(other, x) for x in other.handles)
                    who.append(f"rank {m} (itself waiting on {blocking})")
                else:
                    who.append(f"rank {m} (at {other.promise} ns, {other.state})")
            parts.append(f"{call.describe()} on {describe_key(rv.key)}, not issued by {', '.join(who)}")
        return f"rank {rs.rank} waits on " + " | ".join(parts)

    def stood(self) -> list[list[Any]]:
        """Where each rank not finished stands, for a run stopped past its bound: [rank, state ("run", "wait",
        "test", "barrier"), its last reported simulated ns, its last call ("" if none)]."""
        out: list[list[Any]] = []
        for rs in self.ranks:
            if rs.state != DONE:
                c = next(reversed(rs.issued.values()), None)
                last = f"{c.kind}{f' {c.name!r}' if c.name else ''} ({c.nbytes} B) at {c.t} ns" if c else ""
                out.append([rs.rank, rs.state, rs.promise, last])
        return out

    def _short(self, rs: RankState, h: int) -> str:
        c = rs.issued[h]
        rv = next((p for p in self.matcher.pending.values() if p.calls.get(rs.rank) is c), None)
        return f"{c.kind}({c.nbytes} B) on {describe_key(rv.key)}" if rv else f"{c.kind}({c.nbytes} B)"

    def _check_deadlock(self) -> None:
        if not self.live or len(self.blocked) < self.live:
            return
        live = [rs for rs in self.ranks if rs.state != DONE]
        if any(rs.state != WAIT for rs in live):
            return
        if any(self._wake_bound(rs) < INF_NS for rs in live):
            return
        watch = self.watched()
        if watch and self.engine.next_event_time() is not None:
            return
        lines = [f"deadlock at {self.engine.now()} ns: every live rank is waiting and nothing in flight can wake one"]
        if watch:
            lines[0] = f"deadlock at {self.engine.now()} ns: the network has flows in flight but no event left"
        if self.isolate:  # every job still running is stuck: each fails with its own ranks' waits
            assert self.jobs is not None
            stuck = sorted({self.jobs.job_of(rs.rank) for rs in live})
            for job in stuck:
                mine = [rs for rs in live if self.jobs.job_of(rs.rank) == job]
                text = "\n".join([lines[0], *("  " + self._describe_wait(rs) for rs in mine)])
                self.fail_job(job, E_DEADLOCK, text)
            return
        lines += ["  " + self._describe_wait(rs) for rs in live]
        finished = [rs.rank for rs in self.ranks if rs.state == DONE]
        if finished:
            lines.append(f"  finished ranks: {finished}")
        raise RunFailed(E_DEADLOCK, "\n".join(lines))

    def all_finished(self) -> bool:
        return self.live == 0

    def finalize(self) -> dict[str, Any]:
        """After every rank finished: check nothing is left unmatched, launch what is held, drain the network,
        report."""
        for a in list(self.anys.open):
            text = f"missing participant: every rank finished, but {a.call.describe()} from any source got no send"
            if not self.isolate:
                raise RunFailed(E_DEADLOCK, text)
            assert self.jobs is not None
            self.fail_job(self.jobs.job_of(a.call.rank), E_DEADLOCK, text)
        for rv in list(self.matcher.pending.values()):
            text = f"missing participant: every rank finished, but {rv.describe()}"
            if not self.isolate:
                raise RunFailed(E_DEADLOCK, text)
            assert self.jobs is not None
            self.fail_job(self.jobs.job_of(rv.members[0]), E_DEADLOCK, text)
        try:
            self._start_io()
            while self.held or self._steps_held or self.streams.parked:  # in order, each once the engine ran all before
                if not self.held and not self._steps_held:  # only parked ones: run to the next end that may free one
                    nxt = self.engine.next_event_time()
                    if nxt is None:
                        raise RunFailed(E_DEADLOCK, "every rank finished, but collectives wait for ones that never end")
                    self._apply(self.engine.advance(nxt))
                    continue
                step = self._held_step()
                s = min(x for x in (self.held.head_start(), step[0] if step else None) if x is not None)
                nxt = self.engine.next_event_time()
                if not self.window and nxt is not None and nxt < s:
                    if self.streams.parked:  # an end before s may free a parked one, which starts then: stop there
                        self._apply(self.engine.advance(nxt))
                        continue
                    self._apply(self.engine.advance(s - 1))
                if step is not None and step[0] == s:
                    self._apply_step(*step)
                else:
                    self._launch(self.held.pop())
            self._apply(self.engine.drain())
        except PhantoraError as exc:
            raise RunFailed(E_ENGINE, f"the network did not drain: {exc}") from None
        stats = dict(self.engine.stats())
        channels = self.engine.channels()  # an engine in this process: links.csv comes with the outcome
        usage = channels.channel_usage(max(1, self.engine.now())) if channels is not None else []
        return {
            "ranks": [[rs.rank, rs.output, rs.t_finish] for rs in self.ranks],
            "collectives": [rec.to_dict() for rec in self.records],
            "completions": self.completions.wire(),
            "completion_alone": self.completions.alone_wire(),
            "links": [dataclasses.asdict(u) for u in usage],
            "flows_note": self.flows_note,
            "rounds": self.rounds,
            "late_collectives": self.late_collectives,
            "messages": self.messages,
            "now": self.engine.now(),
            "window_ns": self.window,
            "engine_stats": {str(k): v for k, v in stats.items() if _plain(v)},
            "transport": self._transport(),
            "rank_cpu_s": [rs.cpu_s for rs in self.ranks],
            "traffic_bytes": {"network": self.bounds.network_bytes, "fabric": self.bounds.fabric_bytes},
            **({"jobs": self._jobs_outcome()} if self.jobs is not None else {}),
            **self.io.outcome(),
            **self._scenario_outcome(),
            **({"background": [completion_to_wire(c) for c in self.background_done]} if self.n_background else {}),
        }

    def _scenario_outcome(self) -> dict[str, Any]:
        """A scenario's engine, here or in the network server: the link actions it applied (links by name), the
        background traffic done and its FCT slowdown by size bucket, the steps ranks started and, with per-flow
        records kept, the job's own FCT slowdown by size bucket; {} without a scenario."""
        from bridge.remote import RemoteSimulator
        from phantora.results.scenario import completion_rows, engine_outcome, fct_slowdown_buckets

        eng = self.net
        out = eng.scenario_outcome() if isinstance(eng, RemoteSimulator) else engine_outcome(eng)
        if not out:
            return {}
        out["steps_started"] = {str(k): v for k, v in sorted(self.steps_started.items())}
        if self.keep_flows:
            out["fct_slowdown_ml"] = fct_slowdown_buckets(
                completion_rows(self.topology, self.completions, self.completions.alone())
            )
        return {"scenario": out}

    def _transport(self) -> list[list[int]]:
        """Per-flow transport counters of a packet engine (here or on the server), for flows.csv; [] without."""
        fabric = self.engine.fabric()
        if fabric is not None:
            return [transport_row(t) for t in fabric.flow_transport().values()]
        return self.transport_rows() if self.transport_rows is not None and self.completions else []

    def _jobs_outcome(self) -> list[dict[str, Any]]:
        """Per job: its name, ranks, status (complete or failed, with the error) and bytes per channel."""
        assert self.jobs is not None
        out = []
        for i, j in enumerate(self.jobs.jobs):
            fail = self.job_failures.get(i)
            d: dict[str, Any] = {**j.to_dict(), "status": "failed" if fail else "complete"}
            if fail:
                d["error"] = dict(fail)
            d["channel_bytes"] = sorted([ch, b] for ch, b in self.job_traffic.channel_bytes[i].items())
            out.append(d)
        return out


def _scalar(v: object) -> bool:
    return isinstance(v, (int, float, str, bool))


def _plain(v: object) -> bool:
    """A stat results.json keeps: a scalar or a list of scalars (e.g. the approximations used)."""
    return _scalar(v) or isinstance(v, list) and all(map(_scalar, v))


def _signal_name(number: int) -> str:
    """SIGKILL for 9; "signal N" for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
