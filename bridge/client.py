"""`RankClient`: what a rank process (the runtime, or the replay rank) uses to talk to the coordinator.

Time contract (all times are the rank's virtual clock, integer ns, never decreasing):
- every call stamped t promises that the rank will issue nothing stamped earlier than t;
- `wait` is a blocking CPU wait: when it returns t_done, the rank's clock is at least t_done;
- `advance_clock(t)` says the clock reached t. In window mode it blocks at each window end until
  the network has caught up (the window barrier); in exact mode it sends nothing (the network
  moves only while every rank is blocked), so it is free;
- `test(h, t)` answers as of time t: exactly in exact mode; in window mode from what the last
  barrier delivered (a completion inside the current window may show up one window late).

A completion time is per rank: the time the rank's own last flows of the collective arrived (its
share of the collective is done), or the collective's start if it has no traffic; a send or recv
completes when the transfer's flow has arrived. Errors from the coordinator (mismatch, deadlock,
peer death, timeouts) raise `BridgeError` carrying the coordinator's diagnostic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import zmq

from bridge import rank_beat
from bridge.errors import BridgeError, ProtocolError, WaitTimedOut
from bridge.liveness import Silence
from bridge.protocol import INF_NS, Message, decode, encode
from bridge.transport import PEER_TIMEOUT_S, STARTUP_TIMEOUT_S, beyond_loopback, connect_dealer, recv_within
from phantora.collectives.spec import DTYPE_BYTES, KINDS, REDOPS, REDUCING

ENV_VARS = ("PHANTORA_ENDPOINT", "PHANTORA_TOKEN", "RANK", "WORLD_SIZE")

# Exit code of a rank that failed only because a peer's connection dropped (gloo: "Connection reset
# by peer"): the peer died first. The launcher then waits a moment for that peer's own death, so the
# run names the culprit instead of its victim.
PEER_LOST_EXIT = 3

__all__ = ["PEER_LOST_EXIT", "RankClient", "WaitTimedOut"]  # WaitTimedOut: the runtime's one error of the bridge


class RankClient:
    """One rank's connection to the coordinator. Not thread-safe: use it from one thread."""

    def __init__(
        self,
        endpoint: str,
        token: str,
        rank: int,
        world: int,
        *,
        peer_timeout_s: float = PEER_TIMEOUT_S,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        job: int | None = None,
    ) -> None:
        """`job`: in a run of several jobs, this rank's job (its ranks, groups and peers are the job's own)."""
        self.rank = rank
        self.world = world
        self.peer_timeout_s = peer_timeout_s
        self._ctx = zmq.Context()
        self._sock = connect_dealer(self._ctx, endpoint)
        self._clock = 0  # the latest time this rank reached
        self._lease = INF_NS  # window mode: the end of the current window (the barrier)
        self._known_until = 0
        self._results: dict[int, int] = {}
        self._lost: dict[int, list[tuple[int, int]]] = {}  # DLCP: handle -> tensor byte ranges the network lost
        self._handles: set[int] = set()
        self._next_handle = 1
        self._p2p_comm: list[int] | None = None  # the communicator of the p2p group open now (p2p_group)
        # a recv from any source: told its send's (src, seq) by the coordinator's `source` (`p2p_any`)
        self.on_source: Callable[[int, int, int], None] | None = None
        self._sources: dict[int, tuple[int, int]] = {}
        self._error: BridgeError | None = None
        self._closed = False
        self._cpu0 = time.process_time()
        self._coordinator: Silence | None = None  # its silence clock, once it said who it is (bridge/liveness.py)
        extra = {"job": job} if job is not None else {}
        self._sock.send(encode("hello", 0, role="rank", token=token, rank=rank, world=world, pid=os.getpid(), **extra))
        welcome = self._await("welcome", startup_timeout_s)
        if welcome["world"] != world:
            raise BridgeError(f"rank {rank}: the coordinator runs {welcome['world']} ranks, this rank was told {world}")
        self.window_ns: int = welcome["window_ns"]
        self.live: int = int(welcome["info"].get("live") or world)  # rank deduplication: live rank processes
        self._lease = welcome["lease"]
        local = not beyond_loopback(endpoint)  # ipc or loopback: the coordinator's process can be seen
        self._coordinator = Silence(int(welcome["info"]["pid"]) if local else None)

    @classmethod
    def from_env(cls) -> RankClient:
        """Connect with PHANTORA_ENDPOINT, PHANTORA_TOKEN, RANK and WORLD_SIZE (and PHANTORA_JOB in a run of
        several jobs), set by the launcher."""
        missing = [v for v in ENV_VARS if not os.environ.get(v)]
        if missing:
            raise BridgeError(f"not started by the phantora launcher: {', '.join(missing)} not set")
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except ValueError:
            raise BridgeError("RANK and WORLD_SIZE must be integers") from None
        timeout = float(os.environ.get("PHANTORA_PEER_TIMEOUT_S", PEER_TIMEOUT_S))
        job = os.environ.get("PHANTORA_JOB")
        if os.environ.get("PHANTORA_RUN_DIR"):  # the launcher's sign that this process lives (bridge/rank_watch.py)
            rank_beat.start(os.environ["PHANTORA_RUN_DIR"], rank)
        return cls(
            os.environ["PHANTORA_ENDPOINT"],
            os.environ["PHANTORA_TOKEN"],
            rank,
            world,
            peer_timeout_s=timeout,
            job=int(job) if job else None,
        )

    # ----- state -------------------------------------------------------------------------------
    @property
    def clock(self) -> int:
        """The latest time this rank reached (reported or not)."""
        return self._clock

    @property
    def exact(self) -> bool:
        return self.window_ns == 0

    @property
    def released_ns(self) -> int | None:
        """Window mode: the network's ns in the coordinator's last answer to this rank (a wait's, a test's or a
        barrier's `now`), the round it has run on in since: the coordinator launches what the rank issues now with
        every rendezvous held when all ranks block again, before the network moves (bridge/core.py
        `_launch_ready`). None in exact mode."""
        return None if self.exact else self._known_until

    # ----- transport -------------------------------------------------------------------------
    def _raise(self, msg: Message) -> None:
        self._error = BridgeError(f"rank {self.rank}: {msg['text']}", code=msg["code"])
        raise self._error

    def _take(self, msg: Message) -> None:
        """Apply what any message from the coordinator tells us."""
        if msg.type == "error":
            self._raise(msg)
        elif msg.type == "result":
            for h, t in msg["done"]:
                self._results[h] = t
            for h, ranges in msg.get("lost") or ():
                self._lost[h] = [(int(a), int(b)) for a, b in ranges]
            self._known_until = max(self._known_until, msg["now"])
            self._lease = msg["lease"]
        elif msg.type == "source":
            self._sources[msg["h"]] = (msg["src"], msg["seq"])
            if self.on_source is not None:
                self.on_source(msg["h"], msg["src"], msg["seq"])

    def _await(self, want: str, timeout_s: float | None = None, deadline: float | None = None) -> Message:
        """Block until a `want` message arrives, taking heartbeats and errors on the way; WaitTimedOut if `deadline`
        (`time.monotonic()`) passes first."""
        while True:
            msg = self._recv(deadline, timeout_s)
            self._take(msg)
            if msg.type == want:
                return msg

    def _recv(self, deadline: float | None, timeout_s: float | None = None) -> Message:
        """The coordinator's next message (see `recv_within`)."""
        frames = recv_within(
            self._sock, timeout_s or self.peer_timeout_s, "the coordinator", self._coordinator, deadline
        )
        try:
            return decode(b"".join(frames))
        except ProtocolError as exc:
            raise BridgeError(f"rank {self.rank}: bad message from the coordinator: {exc}") from None

    def _poll(self) -> None:
        """Take pending pushes (errors) without blocking."""
        while self._sock.poll(0, zmq.POLLIN):
            try:
                self._take(decode(self._sock.recv()))
            except ProtocolError as exc:
                raise BridgeError(f"rank {self.rank}: bad message from the coordinator: {exc}") from None

    def _check(self, t: int, what: str) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise BridgeError(f"rank {self.rank}: the client is closed")
        if not isinstance(t, int) or isinstance(t, bool):
            raise BridgeError(f"rank {self.rank}: {what} time must be integer ns, got {t!r}")
        if t < self._clock:
            raise BridgeError(
                f"rank {self.rank}: {what} stamped {t} ns, before the rank's clock ({self._clock} ns); "
                "a rank's time never goes back"
            )

    def _send(self, type_: str, t: int, **fields: Any) -> None:
        self._sock.send(encode(type_, t, **fields))
        self._clock = max(self._clock, t)

    def _barrier(self, t: int) -> None:
        """Window mode: report t and wait until the network has reached t's window."""
        self._send("clock", t, block=True)
        self._await("result")

    def _enter(self, t: int, what: str) -> None:
        """Common start of a stamped call: checks, pushes, and the window barrier if t crosses it."""
        self._check(t, what)
        self._poll()
        if not self.exact and t >= self._lease:
            self._barrier(t)

    def _handle(self) -> int:
        h = self._next_handle
        self._next_handle += 1
        self._handles.add(h)
        return h

    # ----- the API -----------------------------------------------------------------------------
    def collective(
        self,
        *,
        group: Sequence[int],
        seq: int,
        kind: str,
        nbytes: int,
        dtype: str,
        root: int | None,
        t_issue_ns: int,
        name: str = "",
        algo: dict[str, Any] | None = None,
        stream: int | None = None,
        launch: int | None = None,
        after: Sequence[int] = (),
        redop: str = "sum",
        pg: int = 0,
    ) -> int:
        """Issue a collective (non-blocking); returns a handle.

        `group`: global ranks in group order; `seq`: per-group sequence number (the same on every
        member); `root`: the *global* rank of a broadcast/reduce root; `name`: a label for records;
        `algo`: AlgoOptions fields overriding the run's (every member must pass the same); `stream`: this
        rank's stream for it (its process group's NCCL stream), on which its collectives run in turn; `launch`:
        the NCCL group launch it belongs to (a coalescing block), whose calls run together (bridge/stream_order.py);
        `after`: handles of this rank's collectives it starts after (those its CUDA stream waits for: stream_deps);
        `redop`: the reduction of an all-reduce, reduce-scatter or reduce (sent only when not sum: absent = sum);
        `pg`: which of this rank's process groups over `group` it runs on, numbered as created (sent only when not 0).
        """
        if kind not in KINDS or kind == "send_recv":
            raise BridgeError(f"rank {self.rank}: unknown collective kind {kind!r}")
        if dtype not in DTYPE_BYTES:
            raise BridgeError(f"rank {self.rank}: unknown dtype {dtype!r}")
        if nbytes < 0 or self.rank not in group:
            raise BridgeError(f"rank {self.rank}: bad collective (nbytes={nbytes}, group={list(group)})")
        if redop not in REDOPS or (redop != "sum" and kind not in REDUCING):
            raise BridgeError(f"rank {self.rank}: bad reduction {redop!r} for {kind}")
        self._enter(t_issue_ns, kind)
        h = self._handle()
        self._send(
            "coll",
            t_issue_ns,
            h=h,
            group=[int(r) for r in group],
            seq=int(seq),
            kind=kind,
            nbytes=int(nbytes),
            dtype=dtype,
            root=root,
            name=name,
            algo=dict(algo) if algo else None,
            **({"stream": int(stream)} if stream is not None else {}),
            **({"launch": int(launch)} if launch is not None else {}),
            **({"after": [int(x) for x in after]} if after else {}),
            **({"redop": redop} if redop != "sum" else {}),
            **({"pg": int(pg)} if pg else {}),
        )
        return h

    def p2p_group(self, comm: Sequence[int] | None) -> None:
        """NCCL's group for p2p (PyTorch's coalescing: `batch_isend_irecv`): the sends and recvs issued until the
        next call run as one grouped launch on the communicator `comm` (its global ranks in group order), whose
        p2p connections they share; None ends the group (a lone send/recv runs on its pair's own communicator)."""
        self._p2p_comm = [int(r) for r in comm] if comm else None

    @property
    def p2p_comm(self) -> tuple[int, ...]:
        """The communicator of the p2p group open now (`p2p_group`), () when none is."""
        return tuple(self._p2p_comm or ())

    def p2p(
        self,
        *,
        peer: int,
        is_send: bool,
        tag: int,
        seq: int,
        nbytes: int,
        t_issue_ns: int,
        name: str = "",
        algo: dict[str, Any] | None = None,
        stream: int | None = None,
        launch: int | None = None,
        after: Sequence[int] = (),
        handoff: int | None = None,
        gate: Sequence[int] = (),
        pg: int = 0,
    ) -> int:
        """Issue a send or a recv (non-blocking), matched by (src, dst, tag, seq); returns a handle. `algo`: as a
        collective's (both ends pass the same); `stream`, `launch`, `after`: as a collective's (the stream its NCCL
        communicator runs it on, its group launch, this rank's calls it starts after). `handoff`: a lone send's
        kernel ns (`handoff()`): the rank's calls after it follow its hand-off, not its flow; `gate`: this rank's
        earlier sends whose flows end before it hands off (phantora/collectives/slot_window.py); `pg`: which of this
        rank's process groups holding both ends it runs on, numbered as created (sent only when not 0)."""
        if nbytes < 0 or peer == self.rank:
            raise BridgeError(f"rank {self.rank}: bad transfer (peer={peer}, nbytes={nbytes})")
        self._enter(t_issue_ns, "send" if is_send else "recv")
        h = self._handle()
        self._send(
            "p2p",
            t_issue_ns,
            h=h,
            peer=int(peer),
            send=bool(is_send),
            tag=int(tag),
            seq=int(seq),
            nbytes=int(nbytes),
            name=name,
            **({"comm": self._p2p_comm} if self._p2p_comm else {}),
            **({"algo": dict(algo)} if algo else {}),
            **({"stream": int(stream)} if stream is not None else {}),
            **({"launch": int(launch)} if launch is not None else {}),
            **({"after": [int(x) for x in after]} if after else {}),
            **({"handoff": int(handoff)} if handoff is not None else {}),
            **({"gate": [int(x) for x in gate]} if gate else {}),
            **({"pg": int(pg)} if pg else {}),
        )
        return h

    def p2p_any(
        self,
        *,
        peers: Sequence[tuple[int, int]],
        tag: int,
        nbytes: int,
        t_issue_ns: int,
        name: str = "",
        algo: dict[str, Any] | None = None,
    ) -> int:
        """Issue a recv from any of `peers` ((global rank, pg) pairs: gloo's recvAnysource; non-blocking), on no
        stream; returns a handle. The coordinator gives it a send (bridge/anysource.py) and says which in a `source`
        message, taken by `on_source(handle, src, seq)` and `source(handle)`, before the recv's result."""
        if nbytes < 0 or not peers or any(p == self.rank for p, _ in peers):
            raise BridgeError(f"rank {self.rank}: bad recv from any source (peers={list(peers)}, nbytes={nbytes})")
        self._enter(t_issue_ns, "recv")
        h = self._handle()
        self._send(
            "p2p",
            t_issue_ns,
            h=h,
            peer=-1,
            send=False,
            tag=int(tag),
            seq=-1,
            nbytes=int(nbytes),
            name=name,
            any=[[int(p), int(pg)] for p, pg in peers],
            **({"algo": dict(algo)} if algo else {}),
        )
        return h

    def source(self, handle: int) -> tuple[int, int] | None:
        """The (src, seq) a recv from any source took, once the coordinator said (None before)."""
        return self._sources.get(handle)

    def storage_io(
        self, *, kind: str, nbytes: int, t_issue_ns: int, host_bps: float, shared_bps: float | None, name: str = ""
    ) -> int:
        """A checkpoint file read or written from `t_issue_ns` (non-blocking): a transfer on the storage the ranks
        share, `host_bps` per host and `shared_bps` in all (bridge.storage_io); returns a handle to `wait` on."""
        if kind not in ("read", "write") or nbytes < 0:
            raise BridgeError(f"rank {self.rank}: bad storage transfer ({kind!r} of {nbytes} B)")
        self._enter(t_issue_ns, f"storage {kind}")
        h = self._handle()
        shared = None if shared_bps is None else float(shared_bps)
        self._send(
            "io", t_issue_ns, h=h, kind=kind, nbytes=int(nbytes), name=name, host_bps=float(host_bps), shared_bps=shared
        )
        return h

    def post_value(self, *, group: Sequence[int], key: int, data: bytes, reads: bool = True, pg: int = 0) -> None:
        """An object collective's bytes for `group` under `key` (bridge.values), posted before its timed
        collectives; `reads` False: this rank will not read the group's values back (a send); `pg`: its process
        group over `group` (a collective's `pg`; sent only when not 0). Takes no time."""
        self._check(self._clock, "post_value")
        members = [int(r) for r in group]
        more = {"pg": int(pg)} if pg else {}
        self._sock.send(encode("value", self._clock, group=members, key=int(key), data=data, reads=reads, **more))

    def take_values(self, *, group: Sequence[int], key: int, pg: int = 0) -> list[bytes | None]:
        """The bytes each member of `group` posted under `key` (None: none), asked once the timed collectives that
        followed the posts are done (so every member has posted); `pg` as `post_value`'s. Takes no time."""
        self._check(self._clock, "take_values")
        more = {"pg": int(pg)} if pg else {}
        self._sock.send(encode("values", self._clock, group=[int(r) for r in group], key=int(key), **more))
        return list(self._await("valued")["data"])

    def handoff(self, *, peer: int, nbytes: int, algo: dict[str, Any] | None = None) -> int | None:
        """The ns a lone send of `nbytes` to `peer` within its connection's buffer takes from its start to its
        hand-off (its sender's kernel ends; collectives/handoff.py); None where the model does not time it.
        Takes no time."""
        return self.handoff_plan(peer=peer, nbytes=nbytes, algo=algo)[0]

    def handoff_plan(
        self,
        *,
        peer: int,
        nbytes: int,
        algo: dict[str, Any] | None = None,
        tag: int | None = None,
        seq: int | None = None,
        comm: Sequence[int] | None = None,
        pg: int = 0,
    ) -> tuple[int | None, list[int] | None, bool, bool, bool, int]:
        """As `handoff`, with the send's connection slots: (ns, its steps per channel part or None, whether its
        channels' proxy holds one send at a time: a shared network buffer; collectives/handoff.py `send_slots`,
        and, given the send's `tag` and `seq`, whether the peer has already issued its receive; last, whether NCCL
        moves it zero-copy between registered buffers, so it does not hand off; and the ns after an earlier send's
        flows end that its slots are free at the sender, `Slots.back_ns`). `comm`: the communicator it runs
        on (its global ranks), when not the pair's own (eager init: the group's); `pg`: the send's process group, as
        `p2p`'s."""
        self._check(self._clock, "handoff")
        more: dict[str, Any] = {"algo": dict(algo)} if algo else {}
        if tag is not None and seq is not None:
            more.update(tag=int(tag), seq=int(seq))
            if pg:
                more["pg"] = int(pg)
        if comm:
            more["comm"] = [int(r) for r in comm]
        self._sock.send(encode("handoff", self._clock, peer=int(peer), nbytes=int(nbytes), **more))
        got = self._await("handed")
        ns, slots = got["ns"], got.get("slots")
        steps = [int(x) for x in slots] if isinstance(slots, list) else None
        ready, zero_copy = bool(got.get("ready", False)), bool(got.get("zero_copy", False))
        back = int(got.get("back_ns", 0))
        return (None if ns is None else int(ns)), steps, bool(got.get("one_op", False)), ready, zero_copy, back

    def group_plans(
        self, *, comm: Sequence[int], ops: Sequence[Sequence[Any]], algo: dict[str, Any] | None = None
    ) -> int:
        """The kernels this rank's NCCL group of p2p `ops` ([peer, bytes, send] each, in issue order) on communicator
        `comm` (global ranks) launches at its ncclGroupEnd (collectives/nccl/live_launches.py). Takes no time."""
        self._check(self._clock, "plans")
        more: dict[str, Any] = {"algo": dict(algo)} if algo else {}
        wire = [[int(op[0]), int(op[1]), bool(op[2])] for op in ops]
        self._sock.send(encode("plans", self._clock, comm=[int(r) for r in comm], ops=wire, **more))
        return int(self._await("planned")["plans"])

    def known(self, handle: int) -> int | None:
        """`handle`'s t_done if the coordinator has told it already (in any answer), else None; sends nothing and
        leaves the clock where it is."""
        return self._results.get(handle)

    def lost(self, handle: int) -> list[tuple[int, int]]:
        """DLCP: the (offset, bytes) ranges of a done loss-tolerant collective's result that the network dropped
        (to be zeroed); [] for any other. Asked once, after `wait`."""
        return self._lost.pop(handle, [])

    def wait(self, handle: int, deadline: float | None = None) -> int:
        """Block until this rank's part of `handle` is done; return t_done (the clock moves to it). With `deadline`
        (a `time.monotonic()` instant: host wall time), WaitTimedOut if the coordinator has not answered by then: the
        wait is given up (`_cancel`) and the rank runs on; `handle` still completes, and a later wait finds when."""
        got = self.wait_any([handle], deadline=deadline)
        assert got is not None
        return got[1]

    def wait_any(
        self, handles: Sequence[int], until_ns: int | None = None, deadline: float | None = None
    ) -> tuple[int, int] | None:
        """Block until one of `handles` is done; return (handle, t_done) of the earliest-finishing one.

        With `until_ns`, give up once the network has passed it with none done: return None, and
        the clock moves to `until_ns` (in window mode "passed" means the window holding it). `deadline`: as `wait`'s.
        """
        self._check(self._clock, "wait")
        unknown = [h for h in handles if h not in self._handles]
        if not handles or unknown:
            raise BridgeError(f"rank {self.rank}: wait on unknown handle(s) {unknown or list(handles)}")
        until = INF_NS if until_ns is None else until_ns
        if until < self._clock:
            raise BridgeError(f"rank {self.rank}: wait until {until} ns, before the rank's clock ({self._clock} ns)")
        known = sorted((self._results[h], h) for h in handles if h in self._results)
        if known and known[0][0] <= until and (len(known) == len(handles) or known[0][0] < self._known_until):
            t, h = known[0]
        elif len(known) == len(handles) or (until < self._known_until and until_ns is not None):
            t, h = until, None
        else:
            self._poll()
            self._send("wait", self._clock, handles=[int(h) for h in handles], until=until)
            try:
                msg = self._await("result", deadline=deadline)
            except WaitTimedOut:
                answered = self._cancel()
                if answered is None:
                    raise
                msg = answered
            h, t = msg["h"], msg["t_done"]
            if h is None:
                t = until
        self._clock = max(self._clock, t)
        return None if h is None else (h, t)

    def _cancel(self) -> Message | None:
        """Give up the wait in flight (its deadline passed) and take the coordinator's `cancelled`, which moves the
        clock to where the rank runs again. The wait's `result`, if the coordinator had sent it already, comes first:
        returned, the wait answered after all."""
        self._send("cancel", self._clock)
        answer = None
        while True:
            msg = self._recv(None)
            self._take(msg)
            if msg.type == "result":
                answer = msg
            elif msg.type == "cancelled":
                if answer is None:
                    self._clock = max(self._clock, msg.t)
                    self._known_until = max(self._known_until, msg["now"])
                    self._lease = msg["lease"]
                return answer

    def test(self, handle: int, t_now_ns: int) -> int | None:
        """t_done if this rank's part of `handle` was done by `t_now_ns`, else None (see the module doc)."""
        if handle not in self._handles:
            raise BridgeError(f"rank {self.rank}: test on unknown handle {handle}")
        self._enter(t_now_ns, "test")
        self._clock = max(self._clock, t_now_ns)
        t = self._results.get(handle)
        if t is not None:
            return t if t <= t_now_ns else None
        if not self.exact or t_now_ns < self._known_until:
            return None
        self._send("test", t_now_ns, h=handle)
        msg = self._await("result")
        return msg["t_done"]

    def advance_clock(self, t_ns: int) -> None:
        """The rank's virtual clock reached t_ns (free in exact mode and inside the current window)."""
        if t_ns <= self._clock:
            return
        self._enter(t_ns, "advance_clock")
        self._clock = t_ns

    def step_boundary(self, step: int, t_ns: int) -> None:
        """Step `step` starts at t_ns (the last one ended there): the coordinator applies a scenario's network
        events given at that step (a clock report with the step, non-blocking)."""
        self._enter(t_ns, "step_boundary")
        self._send("clock", t_ns, block=False, step=step)
        self._clock = max(self._clock, t_ns)

    def finish(self, t_ns: int, results: dict[str, Any]) -> None:
        """This rank is done at t_ns; `results` (msgpack-able, string keys) go to the coordinator."""
        self._check(t_ns, "finish")
        try:
            msgpack.unpackb(msgpack.packb(results, use_bin_type=True), strict_map_key=True)
        except Exception as exc:  # noqa: BLE001 - any error of the encoder is the user's bad results
            raise BridgeError(f"rank {self.rank}: results must be msgpack-able with string keys ({exc})") from None
        self._poll()
        self._send("finish", t_ns, results=results, cpu_s=time.process_time() - self._cpu0)
        self._await("ack")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close(linger=200)
            self._ctx.term()

    def __enter__(self) -> RankClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
