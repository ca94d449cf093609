"""`partition=N` beside the fluid NVLink side (issue 38, item 3): partition workers stepped in rounds by a driver.

The whole-DAG path (`phantora.netsim.partitioned`) hands the workers one DAG and waits for its end. Under
``nvlink=fluid`` the fluid NVLink side stays here, in the driver, and hands the packet side flows as NVLink flows
end, so the workers must stop where it may hand one over. This engine is the decomposition driver
(`phantora.netsim.decompose.DecomposedSimulator`: completion bounds, rounds to a horizon, completions handed out
one ns at a time, the fluid side's `reacts_to` and `run_ahead`) over one logical worker: the N partition workers
together (the pool, `bridge.cut_stepper`). Every round goes to every worker; each adds every posted flow (keeping
the ends it owns, so every worker takes one engine's caller counts), and they run their cut-cable windows together
(`phantora.netsim.cut_windows`) to the round's horizon, then reply with their completions and bounds.

With no NIC latency a flow the fluid side releases at ns E starts at E, after every event of E ran, as one engine
runs it (`Ns3Simulator.advance_to_completion` stops after the whole ns, then the hybrid submits): so a round runs
every event up to and including the horizon E, not E - 1. Dependencies between fabric flows stay in ns-3 (the
workers release them across cut cables, keyed as one engine's starts). Each fabric flow's completion bound is its
post ns + delay + the least propagation of its candidate routes + its bytes at the largest of their bottlenecks.

With ``reuse=on`` a `ProfileReuseSimulator` sits between the fluid side and this engine (`factory.partitioned`):
the driver sees every submission, so it keys and serves episodes as on one engine, and the workers, each the plain
keyed engine, run only what reuse leaves live. An episode ends when the whole network is quiet (`quiet`: every
worker, after its last round, with none past now); reuse's own runs (opening, materialising) go to its time and no
further (`catch_up`); its records come from the merged ones (`new_records`). With a NIC latency too, the stack is
one engine's (`factory.packet_side`): `NicLatencySimulator` over reuse over this engine, so reuse keys the flows as
one engine's reuse gets them (without deps, the ns before their first packet) and its own runs stop there as well.

Asynchronous rounds: with the fluid side directly above (no reuse, no NIC latency), it runs ahead while the workers
run a round (`meanwhile`: the hybrid's `run_ahead`, as over decomposition workers), through its events before the
earliest completion of a fabric flow it reacts to (`_least_reacting_end`); the flows it hands over then are posted at
or after the round's horizon (its floor), so they wait here for the next round as any other.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.decompose import DecomposedSimulator
from phantora.netsim.effective import EffectiveSettings
from phantora.netsim.hybrid import SHARED_DEPS_MIN
from phantora.netsim.observe import FabricRecords
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.packet_summary import channel_usage
from phantora.topology.model import Topology

if TYPE_CHECKING:
    import numpy as np

INF_BPS = 1 << 62


class PairBounds:
    """A fabric flow's route summarised for its completion bound, per endpoint pair: (0, the least propagation ns
    over its equal-cost routes, the largest bottleneck bps among them), whatever route its ECMP key picks."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._pair: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._memo: dict[int, dict[int, tuple[int, int]]] = {}  # dst -> node -> (least ns, largest bps)

    def of(self, f: Flow) -> tuple[int, int, int]:
        got = self._pair.get((f.src, f.dst))
        if got is None:
            lat, bw = self._walk(f.src, f.dst)
            got = self._pair[(f.src, f.dst)] = (0, lat, bw)
        return got

    def summary(self, src: int, dst: int) -> tuple[int, int, int] | None:
        """The pair's bound once `of` made it (every flow of a pair has the same one; `PieceRoutes.summary`)."""
        return self._pair.get((src, dst))

    def _walk(self, src: int, dst: int) -> tuple[int, int]:
        topo = self.topo
        memo = self._memo.setdefault(dst, {dst: (0, INF_BPS)})
        stack = [src]
        while stack:
            node = stack[-1]
            if node in memo:
                stack.pop()
                continue
            hops = topo.next_hops(node, dst)
            if not hops:
                raise InputError(f"no route from {topo.nodes[src].name} to {topo.nodes[dst].name}", field="flows")
            todo = [v for v, _ in hops if v not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            lat = min(topo.channel_latency(ch) + memo[v][0] for v, ch in hops)
            bw = max(min(topo.channel_bandwidth(ch), memo[v][1]) for v, ch in hops)
            memo[node] = (lat, bw)
        return memo[src]


class SteppedPartition(DecomposedSimulator):
    """The packet side on `config.partition` workers, stepped in rounds (a `CompletionStepper` for the hybrid)."""

    posts_at_dep_ends = False  # as one Ns3Simulator: the hybrid holds a flow whose deps it holds (caller-keyed)
    hands_over = False  # its flows wait here until the workers are at their ns (`_round`), never posted early
    # A wide deps list's flows keep the bound they had at submit: the rounds stop at the fluid side's reactions
    # (`_horizon`), not at this driver's bounds, so raising each of them at every dep's new bound bought nothing
    raises_wide = False
    pulls_bounds = False  # its horizon and reactions read `_lb` itself: bounds pushed down as they rise
    opens_outer = False  # its horizon reads its own books: a flow behind the fluid side's gates is held by the hybrid

    def _check_config(self, config: PacketConfig) -> None:
        if config.partition < 1:
            raise InputError("stepped partition workers need partition >= 1", field="partition")
        if config.workers:
            raise InputError(
                f"partition={config.partition} with nvlink=fluid: workers is not combined with it yet (the "
                "workers run the plain keyed packet engine; one engine runs it: partition=0)",
                field="workers",
            )

    def _layout(self) -> tuple[Any, list[int], int]:
        # With a NIC latency, `NicLatencySimulator` sits above this engine, as above one engine's ns-3
        # (`factory.partitioned`): each flow comes here without deps the ns before its first packet, so the workers
        # start a flow at its submit ns as with none (rounds to E, bounds without L)
        self.latency, self._ahead = 0, 1
        self.pieces = [0]
        # set by the caller: the least ns between a flow's completion and a flow it may hand over because of it
        # (INF_NS: none; the fluid NVLink side's `reaction_ns`)
        self.reaction: Callable[[int], int] | None = None
        self._ahead_of: Any = None  # the fluid side that runs ahead during rounds (`follow`), for `stats`
        self._pending: list[tuple[int, int, list[Flow]]] = []  # heap of (post ns, order, flows with all deps)
        self._pending_ids: set[int] = set()  # their ids (the workers do not know them yet)
        self._posts = 0
        self._submitted = 0  # fabric flows posted: one engine's count (each worker counts those it has an end of)
        self._seen = (0, 0, 0, 0, 0)  # merged records handed out by `new_records` (pfc, queues, drops, cnps, marks)
        self._finishing = False  # this round is a drain's to the last completion (`_horizon`)
        return PairBounds(self.topology), [0], 1

    def follow(self, hybrid: Any, nic: Any = None) -> None:
        """Take the fluid NVLink side's reactions (`reacts`, `reaction`, `floor`), directly above this engine or
        through `nic`, a `NicLatencySimulator`: it hands a flow over L - 1 ns after its post (the ns before its first
        packet), and a completion that releases a flow held there is one the workers stop at (its waiter posted at
        the completion + its delay, at least: so L - 1 ns later at the earliest), as is the next flow it holds to
        hand over."""
        if nic is None:
            self.reacts, self.reaction, self.floor = hybrid.reacts_to, hybrid.reaction_ns, hybrid.submit_floor
            if getattr(hybrid, "packet", None) is self:  # (no reuse between: its episodes read quiet between rounds)
                self.meanwhile = hybrid.run_ahead  # the fluid side runs ahead while the workers run a round
                self._ahead_of = hybrid
            return
        ahead = nic.latency_ns - 1

        def reacts(fid: int) -> bool:
            return bool(hybrid.reacts_to(fid)) or nic.waits_on(fid)

        def reaction(fid: int) -> int:
            r = hybrid.reaction_ns(fid)
            r = r + ahead if r < INF_NS else INF_NS
            return min(r, ahead) if nic.waits_on(fid) else r

        def floor() -> int:
            f = hybrid.submit_floor()
            return min(f + ahead if f < INF_NS else INF_NS, nic.next_insert())

        self.reacts, self.reaction, self.floor = reacts, reaction, floor

    # ----- posts at one engine's instants -------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """The decomposition driver's bookkeeping (bounds, owners), then the flows wait here until the workers
        are at `at`: one engine adds them with its clock at `at` (the caller's order key), every event up to
        `at` run, and with every dependency not completed by then (`_round`)."""
        out = self._out[0]
        n0 = len(out.flows)
        if at > self._now and self.config.nic_latency:  # `NicLatencySimulator` inserting flows at now, sent at `at`
            flows, at = self._sent_later(flows, at), self._now
        super().submit(flows, at)
        if out.gated or out.gates or len(out.flows) - n0 != len(flows):
            raise InputError("partition workers with nvlink=fluid: a marker reached the packet side", field="flows")
        batch = [f for f, _ in out.flows[n0:]]
        del out.flows[n0:], out.at[n0:]
        if batch:
            heapq.heappush(self._pending, (at, self._posts, batch))
            self._pending_ids.update(f.id for f in batch)
            self._posts += 1
            self._submitted += len(batch)

    def _sent_later(self, flows: Sequence[Flow], at: int) -> list[Flow]:
        """Flows (without deps) that one engine's ns-3 gets now, starting at `at`, posted now with the rest as their
        delay: each worker adds them at now, so their starts take one engine's key (scheduled by the caller now)."""
        if any(f.deps for f in flows):
            raise InputError("partition workers with nic_latency: a flow with deps handed over ahead", field="flows")
        extra = at - self._now
        return [f.with_deps((), f.delay_ns + extra) for f in flows]

    def _round(self, horizon: int) -> None:
        """Post the flows due by `horizon`, each batch once every worker ran to its ns (a round to it first,
        if they are behind: it also gathers every completion up to it), with the deps still pending then. A
        round stopped early by a completion the caller reacts to (`_round_to`) returns: that completion goes out
        first, and the caller may post before the next batch."""
        while self._pending and self._pending[0][0] <= horizon:
            at = self._pending[0][0]
            if at > self._wtime:
                self._round_to(at)
                if self._wtime < at:
                    return
            _, _, batch = heapq.heappop(self._pending)
            self._pending_ids.difference_update(f.id for f in batch)
            ends, out = self._ends, self._out[0]
            wide: dict[tuple[int, ...], list[int]] = {}  # a wide deps list's pending deps, read once a batch
            for f in batch:
                if len(f.deps) >= SHARED_DEPS_MIN:
                    left = wide.get(f.deps)
                    if left is None:
                        left = wide[f.deps] = [d for d in f.deps if ends.get(d, INF_NS) > at]
                else:
                    left = [d for d in f.deps if ends.get(d, INF_NS) > at]
                out.flows.append((f, left))
                out.at.append(at)
        self._round_to(horizon)

    def _round_to(self, horizon: int) -> None:
        """One round to `horizon`, stopped by the workers at the first completion the caller reacts to plus its
        reaction (`reaction`; the workers bound every window by those flows' bounds, `cut_windows.run_windows`):
        then every completion up to that ns is gathered and the workers are there."""
        pool: Any = self._pool  # (a `bridge.cut_stepped_pool.SteppedPool`)
        pool.reacting = self._reacting()
        pool.finishing = self._finishing
        try:
            super()._round(horizon)
        finally:
            pool.finishing = False
        if pool.stopped is not None:
            self._wtime = min(self._wtime, pool.stopped)

    def _bounds(self, flat: list[int]) -> None:
        """The workers' completion bounds that rose: with the fluid side's reactions set, each flow's own (the
        horizon reads no other); without (`catch_up`), carried down its dependents too, as decomposition does."""
        if self.reaction is None:
            super()._bounds(flat)
            return
        lbs = self._lb
        for fid, ns in zip(flat[0::2], flat[1::2], strict=True):
            if ns > lbs.get(fid, INF_NS):
                lbs[fid] = ns

    def _reacting(self) -> list[int] | None:
        """The unfinished flows the workers know that the caller reacts to, flat [id, least reaction ns, ...]
        (None: the caller said no `reaction`; each round then runs to its horizon, which counts them)."""
        reaction = self.reaction
        if reaction is None:
            return None
        t0 = time.perf_counter()
        flat: list[int] = []
        pending = self._pending_ids
        for f in sorted(self._unfinished[0]):
            if f not in pending and (d := reaction(f)) < INF_NS:
                flat += (f, d)
        self.bound_wall_s += time.perf_counter() - t0
        return flat

    def _horizon(self, until: int) -> int:
        """How far every worker may run, inclusive: the decomposition driver's E (`until`, the caller's floor),
        with the flows the caller reacts to left to the workers (`_round_to`: they stop at the first one's completion
        plus the caller's least reaction time to it), so a flow's tail past its bound costs no round."""
        reaction = self.reaction
        self._finishing = False
        if reaction is None:
            return super()._horizon(until)
        t0 = time.perf_counter()
        e = until if self.floor is None else max(until, self.floor())
        r = self._least_reacting_end()
        for t, fid in self._buffer.pairs():
            d = reaction(fid)
            if d < INF_NS:
                r = min(r, t)
                if t > self._wtime:
                    e = min(e, t + d)
        self._react_ns = r
        if e >= INF_NS:
            e = self._last_end()
            # a drain (every flow posted): one engine stops right after the completion that leaves no flow in flight
            # (its run calls since 45877240), before that ns's later ACKs: so do the workers (`cut_windows`' finish)
            self._finishing = until >= INF_NS and not self._pending
        self.bound_wall_s += time.perf_counter() - t0
        return e

    def _least_reacting_end(self) -> int:
        """The earliest ns an unfinished flow the caller reacts to can complete (INF_NS: none), for `meanwhile`
        (the fluid side's `run_ahead` runs its events before it while the workers run a round): the least bound
        of those flows, and no earlier than the workers' clock + 1 (every completion up to it is gathered), nor
        than their next event when every flow they know of is posted."""
        react = self.reacts
        if react is None or self.meanwhile is None:
            return INF_NS
        lbs = self._lb
        m = min((lbs[f] for f in self._unfinished[0] if react(f)), default=INF_NS)
        if m >= INF_NS:
            return INF_NS
        nxt = self._next[0]
        posted = self._out[0].empty() and not self._pending
        return max(m, self._wtime + 1 if nxt is None or not posted else max(self._wtime + 1, nxt))

    def _last_end(self) -> int:
        """With no limit (the caller submits nothing more but after a completion it reacts to): the least ns the
        last unfinished flow can complete at, the greatest of their bounds (at least the workers' next event and
        one ns past their clock), which the run's last completion is at or after. One engine's drain stops at that
        completion's ns, so the workers must not run past it: their trailing ACKs, PFC frames and samples after it
        would be in links.csv's counters and the records but not in one engine's (each round to this, the bounds
        rise). INF_NS when nothing is left to run (the round then finds what waits for ever). The workers' own
        bound on their last completion (`last_end`: each sender's bytes still to send at its line rate) is far
        above any one flow's while a NIC sends many flows at once (an all-to-all), so the rounds do not creep up
        to the end a flow's bound at a time."""
        nxt = self._next[0]
        if nxt is None and self._out[0].empty() and not self._pending:
            return INF_NS
        floor = self._wtime + 1 if nxt is None else max(self._wtime + 1, nxt)
        lbs = self._lb
        sends = getattr(self._pool, "last_end", None)  # as of the last round: flows since only come on top
        return max(floor, max((lbs[f] for f in self._unfinished[0]), default=floor), sends or floor)

    def _earliest(self) -> int | None:
        got = super()._earliest()
        if self._pending:
            return self._pending[0][0] if got is None else min(got, self._pending[0][0])
        return got

    def in_flight(self) -> int:
        return super().in_flight() + sum(len(b) for _, _, b in self._pending)

    # ----- what profile reuse reads (`phantora.netsim.reuse.QuietStepper`): the whole network's quiet ------------
    def quiet(self) -> bool:
        """Nothing in flight here or in any worker, every worker quiet after its last round (no ACK, PFC frame or
        live timer left; the cut cables' messages were delivered at its last barrier), and no worker past now():
        a worker that ran ahead may have run events after now, so quiet at now is not known and not claimed (an
        episode then ends at a later call, never earlier than on one engine)."""
        if self._rounding:  # (a round's flows are with the workers, not counted in flight until their replies)
            return False
        return self.in_flight() == 0 and self._pool.quiet and max(self._wnow) <= self._now  # type: ignore[attr-defined]

    def new_records(self) -> FabricRecords:
        """The merged records (PFC, queue samples, drops, CNPs, CE marks) since the last call, in one keyed
        engine's order: reuse asks at an episode's end, with every worker quiet at now(), so later records come
        after these in the merged lists."""
        res = self._merged()
        lists = (res.pfc, res.queues, res.drops, res.cnps, res.marks)
        seen, self._seen = self._seen, (len(res.pfc), len(res.queues), len(res.drops), len(res.cnps), len(res.marks))
        return FabricRecords(*(list(rows[n:]) for rows, n in zip(lists, seen, strict=True)))

    def catch_up(self, until: int) -> list[Completion]:
        """`advance(until)` for profile reuse's own runs (opening an episode, materialising one), made while the fluid
        side is mid-release: its floor and reactions are stale then, so the workers run to `until` and no further
        (a flow submitted at `until` right after must find them there)."""
        floor, reaction = self.floor, self.reaction
        self.floor = self.reaction = None
        try:
            return self.advance(until)
        finally:
            self.floor, self.reaction = floor, reaction

    def completion_bounds(self) -> dict[int, int]:
        """None to report: the driver holds its flows' bounds itself (a decomposition worker's engine reports them)."""
        return {}

    def completion_bound_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """`completion_bounds` as int64 columns (ids, ns): none."""
        import numpy as np

        return np.empty(0, np.int64), np.empty(0, np.int64)

    # ----- records: the workers' merged as one keyed engine's (bridge.cut_pool) --------------------------------
    def _merged(self) -> Any:
        return self._pool.merged(self._now)  # type: ignore[attr-defined]

    def _gather(self, elapsed: int | None = None) -> dict[str, list[Any]]:
        res = self._merged()
        at = self._now if elapsed is None else elapsed
        return {
            "usage": channel_usage(res.channels, max(1, at)),
            "pfc": list(res.pfc),
            "queues": list(res.queues),
            "drops": list(res.drops),
            "trims": list(res.trims),
            "cnps": list(res.cnps),
            "marks": list(res.marks),
            "transport": list(res.transport.values()),
            "effective": list(res.effective),
        }

    def effective(self) -> EffectiveSettings:
        return EffectiveSettings.parse(self.config, self._merged().effective)

    def stats(self) -> dict[str, object]:
        """The workers' counters merged as one engine's, and `partition`: the workers' windows and the rounds."""
        from phantora.netsim.partitioned import partition_summary

        res = self._merged()
        out: dict[str, object] = dict(res.stats)
        out["flows_submitted"] = self._submitted  # the workers' sum counts a cross-group flow twice
        out["decompose"] = self.config.decompose_settings()  # (the workers run without the NIC latency: it is here)
        out["partition"] = {
            **partition_summary(res.workers, res.ties),
            "stepped": True,
            "curve": all(bool(w.get("curve")) for w in res.workers),  # the windows between the workers: CurveZMQ
            "lookahead_ns": res.workers[0]["cut"][1] if res.workers else 0,  # the least cut cable's delay
            "rounds": self.rounds,
            "critical_cpu_s": round(self.critical_cpu_s, 6),  # per round the busiest worker's CPU, summed
            "round_wall_s": round(self.round_wall_s, 6),
            "meanwhile_cpu_s": round(self.meanwhile_cpu_s, 6),  # the fluid side's work while the workers ran
            "overlap_cpu_s": round(self.overlap_cpu_s, 6),  # per round max(busiest worker, meanwhile), summed
            "ahead_steps": getattr(self._ahead_of, "ahead_steps", 0),  # the fluid side's event times run meanwhile
            "between_wall_s": round(self.between_wall_s, 6),
            "driver_cpu_s": round(time.process_time(), 3),  # this process's so far (imports, planning included)
            # each worker's process CPU so far: Python's imports before its setup (setup_cpu_s: ns-3, the fabric,
            # the first calls; run_cpu_s: the rounds), the records it sent, and in all
            "worker_cpu_s": {
                part: [round(w["process_cpu"][key], 3) for w in res.workers]
                for part, key in (("import", "import_s"), ("records", "records_s"), ("total", "total_s"))
            },
        }
        out["approximations"] = self.config.approximations()
        return out

    def run_by(self) -> str:
        return f"{self.config.partition} partition workers, stepped"
