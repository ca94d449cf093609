"""`ProcShardedFluid`: the fluid NVLink side split by host (`ShardedFluid`) with each shard's flow engine in a process
of its own (`fluid_procs=on`, issue 38, item 3), so that its CPU is off the driver's.

The driver keeps what `ShardedFluid` keeps (which shard holds each flow, the flows held across shards, the done set)
and sends each shard what the bench's `wire` measure sent it: a batch with each flow's deps filtered to those the
shard must wait on, the deps that ended elsewhere, and a run to a ns, which answers with its completions as
(id, start, end). A batch or an arrival is not waited for: the next request that needs an answer (a shard's next
event, a run) reads the answers in order, so every shard works on its requests while the driver places more. Each
answer carries the CPU the shard spent on its request; per exchange (a batch or an arrival to the shards, or a run)
the busiest shard's is summed (`critical_cpu_s`), as `ShardedFluid` sums its in-process timing. The same completions
as `ShardedFluid` and one engine: each shard is the same flow engine given the same flows (`tests/test_fluid_procs.py`).

The processes are `python -m phantora.netsim.fluid_proc_server` over a Unix socket pair each (the topology as
`topology_to_dict` once, sent to each); an answer not read within `timeout_s` is an error naming the shard. With
`links`, no process is started: shard i is served by a thread of decomposition worker i's process
(`fluid_proc_server.serve_in_thread`), reached by `links[i]` once an answer is first needed (its requests wait until
then, so the driver's first submit runs while the workers start): the fluid side on the workers' cores, which it
shares with their packet side.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phantora.errors import PhantoraError
from phantora.netsim.base import Completion, Flow, completion
from phantora.netsim.fluid_proc_wire import (
    ADVANCE,
    ARRIVE,
    CLOSE,
    INIT,
    REPORT,
    SET,
    SETTABLE,
    SUBMIT,
    frame,
    recv_reply,
    send_frame,
)
from phantora.netsim.fluid_shards import ShardedFluid
from phantora.netsim.observe import ChannelUsage
from phantora.topology.wire import topology_to_dict

if TYPE_CHECKING:
    from phantora.netsim.flow import FlowSimulator
    from phantora.topology.model import Topology

TIMEOUT_S = 600.0  # the longest a driver waits for one answer of a shard


class ShardProc:
    """The driver's end of one shard's process: requests sent in order, answers read in order."""

    _sock: socket.socket  # (with a `link`, set once connected)

    def __init__(
        self,
        index: int,
        blob: dict[str, Any],
        settings: dict[str, Any],
        local: FlowSimulator,
        owner: ProcShardedFluid,
        link: Callable[[], socket.socket] | None = None,
    ) -> None:
        """`blob`: the topology (`topology_to_dict`); `settings`: the flow engine's keywords; `local`: an engine in
        the driver for routes and the engines' constants; `owner`: takes each answer's CPU (`_note`); `link`: the
        shard is served elsewhere (a worker's thread), connected by calling it when an answer is first needed."""
        self.index = index
        self._owner = owner
        self._local = local
        self.payload_efficiency = local.payload_efficiency
        self.incremental = local.incremental
        self.lb = local.lb
        self._multi = local._multi
        self._set: dict[str, object] = {"prechecked": False, "carries": True, "cap_slack": False, "stretch": None}
        self._pending: deque[int] = deque()  # the exchange of each request whose answer is not read yet
        self._next: int | None = None
        self._now = 0
        self._link = link
        self._queued: list[bytes] | None = None  # (`link`) frames not sent yet: the shard is not connected
        self._proc: subprocess.Popen[bytes] | None = None
        if link is not None:
            self._queued = [frame([INIT, blob, settings])]
            return
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "phantora.netsim.fluid_proc_server", str(theirs.fileno()), str(os.getpid())],
            pass_fds=(theirs.fileno(),),
            env=env,
        )
        theirs.close()
        ours.settimeout(owner.timeout_s)
        self._sock = ours
        self._send([INIT, blob, settings])

    # ----- the settings the hybrid sets on its fluid engine (`_OnEveryShard`) --------------------
    def __getattr__(self, name: str) -> object:
        if name in ("prechecked", "carries", "cap_slack", "stretch"):
            return self.__dict__["_set"][name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "stretch":
            if value is not None:
                raise PhantoraError(
                    "fluid_procs=on: a stretch of the fluid side's flows (a gpu_slow scenario) is not sent to the "
                    "shards' processes; run without fluid_procs"
                )
        elif name in SETTABLE:
            self._set[name] = value
            self._send([SET, name, value])
            return
        object.__setattr__(self, name, value)

    # ----- requests --------------------------------------------------------------------------------
    def _send(self, msg: list[Any]) -> int:
        if self._queued is not None:
            data = frame(msg)
            self._queued.append(data)
            return len(data)
        try:
            return send_frame(self._sock, msg)
        except OSError as exc:
            raise self._gone(f"could not be sent a request ({exc})") from None

    def _connected(self) -> None:
        """(`link`) Connect to the shard and send what waited."""
        if self._queued is None:
            return
        assert self._link is not None
        sock = self._link()
        sock.settimeout(self._owner.timeout_s)
        self._sock = sock
        queued, self._queued = self._queued, None
        try:
            sock.sendall(b"".join(queued))
        except OSError as exc:
            raise self._gone(f"could not be sent a request ({exc})") from None

    def request(self, msg: list[Any], exchange: int) -> int:
        """Send a request answered later (`answer`); its bytes."""
        self._pending.append(exchange)
        return self._send(msg)

    def answer(self) -> list[Any]:
        """Read answers in order up to the last request's; its body."""
        body: list[Any] = []
        if self._pending:
            self._connected()
        while self._pending:
            x = self._pending.popleft()
            try:
                cpu, body, n = recv_reply(self._sock)
            except TimeoutError:
                raise self._gone(f"did not answer within {self._owner.timeout_s:g} s") from None
            except (EOFError, OSError):
                raise self._gone("ended before it answered") from None
            self._next = body[0]
            self._owner._note(self.index, x, cpu, n)
        return body

    def _gone(self, what: str) -> PhantoraError:
        if self._proc is None:
            return PhantoraError(f"fluid shard {self.index} (served by decomposition worker {self.index}) {what}")
        code = self._proc.poll()
        how = "" if code is None else f" (its process exited with code {code})"
        return PhantoraError(f"fluid shard {self.index} (pid {self._proc.pid}) {what}{how}")

    # ----- the flow engine's interface, as `ShardedFluid` calls it -----------------------------------
    def next_event_time(self) -> int | None:
        self.answer()
        return self._next

    def now(self) -> int:
        return self._now

    def route(self, f: Flow) -> tuple[tuple[int, ...], int]:
        return self._local.route(f)

    def report(self, what: str, arg: object = None) -> Any:
        """A report of the shard's engine (`fluid_proc_server._report`); its CPU is no exchange's."""
        self.request([REPORT, what, arg], -1)
        return self.answer()[1]

    def stats(self) -> dict[str, object]:
        got: dict[str, object] = self.report("stats")
        return got

    def close(self) -> None:
        """Ask the process to end; wait for it (killed past the timeout). A worker's shard: told to end, if
        connected (its thread ends with the worker's process anyway)."""
        if self._proc is None:
            if self._queued is None:
                try:
                    self.answer()
                    send_frame(self._sock, [CLOSE])
                except (OSError, PhantoraError):
                    pass  # (the worker has ended: so has its thread)
                self._sock.close()
            return
        if self._proc.poll() is None:
            try:
                self.answer()
                send_frame(self._sock, [CLOSE])
                self._proc.wait(timeout=self._owner.timeout_s)
            except (OSError, PhantoraError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._sock.close()


class ProcShardedFluid(ShardedFluid):
    """`ShardedFluid` with every shard in a process of its own (see the module)."""

    def __init__(
        self,
        topology: Topology,
        shards: int,
        make: Callable[[], FlowSimulator],
        timeout_s: float = TIMEOUT_S,
        links: Sequence[Callable[[], socket.socket]] | None = None,
    ) -> None:
        """`make`: a fresh flow engine as the one-engine fluid side would be: one stays here for routes, each shard's
        process makes one with its settings. `links`: one a shard, each connecting to a shard served elsewhere (a
        decomposition worker's thread) rather than a process started here."""
        if links is not None and len(links) != shards:
            raise ValueError(f"{shards} fluid shards need as many links, got {len(links)}")
        if shards < 1:
            raise ValueError(f"fluid shards must be >= 1, got {shards}")
        self.timeout_s = timeout_s
        self._worst: dict[int, float] = {}  # exchange -> the busiest shard's CPU in it, so far
        self._exchanges = 0
        local = make()
        if local.stretch is not None:
            raise PhantoraError("fluid_procs=on: the fluid engine has a stretch (gpu_slow), not sent to the shards")
        settings = {
            "payload_efficiency": local.payload_efficiency,
            "incremental": local.incremental,
            "verify": local.verify,
            "lb": local.lb,
        }
        blob = topology_to_dict(topology)  # (after `make`: its ECMP policy set, which the dict carries)
        procs = iter(
            [ShardProc(i, blob, settings, local, self, None if links is None else links[i]) for i in range(shards)]
        )
        super().__init__(topology, shards, lambda: next(procs))  # type: ignore[arg-type, return-value]
        self.wire = True  # (every batch and completion crosses a socket)

    @property
    def procs(self) -> list[ShardProc]:
        return self.shards  # type: ignore[return-value]

    def _exchange(self) -> int:
        self._exchanges += 1
        return self._exchanges

    def _note(self, shard: int, exchange: int, cpu: float, nbytes: int) -> None:
        """An answer's CPU: the shard's, and the exchange's busiest so far (`critical_cpu_s` their sum); its bytes
        (`wire_bytes`). A report's (exchange -1) is none of them."""
        if exchange < 0:
            return
        self.wire_bytes += nbytes
        self.shard_cpu_s[shard] += cpu
        worst = self._worst.get(exchange, 0.0)
        if cpu > worst:
            self.critical_cpu_s += cpu - worst
            self._worst[exchange] = cpu

    # ----- `ShardedFluid`'s calls into its shards, as requests ----------------------------------------
    def in_flight(self) -> int:
        return len(self._where) + len(self._held)

    def arrive_by_shard(self, arrived: dict[int, list[int]], t: int) -> None:
        self._fresh = False
        x = self._exchange()
        for s, ids in arrived.items():
            self.wire_bytes += self.procs[s].request([ARRIVE, t, ids], x)
        self.exchanges += 1

    def _to_shards(self, per: dict[int, list[Flow]], at: int, routed: bool = False) -> None:
        if not per:
            return
        self._fresh = False
        x = self._exchange()
        for s, group in per.items():
            self.wire_bytes += self.procs[s].request([SUBMIT, at, self._rows(group, s, routed)], x)
        self.exchanges += 1

    def _run(self, until: int, at: int | None) -> list[Completion]:
        """Every shard with an event at or before `until` (`at`: exactly at) asked to run to it, then their answers
        read in shard order."""
        self._fresh = False
        x = self._exchange()
        ran = []
        for p in self.procs:
            t = p.next_event_time()
            if t is None or t > until or (at is not None and t != at):
                continue
            self.wire_bytes += p.request([ADVANCE, until], x)
            ran.append(p)
        got: list[Completion] = []
        where, sent, done = self._where, self._sent, self._done
        for p in ran:
            p._now = until
            rows = p.answer()[1]
            for fid, start, end in rows:
                f = sent.pop(fid)
                del where[fid]
                got.append(completion(fid, start, end, f.size, f.src, f.dst, f.tag))
            done.update([r[0] for r in rows])  # (the shards share no done set with the hybrid: `_ended` is this one)
        self.exchanges += 1
        return got

    # ----- reports -------------------------------------------------------------------------------------
    def _synced(self) -> None:
        for p in self.procs:
            if p.now() < self._now:
                p.report("sync", self._now)
                p._now = self._now

    def channel_bytes(self) -> list[int]:
        return [sum(col) for col in zip(*(p.report("channel_bytes") for p in self.procs), strict=True)]

    def channel_busy_ns(self) -> list[int]:
        self._synced()
        return [sum(col) for col in zip(*(p.report("channel_busy_ns") for p in self.procs), strict=True)]

    def channel_usage(self, elapsed_ns: int | None = None) -> list[ChannelUsage]:
        self._synced()
        elapsed = self._now if elapsed_ns is None else elapsed_ns
        rows = [ChannelUsage(*r) for p in self.procs for r in p.report("channel_usage", elapsed)]
        return sorted(rows, key=lambda r: r.channel)

    def rates(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for p in self.procs:
            out.update(p.report("rates"))
        return out

    def stats(self) -> dict[str, object]:
        out = super().stats()
        split = out["fluid_shards"]
        assert isinstance(split, dict)
        split["procs"] = True
        return out

    def close(self) -> None:
        for p in self.procs:
            p.close()
