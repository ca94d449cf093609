"""`FluidNvlinkSimulator`: the fabric packet by packet (ns-3), NVLink and zero-byte markers as fluid flows.

Inside a host, GPUs talk through an NVSwitch: a non-blocking crossbar with no PFC, no ECN and no
congestion control in the packet model (`PfcSwitch` with ``NvSwitch`` set), so packets there only
share each GPU's NVLink port round robin. Their max-min fluid limit is what the flow engine computes,
with the channel capacity scaled by payload / (payload + header) as the packets carry it. On an LLM
step most bytes are NVLink bytes (87 % for Llama-3-8B FSDP on rail128), so simulating them as fluid
removes most packet events.

Two engines, one interface. Every flow goes to the fluid engine when it stays inside one NVSwitch (or
moves no bytes: a marker), else to ns-3. A dependency between the two sides is kept here: the
dependent flow is held and handed to its engine, at the time its last dependency arrived, once they
all have. To do that exactly both engines run in step: ns-3 runs to the fluid engine's next event
time and stops at any completion (`Ns3Simulator.advance_to_completion`), then the fluid engine
catches up to the same ns, and the flows their completions release are submitted at that ns.

What this changes against the full packet model: NVLink traffic is max-min fair instead of
packet-interleaved (no per-packet store and forward on its two hops: under 1 ns at 3.6 Tb/s), and
same-ns events may be ordered differently. docs/packet-model.md measures the effect on step times
and FCTs. Opt in with ``--set nvlink=fluid``; `stats()["approximations"]` says it was used.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

from phantora.errors import PhantoraError
from phantora.netsim.base import INF_NS, Completion, Flow, NetworkSimulator, Observed, check_flow_batch
from phantora.netsim.flow import CausalityError, FlowSimulator
from phantora.netsim.held import Held, Waiters, add_to, one_nearer
from phantora.netsim.idset import IdSet
from phantora.netsim.nic_latency import JOIN_BASE, OUTER_BASE, gate_key, outer_key
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FabricObserver,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
    Trim,
)

if TYPE_CHECKING:
    from phantora.netsim.effective import EffectiveSettings
    from phantora.topology.model import Topology

PACKET, FLUID = 0, 1
JOIN = 2  # the side of a join in `_held`: the flows sharing a wide deps list wait on it (`_join`), it on the list
# The side of a packet flow's outer gate in `_held` (key `outer_key(id)`): the flow is on the packet side already
# (`outer_gates`), waiting there on this entry's deps too, which open its gate when they have all arrived
OUTER = 3
REACTION_DEPTH = 8  # held flows `reaction_ns` looks through below a completion (markers of no delay)
SHARED_DEPS_MIN = 16  # a flow with this many deps or more has them read once per batch (`_kept_deps`)


class WideDeps:
    """Wide deps lists (`SHARED_DEPS_MIN` or more) read once a batch or call, by (list, side): an equal list is read
    as the first one met, and the last one met is compared first, at C speed, never hashed (an all-to-all's
    dependents each carry an equal list of every flow of the one before)."""

    __slots__ = ("_canon", "_last", "values")

    def __init__(self) -> None:
        self._canon: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._last: tuple[int, ...] = ()
        self.values: dict[tuple[int, int], tuple[int, ...]] = {}  # what the caller read of (the list's id, side)

    def key(self, deps: tuple[int, ...], side: int) -> tuple[tuple[int, ...], tuple[int, int]]:
        """The list as first met (equal to `deps`) and its key in `values` with `side`."""
        last = self._last
        if deps is not last and deps != last:
            last = self._last = self._canon.setdefault(deps, deps)
        return last, (id(last), side)


def flow_side(f: Flow, nvswitch: Callable[[int, int], object]) -> int:
    """FLUID for a marker (no bytes, or to itself) or a flow through one NVSwitch (`nvswitch(src, dst)`: the
    topology's `shared_nvswitch`, not None, and its key not routed through the NICs); PACKET otherwise."""
    if f.size == 0 or f.src == f.dst or (not f.via_nic and nvswitch(f.src, f.dst) is not None):
        return FLUID
    return PACKET


class CompletionStepper(NetworkSimulator, Protocol):
    """An engine that can run to its next completion: `Ns3Simulator` (and `FlowSimulator`, for tests), and what it
    declares about the flows it is handed."""

    topology: Topology
    # True: a flow handed over before its deps end is posted exactly as if handed over at their last end (its
    # start falls among that ns's events alike), so the hybrid hands a packet flow waiting on packet flows to this
    # side with them (`NicLatencySimulator`, `DecomposedSimulator`). False: every such flow is held in the hybrid.
    posts_at_dep_ends: bool

    def advance_to_completion(self, until: int) -> list[Completion]:
        """`advance(until)`, but return right after the first ns at which any flow completes."""
        ...


class FluidNvlinkSimulator:
    """`NetworkSimulator` (and `FabricObserver`) over an ns-3 engine and a fluid engine for NVLink."""

    def __init__(
        self, packet: CompletionStepper, fluid: FlowSimulator, *, payload_bytes: int, header_bytes: int
    ) -> None:
        """`payload_bytes`/`header_bytes`: the packet model's, to show fluid NVLink bytes as packets would."""
        self.packet = packet
        self.fluid = fluid
        fluid.prechecked = True  # every batch it gets is checked here first, whole (`check_flow_batch`, routes)
        # Max-min by host, not carried (`FlowSimulator.carries`): NVLink flows of two hosts share no channel, so the
        # component solve re-solves only the hosts an event touched, where the carried solve re-runs every round at
        # a level the event changed, and hosts running the same collective freeze at the same levels (such a round
        # holds every host's channels). Both give `maxmin_python`'s rates bit for bit.
        fluid.carries = False
        # NCCL's rate caps sit under NVLink's rate: an event whose flows leave their channels slack solves nothing
        # (`FlowSimulator.cap_slack`; not on an engine that moves flows or capacities, nor under multipath)
        fluid.cap_slack = type(fluid).carries and not fluid._multi
        self.prechecked = False  # set by a caller that checks every batch whole before `_place` (a hybrid worker)
        self.topology: Topology = packet.topology
        self._payload = payload_bytes
        self._header = header_bytes
        # Flow id -> engine it went to, while in flight. Once done a flow is a bit in `_ended`, and one in
        # `_done_packet` if it ran on the packet side (whose engine knows it for good; the fluid engine reads a
        # done dep as none): a long live run adds flows for hours. A done dep's end ns is not kept: it is at or
        # before any ns a flow waiting on it is placed at, so it bounds nothing. `_ended` is the fluid engine's own
        # set of done flows, which the fluid engine fills as its flows complete and this adds every other end to: a
        # fluid flow handed over keeps its short deps list whole (its deps on the other side have all ended, so the
        # fluid engine reads them as done), with no copy of the flow made to drop them (`_same_side`).
        self._side: dict[int, int] = {}
        self._ended: IdSet = fluid._done
        self._done_packet = IdSet()
        self._held: Held = {}  # flow id -> (flow, submit time, its side, deps outstanding): `phantora.netsim.held`
        self._waiters: Waiters = {}  # flow id -> held flows waiting on it
        # Held packet flow id -> held packet flows waiting on it, handed to the packet side with it (`_unhold`) when
        # that side posts a flow exactly as if it were handed over at its deps' ends (`posts_at_dep_ends`): a ring's
        # later steps then wait there, not here, and their completions are no hand-offs.
        self._chained: dict[int, list[int]] = {}
        self.chains = packet.posts_at_dep_ends  # off: every such flow is held here
        # A packet flow waiting on flows of the fluid side (or held) goes to the packet side when placed, gated there on
        # them (`DecomposedSimulator.submit_outer`), and its gate is opened at their last arrival (`open_outer`), as it
        # would have been handed over then: a ring behind an NVLink phase is booked by the packet side at the first
        # submit, not when the phase ends (issue 38, item 2). Where the packet side offers it (`opens_outer`) and
        # no flow is `gated` by a caller; off: such a flow is held here.
        self.outer_gates = bool(getattr(packet, "opens_outer", False))
        self._outer = 0  # outer gates held (`OUTER` entries of `_held`: their flows are in the packet side's in_flight)
        self.outer_gated = 0  # packet flows handed over behind an outer gate, in all
        self._next_join = JOIN_BASE  # the next join's id (`_join`), and how many are held
        self._joins = 0
        self._fluid_flows = 0
        self._steps = 0
        self._watch: Collection[int] = ()  # what the caller of advance_watching returns on
        # `_reaction`'s values by (flow id, depth), and a fluid waiter's by (id, -1 - depth): valid while no flow is
        # placed and the watch stays (`_place` and `advance_watching` clear them)
        self._reacted: dict[tuple[int, int], int] = {}
        # moves whenever the flows `reacts_to` names may grow (flows placed, a watch set); a decomposed packet side
        # keeps what it derived from them while it stays (`DecomposedSimulator.react_epoch`)
        self.react_epoch = 0
        self._routable: set[tuple[int, int]] = set()  # endpoint pairs known to have a route
        # Completion bounds of the fluid side's unfinished flows (`submit_floor`): flow id -> the earliest ns it
        # can complete; its delay + least transfer time; the fluid flows waiting on it inside the fluid engine.
        self._flb: dict[int, int] = {}
        self._fstep: dict[int, int] = {}
        self._fdependents: dict[int, list[int]] = {}
        # (src, dst, size) of a fluid flow with bytes -> the least ns it takes on its path: such a flow crosses one
        # NVSwitch, whose pairs have one path (`Topology.one_path`), so the pair names it (no route taken)
        self._took: dict[tuple[int, int, int], int] = {}
        self._releasers: list[tuple[int, int]] = []  # heap (bound, id) of fluid flows held flows wait on (lazy)
        self._until = INF_NS  # the limit of the advance in progress: the caller submits nothing before it
        # Fluid completions run ahead while a decomposed packet side ran a round (`run_ahead`), their releases
        # done, not handed out yet (in time order); and the ns of a watched one among them (nothing runs past it).
        self._ahead: deque[Completion] = deque()
        self._stop: int | None = None
        self.ahead_steps = 0  # fluid event times run ahead
        # Fluid chains (opt-in, `fluid_chains=on`, issue 38): every fluid flow goes to its fluid engine (its shard:
        # `fluid.node_shard`, one a run of hosts) when placed, with its deps; that engine releases it at their ends as
        # this hybrid would, so the fluid side's releases run in its shard, not here (`_chain_deps`). A dep of another
        # shard or of the packet side is external there: its end is told to each shard waiting on it (`_ext`: id ->
        # shards), one message a shard, not a release a flow; `_ext_step`: id -> the least step of a flow waiting on
        # it there (its reaction). No completion bounds are kept for these flows: the submit floor is the fluid
        # side's next event (`submit_floor`).
        self.fluid_chains = False
        self._shard_of: Sequence[int] | None = getattr(fluid, "node_shard", None)
        self._where: Mapping[int, int] = getattr(fluid, "_where", {})
        self._ext: dict[int, list[int]] = {}
        self._ext_step: dict[int, int] = {}
        self.fluid_chained = 0  # (`fluid_chains`) fluid flows placed in their engine waiting on an external dep
        self._dealt = 0  # (`fluid_chains`) markers dealt round robin to the shards of their deps (`_marker_shard`)

    # ----- which side ------------------------------------------------------------------------
    def side_of(self, f: Flow) -> int:
        """The engine `f` goes to on this topology (`flow_side`)."""
        return flow_side(f, self.topology.shared_nvswitch)

    def _engine(self, side: int) -> CompletionStepper | FlowSimulator:
        return self.fluid if side == FLUID else self.packet

    # ----- NetworkSimulator ------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows eligible from `at` (>= now()); deps may cross sides and name flows of this batch."""
        now = self.now()
        if at < now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {now} ns")
        self._place(flows, at, None)

    def _place(
        self, flows: Sequence[Flow], at: int, at_of: Mapping[int, int] | None, gated: Collection[int] = ()
    ) -> None:
        """`submit`'s work: each flow eligible from `at`, or from its own ns in `at_of` (flow id -> ns); a flow in
        `gated` also waits here for its gate (a pseudo dep, `gate_key`, that a decomposition's driver opens)."""
        self._reacted.clear()  # (waiters are added below)
        self.react_epoch += 1
        if not self.prechecked:  # (nothing placed yet, a replay's whole DAG: no id is known, none looked up)
            fresh = not (self._side or self._held or len(self._ended))
            check_flow_batch(flows, self.topology, _known_none if fresh else self._known)
            for f in flows:  # routable (no path walked: the engines walk their own)
                if f.size and f.src != f.dst and (f.src, f.dst) not in self._routable:
                    self.topology.check_route(f.src, f.dst)
                    self._routable.add((f.src, f.dst))
        batch = {f.id: f for f in flows}
        out: tuple[dict[int, list[Flow]], dict[int, list[Flow]]] = ({}, {})  # per side: submit ns -> its flows
        held, sides, waiters, flb = self._held, self._side, self._waiters, self._flb
        ends = _ends_or_none(self._ended)
        nvswitch = self.topology.shared_nvswitch
        chain, chained = self.chains, self._chained
        lists = WideDeps()  # wide deps lists, read once a batch
        same: dict[tuple[int, int], tuple[int, ...] | None] = {}  # what a flow of the side keeps of one (None: held)
        joins: dict[tuple[int, int], int | None] = {}  # the join its flows of the side are held on
        fchains = self.fluid_chains
        # (packet flows waiting on the other side: out now, gated; as chains, only where the packet side posts a flow
        # at its deps' ends however early it got it)
        xgate = self.outer_gates and self.chains and not gated
        if xgate:
            chain = False  # (no packet flow is held here: nothing chains on one)
        outer: list[int] = []  # (`xgate`) the flows handed over behind an outer gate
        outer_kept: dict[tuple[int, int], tuple[int, ...]] = {}  # a wide list's packet deps, by `lists` key
        shard_of = self._shard_of
        chain_lists: dict[tuple[tuple[int, int], int], tuple[tuple[int, ...], list[int]]] = {}
        routed: dict[int, list[Flow]] = {}  # (`fluid_chains`) fluid flows by submit ns, each to its own shard
        pin: dict[int, int] = {}  # (`fluid_chains`) a marker of the batch -> its shard, where not its node's
        placed: dict[int, int] = {}  # (`fluid_chains`) a fluid flow of the batch put in its engine -> its shard
        ext, ext_step, took, where = self._ext, self._ext_step, self._took, self._where
        no_step = fchains and (self.fluid.stretch is not None or self.fluid._multi)  # (`_fluid_step` is 0 then)
        n_chained = 0
        last_at, last = -1, list[Flow]()  # (`routed`'s list of the last submit ns met: `add_to` inline)
        for f in topological_order(flows, batch):  # (per dependency edge: kept lean, no calls)
            fluid_side = f.size == 0 or f.src == f.dst or (not f.via_nic and nvswitch(f.src, f.dst) is not None)
            side = FLUID if fluid_side else PACKET  # (`flow_side`, inline)
            if at_of is not None:
                at = at_of[f.id]
            gate = 0
            if f.id in gated:
                waiters[gate_key(f.id)] = [f.id]
                gate = 1
            if fchains and side == FLUID and not gate:  # (`fluid_chains`: into its engine now, with its deps)
                deps = f.deps
                mine = 0 if shard_of is None else shard_of[f.src]
                # (a marker: no bytes, to itself, so any shard runs it)
                if len(deps) > 2 and f.size == 0 and f.src == f.dst and shard_of is not None:
                    s = self._marker_shard(deps, mine, batch, pin)
                    if s != mine:
                        pin[f.id] = mine = s
                out_deps = None
                if len(deps) >= SHARED_DEPS_MIN:
                    wide, key = lists.key(deps, side)
                    ck = (key, mine)
                    parts = chain_lists.get(ck)
                    if parts is None:
                        parts = chain_lists[ck] = self._chain_deps(wide, mine, batch, pin, placed, ends)
                    if parts[0] is not wide:
                        f = f.with_deps(parts[0])
                    out_deps = parts[1]
                elif deps and not (len(deps) == 1 and placed.get(deps[0]) == mine):
                    # (`_chain_deps`'s external deps, inline; a dep listed twice is listed twice here, which changes
                    # nothing: `_ext` takes a shard once, `_ext_step` a least step)
                    out_deps = []
                    for d in deps:
                        ds = placed.get(d)
                        if ds is not None:
                            if ds == mine:
                                continue
                        elif d in ends:
                            continue
                        elif sides.get(d) == FLUID:
                            if shard_of is None:
                                continue
                            g = batch.get(d)
                            if (pin[d] if d in pin else shard_of[g.src] if g is not None else where.get(d)) == mine:
                                continue
                        ws = ext.get(d)
                        if ws is None:
                            ext[d] = [mine]
                        elif mine not in ws:
                            ws.append(mine)
                        out_deps.append(d)
                if out_deps:  # (`_ext_waits`, inline: each external dep's reaction is at most this flow's step)
                    n_chained += 1
                    if no_step:
                        step = 0
                    elif f.size and f.src != f.dst:
                        t = took.get((f.src, f.dst, f.size))
                        step = self._fluid_step(f) if t is None else f.delay_ns + t
                    else:
                        step = f.delay_ns
                    if len(out_deps) >= SHARED_DEPS_MIN and step < INF_NS and ext_step.keys().isdisjoint(out_deps):
                        ext_step.update(dict.fromkeys(out_deps, step))  # (the loop below, at C speed)
                    else:
                        for d in out_deps:
                            if step < ext_step.get(d, INF_NS):
                                ext_step[d] = step
                sides[f.id] = FLUID
                placed[f.id] = mine
                if at != last_at:
                    last_at = at
                    last = routed.setdefault(at, [])
                last.append(f)
                continue
            if len(f.deps) >= SHARED_DEPS_MIN:
                wide, key = lists.key(f.deps, side)
                if not gate:
                    kept = same.get(key, ())
                    if kept == ():
                        kept = same[key] = self._kept_deps(wide, side)
                    if kept is not None:  # every dep not done is known on its side: it goes straight to its engine
                        sides[f.id] = side
                        add_to(out[side], at, f if kept is wide else f.with_deps(kept))
                        continue
                j = joins.get(key, -1)
                if j == -1:
                    j = joins[key] = self._join(wide, side, at)
                if xgate and side == PACKET and j is not None:  # (out now, gated on the join: `_hold_outer`)
                    got = outer_kept.get(key)
                    if got is None:
                        got = outer_kept[key] = self._side_deps(wide, PACKET)
                    self._hold_outer(f, at, [j], f if got == f.deps else f.with_deps(got), out[PACKET])
                    outer.append(f.id)
                    continue
                if j is not None:
                    waiters[j].append(f.id)
                    gate += 1
                if gate:
                    held[f.id] = (f, at, side, gate)
                else:  # (gated, its deps known on its side and none held: its gate was all it waited for here)
                    sides[f.id] = side
                    add_to(out[side], at, f)
                continue
            pending = gate
            ended = False
            wid = OUTER_BASE - f.id if xgate and side == PACKET else f.id  # (its waits kept under it: `outer_key`)
            for d in dict.fromkeys(f.deps) if len(f.deps) > 1 else f.deps:
                if d in ends:
                    ended = True
                    continue
                if chain and side == PACKET and d in held and held[d][2] == PACKET:
                    ws = chained.get(d)
                    if ws is None:
                        chained[d] = [f.id]
                    else:
                        ws.append(f.id)
                    pending += 1
                elif d in held or sides.get(d, side) != side:
                    ws = waiters.get(d)
                    if ws is None:
                        waiters[d] = [wid]
                    else:
                        ws.append(wid)
                    pending += 1
                    if d in flb:
                        heapq.heappush(self._releasers, (flb[d], d))
            if pending and wid != f.id:  # (`xgate`: out now with its packet deps, its gate held here)
                held[wid] = (f, at, OUTER, pending)
                self._outer += 1
                sides[f.id] = PACKET
                add_to(out[PACKET], at, self._same_side(f, PACKET))
                outer.append(f.id)
            elif pending:
                held[f.id] = (f, at, side, pending)
            else:  # its deps not done are all known on its side (checked, ordered): it keeps them all
                sides[f.id] = side
                add_to(out[side], at, self._same_side(f, side) if ended else f)
        if outer:
            self._hand_outer(out[PACKET], outer)
        elif out[PACKET]:
            self._hand_packet(out[PACKET])
        for t, group in sorted(out[FLUID].items()):
            self.fluid.submit(group, t)
            self._fluid_flows += len(group)
            self._fluid_bounds(group, t)
        for t, group in sorted(routed.items()):
            if shard_of is None:
                self.fluid.submit(group, t)
            else:  # (shards: each to its own, as placed: `placed` has it, a marker's in `pin` too)
                self.fluid.submit_routed(group, t, placed)  # type: ignore[attr-defined]  # (each one's shard)
            self._fluid_flows += len(group)
        self.fluid_chained += n_chained

    def _hand_packet(self, groups: dict[int, list[Flow]]) -> None:
        """Flows for the packet side, by submit ns (one group unless `_place` got an `at_of`). Each group is in
        topological order (`_place` walks its batch so): a packet side that takes it so (`submit_ordered`, a
        decomposition's driver) does not search it again."""
        ordered = getattr(self.packet, "submit_ordered", None)
        for t, group in sorted(groups.items()):
            if ordered is None:
                self.packet.submit(group, t)
            else:
                ordered(group, t)

    def _hand_outer(self, groups: dict[int, list[Flow]], outer: list[int]) -> None:
        """(`outer_gates`) `_hand_packet`, the flows of `outer` each behind its outer gate there (`submit_outer`)."""
        self.outer_gated += len(outer)
        gated = set(outer)
        ordered = getattr(self.packet, "submit_ordered", None)
        for t, group in sorted(groups.items()):
            if ordered is None:
                self.packet.submit_outer(group, t, gated)  # type: ignore[attr-defined]
            else:
                ordered(group, t, gated)

    def _hold_outer(self, f: Flow, at: int, on: Sequence[int], bare: Flow, out: dict[int, list[Flow]]) -> None:
        """(`outer_gates`) Packet flow `f`, submitted at `at`, goes out now as `bare` (its packet deps only), its gate
        held here (`OUTER`) until each of `on` (distinct, held or of the fluid side) has arrived."""
        waiters = self._waiters
        for d in on:
            add_to(waiters, d, outer_key(f.id))
        self._held[outer_key(f.id)] = (f, at, OUTER, len(on))
        self._outer += 1
        self._side[f.id] = PACKET
        add_to(out, at, bare)

    def _kept_deps(self, deps: tuple[int, ...], side: int) -> tuple[int, ...] | None:
        """For `submit`, read once per batch: the deps a flow of `side` waiting on `deps` keeps when none is held
        or on the other side (`deps` itself when none is done, else those not done), or None (it is held)."""
        ends, held, sides = _ends_or_none(self._ended), self._held, self._side
        if any(d in held or sides.get(d, side) != side for d in deps if d not in ends):
            return None
        if not any(d in ends for d in deps):
            return deps
        return self._side_deps(deps, side)

    def _marker_shard(self, deps: tuple[int, ...], mine: int, batch: Mapping[int, Flow], pin: Mapping[int, int]) -> int:
        """For `_place` (`fluid_chains`, shards): the shard of a marker (no bytes, to itself: it touches no channel,
        so any shard runs it exactly) of node shard `mine` waiting on `deps` (three or more). A collective's start
        across hosts (its deps' first, middle and last on three shards: their sender's host's, or the shard they are
        in) goes to the next, in turn, of the shards of up to 18 of its deps spread over the list (one counter, in
        placement order: deterministic), not to its first rank's; any other stays on `mine`."""
        shard, where = self._shard_of, self._where
        assert shard is not None

        def of(d: int) -> int | None:
            s = pin.get(d)
            if s is None:
                g = batch.get(d)
                s = shard[g.src] if g is not None else where.get(d)
            return s

        a, b, c = of(deps[0]), of(deps[len(deps) // 2]), of(deps[-1])
        if a is None or b is None or c is None or a == b or b == c or a == c:
            return mine
        seen = {s for d in deps[:: len(deps) // 17 + 1] if (s := of(d)) is not None}
        seen.add(c)
        self._dealt += 1
        return sorted(seen)[(self._dealt - 1) % len(seen)]

    def _chain_deps(
        self,
        deps: tuple[int, ...],
        mine: int,
        batch: Mapping[int, Flow],
        pin: Mapping[int, int],
        placed: Mapping[int, int],
        ends: IdSet | tuple[()],
    ) -> tuple[tuple[int, ...], list[int]]:
        """For `_place` (`fluid_chains`): what a fluid flow of shard `mine` waiting on `deps` takes into its engine,
        `deps` (or those not done, when some are and the list is wide), and its external deps (of the packet side or
        another shard, or held here), whose ends are then told to its shard (`_ext`). Flows of `batch` are not in
        their engines yet (`pin`: a marker's shard, where not its node's; `placed`: the shard of each fluid flow of
        the batch put in its engine so far); `ends`: `_ends_or_none(self._ended)`."""
        sides, where, ext = self._side, self._where, self._ext
        shard = self._shard_of
        uniq = dict.fromkeys(deps) if len(deps) > 1 else deps
        out: list[int] = []
        rest: Iterable[int] = uniq
        if len(deps) >= SHARED_DEPS_MIN:  # (the deps among this batch's fluid flows in their engines, at C speed)
            shards = list(map(placed.get, uniq))
            out = [d for d, s in zip(uniq, shards, strict=True) if s is not None and s != mine]
            rest = [d for d, s in zip(uniq, shards, strict=True) if s is None] if None in shards else ()
        done = False
        for d in rest:
            if d in ends:
                done = True
                continue
            if sides.get(d) == FLUID:
                if shard is None:
                    continue
                g = batch.get(d)
                if (pin[d] if d in pin else shard[g.src] if g is not None else where.get(d)) == mine:
                    continue
            out.append(d)
        if ext.keys().isdisjoint(out):  # (each told to `mine`: in order, as the loop below would)
            ext.update({d: [mine] for d in out})
        else:
            for d in out:
                ws = ext.get(d)
                if ws is None:
                    ext[d] = [mine]
                elif mine not in ws:
                    ws.append(mine)
        if done and len(deps) >= SHARED_DEPS_MIN:
            return tuple([d for d in deps if d not in ends]), out
        return deps, out

    def _join(self, deps: tuple[int, ...], side: int, at: int) -> int | None:
        """For `_place`, once per batch: a join of wide list `deps` for the flows of `side` held on it, which wait on
        the join (its id is returned; None if they wait on none of `deps` here). The join waits on each dep not done
        that such a flow would wait on: the held packet deps it chains on (`_chained`; in the chains' mode), the
        deps held or on the other side (`_waiters`). It is held, side JOIN, and arrives the ns its last dep does
        (`_arrive_join`). Its deps' state does not change while a batch is placed (its flows come after their deps;
        completions come after)."""
        held, sides, flb, waiters = self._held, self._side, self._flb, self._waiters
        ends = _ends_or_none(self._ended)
        chain = self.chains and side == PACKET
        j = self._next_join
        pending = 0
        for d in dict.fromkeys(deps):
            if d in ends:
                continue
            if chain and d in held and held[d][2] == PACKET:
                self._chained.setdefault(d, []).append(j)
            elif d in held or sides.get(d, side) != side:
                waiters.setdefault(d, []).append(j)
                if d in flb:
                    heapq.heappush(self._releasers, (flb[d], d))
            else:
                continue
            pending += 1
        if not pending:
            return None
        self._next_join += 1
        self._joins += 1
        held[j] = (Flow(j, 0, 0, 0), at, JOIN, pending)
        waiters[j] = []
        return j

    def advance(self, until: int) -> list[Completion]:
        """Run every event at or before `until` on both sides; now() becomes `until`."""
        done: list[Completion] = []
        while True:
            got = self._step(until)
            done.extend(got)
            if not got and self.packet.now() == until and self.fluid.now() == until:
                return in_order(done)

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """Run towards `until` (INF_NS: no limit); return after the first ns at which a flow in `watch`
        completes, with every event of that ns run. With no limit it also returns once nothing is in flight."""
        if not watch:
            return self.advance(until) if until < INF_NS else []
        self._watch = watch
        self._reacted.clear()  # (reactions count the watch: a caller may change its set between calls)
        self.react_epoch += 1
        try:
            return self._advance_watching(until, watch)
        finally:
            self._watch = ()
            self._reacted.clear()

    def _advance_watching(self, until: int, watch: Collection[int]) -> list[Completion]:
        done: list[Completion] = []
        while True:
            if until >= INF_NS and self._idle():
                self._check_stuck()
                return in_order(done)
            got = self._step(until)
            done.extend(got)
            if any(c.flow_id in watch for c in got):
                done.extend(self.advance(self.now()))  # what else happens in that ns
                return in_order(done)
            if not got and until < INF_NS and self.packet.now() == until and self.fluid.now() == until:
                return in_order(done)

    def reacts_to(self, fid: int) -> bool:
        """Whether this engine, or its caller, may submit flows when `fid` completes: a flow of the other side
        waits on it, or the caller watches it to submit then (not a progress display's `Observed` flows).
        Otherwise submissions come at `until` (of `advance`, `drain`'s end) only, which lets a decomposed packet
        side run ahead (phantora.netsim.decompose)."""
        return (
            fid in self._waiters or fid in self._ext or (fid in self._watch and not isinstance(self._watch, Observed))
        )

    def reaction_ns(self, fid: int) -> int:
        """The least ns between packet flow `fid`'s completion and a flow this engine (or its caller) may hand the
        packet side because of it: 0 if the caller watches it or a packet flow waits on it; for a fluid flow or
        marker waiting on it, its least delay + transfer time (`_fluid_step`: it is released at the completion at
        the earliest) + the same reaction to its own completion, since only that can hand anything over (INF_NS
        when nothing waits on it either: it hands nothing over); INF_NS if nothing waits on `fid`. A stepped packet
        side may run that far past a completion's bound (`phantora.netsim.partition_stepped`). Kept per flow until
        the next placement or watch (`_reaction`), so a driver may ask for every unfinished flow in each round."""
        return self._reaction(fid, REACTION_DEPTH)

    def _reaction(self, fid: int, depth: int) -> int:
        """`reaction_ns` down the held flows, `depth` levels (below that a fluid waiter counts its step alone).
        The waiters of a held or unfinished flow change only when flows are placed (`_place` clears the values):
        a completion pops its own list only, and a flow waiting on an unfinished one stays held until it ends."""
        memo = self._reacted
        got = memo.get((fid, depth))
        if got is not None:
            return got
        least = 0 if fid in self._watch and not isinstance(self._watch, Observed) else INF_NS
        held = self._held
        for j in self._waiters.get(fid, ()) if least else ():
            v = memo.get((j, -1 - depth))  # (a fluid waiter's own step + its reaction, kept apart from reactions)
            if v is None:
                f, _, side, _ = held[j]
                if side == PACKET or side == OUTER:
                    v = 0
                elif side == JOIN:  # (it releases its flows the ns its last dep arrives: theirs is the reaction)
                    v = self._reaction(j, depth)
                elif depth > 0:  # (a fluid waiter nothing waits on, unwatched, hands nothing over: INF_NS)
                    after = self._reaction(j, depth - 1)
                    v = INF_NS if after >= INF_NS else self._fluid_step(f) + after
                else:
                    v = self._fluid_step(f)
                memo[(j, -1 - depth)] = v
            if v < least:
                least = v
                if v == 0:
                    break
        e = self._ext_step.get(fid)  # (`fluid_chains`: a flow waiting on it in a fluid engine, its step alone: a bound)
        if e is not None and e < least:
            least = e
        memo[(fid, depth)] = least
        return least

    def submit_floor(self) -> int:
        """A lower bound on the ns of the next flow this engine (or its caller) hands the packet side, other than
        through a packet completion it `reacts_to`: the limit of the advance in progress (the caller submits at it,
        or after a completion it watches), and the earliest completion of a fluid flow that releases held flows
        or that the caller watches (its bound, and the fluid side's next event). A decomposed packet side runs
        its workers up to it (+ its lookahead) in one round rather than stopping at every fluid event."""
        until = self._until if self._stop is None else min(self._until, self._stop)  # the caller may submit then
        tf = self.fluid.next_event_time()
        if tf is None:
            return until
        if self.fluid_chains:  # (no bounds kept for the flows in the fluid engines: their next event, a bound)
            return min(until, tf)
        flb, watch, heap, waiters = self._flb, self._watch, self._releasers, self._waiters
        m = INF_NS
        while heap:
            t, f = heap[0]
            if f not in flb or f not in waiters:  # completed
                heapq.heappop(heap)
            elif flb[f] > t:  # its bound rose since
                heapq.heapreplace(heap, (flb[f], f))
            else:
                m = t
                break
        if watch:
            m = min(m, min((flb[f] for f in watch if f in flb), default=INF_NS))
        return min(until, max(m, tf))

    def run_ahead(self, react_ns: int, earliest_end: Callable[[int, int], int]) -> None:
        """Asynchronous rounds: while a decomposed packet side's workers run a round, run the fluid side alone
        through its events before `react_ns` (the earliest ns a packet completion this engine reacts to can come:
        the packet completions before it release nothing here and are watched by no caller) and up to the limit
        of the advance in progress, releasing what its completions free as `_step` would, and keep them to hand
        out in order with the packet side's. Packet flows it releases go into the next round (they are posted at
        or after the round's horizon start: the fluid events run here are at or after the packet side's limit);
        one the engine reacts to lowers the limit to its `earliest_end` (asked only as far as the limit: one that
        ends later leaves it as it is). It stops at a completion the caller watches: the caller may submit at that
        ns."""
        if self._stop is not None:
            return
        limit = min(self._until, react_ns - 1)
        fluid = self.fluid
        while (t := fluid.next_event_time()) is not None and t <= limit:
            self.ahead_steps += 1
            self.packet.keepalive()  # (throttled: the workers hear from us during a long fluid stretch)
            got = fluid.advance(t)
            if not got:
                continue
            self._ahead.extend(got)
            for fid in self._release(got, t):
                if self.reacts_to(fid):
                    limit = min(limit, earliest_end(fid, limit + 1) - 1)
            if self._watch and any(c.flow_id in self._watch for c in got):
                self._stop = t
                return

    def _fluid_bounds(self, flows: Sequence[Flow], at: int) -> None:
        """Each flow handed to the fluid engine at `at` (deps on the other side all arrived): the earliest ns it
        can complete, max(at, its fluid deps' bounds) + delay + size at its path's full line rate + the path's
        propagation (the fluid rate never exceeds a channel's bandwidth; payload efficiency only slows it)."""
        flb, fstep, deps_of, waiters = self._flb, self._fstep, self._fdependents, self._waiters
        took = self._took if self.fluid.stretch is None and not self.fluid._multi else None
        for f in flows:  # (per dependency edge: kept lean, no calls)
            fid = f.id
            lb = at
            for d in f.deps:
                b = flb.get(d)
                if b is None:  # (done or on the packet side: a done dep ended at or before `at`)
                    continue
                ws = deps_of.get(d)
                if ws is None:
                    deps_of[d] = [fid]
                else:
                    ws.append(fid)
                if b > lb:
                    lb = b
            if took is None:  # (`_fluid_step`, inline where it is a delay or a transfer time looked up)
                step = self._fluid_step(f)
            elif f.size and f.src != f.dst:
                t = took.get((f.src, f.dst, f.size))
                step = self._fluid_step(f) if t is None else f.delay_ns + t
            else:
                step = f.delay_ns
            fstep[fid] = step
            flb[fid] = lb + step
            if fid in waiters:
                heapq.heappush(self._releasers, (lb + step, fid))

    def _fluid_step(self, f: Flow) -> int:
        """The least ns fluid flow `f` takes from its release to its completion: its delay + its size at its path's
        full line rate + the path's propagation (0 when the fluid engine stretches or multiplexes flows)."""
        fluid = self.fluid
        if fluid.stretch is not None or fluid._multi:
            return 0
        step = f.delay_ns
        if f.size and f.src != f.dst:
            key = (f.src, f.dst, f.size)
            took = self._took.get(key)
            if took is None:  # (its division of ints past 2^30 costs more than the look-up)
                path, lat = fluid.route(f)
                bw = min(self.topology.channel_bandwidth(c) for c in path)
                took = self._took[key] = max(0, f.size * 8_000_000_000 // bw - 2) + lat
            step += took
        return step

    def _fraise(self, fid: int, ns: int) -> None:
        """flb(fid) >= ns, carried down its fluid dependents (each ends no earlier than a dep's bound + its step)."""
        flb, deps_of, fstep = self._flb, self._fdependents, self._fstep
        todo = [(fid, ns)]
        while todo:
            f, t = todo.pop()
            if t <= flb.get(f, INF_NS):
                continue
            flb[f] = t
            todo.extend((j, t + fstep[j]) for j in deps_of.get(f, ()) if j in flb)

    def next_event_time(self) -> int | None:
        times = [t for t in (self.packet.next_event_time(), self.fluid.next_event_time()) if t is not None]
        if self._ahead:
            times.append(self._ahead[0].end_ns)
        return min(times) if times else None

    def now(self) -> int:
        return self.packet.now()

    def in_flight(self) -> int:
        held = len(self._held) - self._joins - self._outer  # (an outer gate's flow is in the packet side's)
        return self.packet.in_flight() + self.fluid.in_flight() + held + len(self._ahead)

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion. Raise past limit_ns."""
        limit = INF_NS if limit_ns is None else limit_ns
        done: list[Completion] = []
        while not self._idle():
            if self.now() >= limit:
                left = self.in_flight()
                raise PhantoraError(f"the network did not drain by {limit} ns: {left} flows still in flight")
            done.extend(self._step(limit))
        self._check_stuck()
        return in_order(done)

    def stats(self) -> dict[str, object]:
        out = dict(self.packet.stats())
        fluid = self.fluid.stats()
        out["fluid_flows"] = self._fluid_flows
        out["fluid_events"] = fluid.get("events", 0)
        out["hybrid_steps"] = self._steps
        if self.fluid_chains:
            out["fluid_chained"] = self.fluid_chained
        if self.outer_gated:
            out["outer_gated"] = self.outer_gated
        if "fluid_shards" in fluid:  # (the fluid side split by host: `phantora.netsim.fluid_shards`)
            out["fluid_shards"] = fluid["fluid_shards"]
        used = out.get("approximations")
        used = list(used) if isinstance(used, list) else []
        out["approximations"] = used if "nvlink=fluid" in used else ["nvlink=fluid", *used]
        return out

    def close(self) -> None:
        self.packet.close()
        self.fluid.close()

    def keepalive(self) -> None:
        self.packet.keepalive()

    def channels(self) -> FluidNvlinkSimulator:
        return self

    def fabric(self) -> FluidNvlinkSimulator | None:
        return self if self.packet.fabric() is not None else None

    def _observer(self) -> FabricObserver:
        obs = self.packet.fabric()
        if obs is None:
            raise PhantoraError("the packet side of this engine observes no fabric")
        return obs

    # ----- FabricObserver: ns-3's records, NVLink channels from the fluid side ---------------------
    def channel_usage(self, elapsed_ns: int | None = None) -> list[PacketChannelUsage]:
        """ns-3's per-channel counters; channels the fluid side used get its bytes as wire bytes (headers
        included) and that many full-size data packets."""
        elapsed = self.now() if elapsed_ns is None else elapsed_ns
        rows = {r.channel: r for r in self._observer().channel_usage(elapsed)}
        payload = self._payload
        wire = payload + self._header
        for u in self.fluid.channel_usage(elapsed):
            packets = math.ceil(u.bytes / payload)
            nbytes = u.bytes + packets * (wire - payload)
            old = rows.get(u.channel)
            if old is not None:
                packets += old.packets
                nbytes += old.bytes
            util = nbytes * 8e9 / (u.bandwidth_bps * elapsed) if elapsed > 0 else 0.0
            rows[u.channel] = PacketChannelUsage(
                u.channel, u.src, u.dst, u.bandwidth_bps, nbytes, packets,
                old.paused_ns if old else 0, old.ecn_marks if old else 0, old.max_queue_bytes if old else 0, util,
            )  # fmt: skip
        return [rows[c] for c in sorted(rows)]

    def pfc_events(self) -> Sequence[PfcEvent]:
        return self._observer().pfc_events()

    def queue_samples(self) -> Sequence[QueueSample]:
        return self._observer().queue_samples()

    def drops(self) -> Sequence[Drop]:
        return self._observer().drops()

    def trims(self) -> Sequence[Trim]:
        return self._observer().trims()

    def cnp_events(self) -> Sequence[CnpEvent]:
        return self._observer().cnp_events()

    def ecn_mark_events(self) -> Sequence[EcnMark]:
        return self._observer().ecn_mark_events()

    def flow_transport(self) -> Mapping[int, FlowTransport]:
        """ns-3's flows only: the fluid side neither reorders nor retransmits."""
        return self._observer().flow_transport()

    def effective(self) -> EffectiveSettings:
        """The packet side's (NVLink is fluid here: its NVSwitches' settings are not used)."""
        return self._observer().effective()

    # ----- internals -------------------------------------------------------------------------
    def _known(self, fid: int) -> bool:
        return fid in self._side or fid in self._held or fid in self._ended

    def _side_deps(self, deps: tuple[int, ...], side: int) -> tuple[int, ...]:
        """The deps among `deps` that `side`'s engine knows (those submitted to it), in their order; on the fluid
        side only those not done, since the fluid engine reads a done dep as nothing to wait for (a join's flows
        would otherwise hand it a wide list of done deps each)."""
        sides = self._side
        if side == FLUID:  # (`_side` holds the flows not done)
            return tuple([d for d in deps if sides.get(d) == side])
        done = self._done_packet
        return tuple([d for d in deps if sides.get(d) == side or d in done])

    def _same_side(self, f: Flow, side: int, kept: WideDeps | None = None) -> Flow:
        """`f` with only the deps its engine knows (its own side's); the others have all arrived (a fluid flow keeps a
        short list whole: the fluid engine's done set is `_ended`, so it reads them as done). `kept`: a wide
        deps list's filtered deps by (list, side), shared by the flows released together (every dep of a flow
        handed over is known on its side for good, so the filter of one list does not change)."""
        n = len(f.deps)
        if side == FLUID and n < SHARED_DEPS_MIN:  # (its deps not on its side have ended: done for the fluid engine)
            return f
        if n == 1:  # (most flows: one step of a ring or chain; `_side_deps` of one dep, inline)
            d = f.deps[0]
            if self._side.get(d) == side or (side == PACKET and d in self._done_packet):
                return f
            return f.with_deps(())
        if kept is not None and n >= SHARED_DEPS_MIN:
            wide, key = kept.key(f.deps, side)
            got = kept.values.get(key)
            if got is None:
                filtered = self._side_deps(wide, side)
                got = kept.values[key] = wide if filtered == wide else filtered
            return f if got is wide else f.with_deps(got)
        deps = self._side_deps(f.deps, side)
        return f if deps == f.deps else f.with_deps(deps)

    def _idle(self) -> bool:
        # (flows behind outer gates are in the packet side's in_flight: with no event there and none here, stuck)
        packet = self.packet.in_flight() == 0 or (self._outer > 0 and self.packet.next_event_time() is None)
        return packet and self.fluid.in_flight() == 0 and not self._ahead

    def _check_stuck(self) -> None:
        if self._held:
            n = len(self._held) - self._joins  # (a join is no flow; an outer gate's flow counts here)
            raise PhantoraError(f"{n} flows can never start: they wait on flows that never complete")

    def _step(self, until: int) -> list[Completion]:
        """Both engines to the next completion (either side), the fluid side's next event or `until`,
        whichever is first; release what the completions free. Both engines end at the same ns. Fluid completions
        run ahead (`run_ahead`, released then) are handed out once the packet side has reached them."""
        self._steps += 1
        self._until = until
        tf = self.fluid.next_event_time()
        bound = until if tf is None else min(until, tf)
        if self._stop is not None:
            bound = min(bound, self._stop)
        if self.packet.in_flight():
            got = self.packet.advance_to_completion(bound)
        else:
            if self._ahead:
                bound = min(bound, self._ahead[0].end_ns)
            got = self.packet.advance(bound) if bound < INF_NS else []
        now = self.packet.now()
        ahead = self._ahead
        early = []
        while ahead and ahead[0].end_ns <= now:
            early.append(ahead.popleft())
        if self._stop is not None and self._stop <= now:
            self._stop = None
        fluid = self.fluid.advance(now) if self.fluid.now() <= now else []
        if fluid:
            both = got + fluid
            self._release(both, now)  # (in this order: the packet side's, then the fluid side's)
            got = both if not got or _order(got[-1]) < _order(fluid[0]) else sorted(both, key=_order)
        elif got:
            self._release(got, now)
        return got + early

    def _release(self, completions: list[Completion], now: int) -> list[int]:
        """Record arrivals (at `now`); hand every held flow whose last outstanding dep arrived to its engine, at
        `now`, and open the outer gates whose last dep arrived. Returns the ids of the flows handed to the packet
        side and of those an opened gate let its horizon read (`open_outer`)."""
        ready: dict[tuple[int, int], list[Flow]] = {}
        flb, held, sides, chained = self._flb, self._held, self._side, self._chained
        kept = WideDeps()  # wide deps lists, filtered once a call (`_same_side`)
        ended, done_packet = self._ended, self._done_packet
        fstep, fdependents, waiters = self._fstep, self._fdependents, self._waiters
        ext = self._ext
        arrived: dict[int, list[int]] | None = None
        for c in completions:
            fid = c.flow_id
            if fid in ext:  # (`fluid_chains`: its end told to the shards waiting on it, below)
                if arrived is None:
                    arrived = {}
                for s in ext.pop(fid):  # (`add_to`, inline)
                    group = arrived.get(s)
                    if group is None:
                        arrived[s] = [fid]
                    else:
                        group.append(fid)
                del self._ext_step[fid]
            side = sides.pop(fid, None)
            if side != FLUID:  # (the fluid engine marked its own in `_ended`, its done set, as they completed)
                ended.add(fid)
                if side == PACKET:
                    done_packet.add(fid)
            if fid in flb:
                del flb[fid]
                del fstep[fid]
                for j in fdependents.pop(fid, ()):
                    if j in flb:
                        self._fraise(j, c.end_ns + fstep[j])
            for j in waiters.pop(fid, ()):  # (`_unchain` only where a chain waits)
                entry = one_nearer(held, j)
                if entry is None:
                    continue
                f, at, side, _ = entry
                if side == JOIN:
                    self._arrive_join(j, now, ready, kept)
                    continue
                if side == OUTER:  # (its flow is on the packet side: its gate opens below)
                    add_to(ready, (max(at, now), OUTER), f)
                    continue
                sides[j] = side
                at = max(at, now)
                ready.setdefault((at, side), []).append(self._same_side(f, side, kept))
                if j in chained:
                    self._unchain(j, at, ready, kept)
        if arrived is not None:
            self._arrived(arrived, now)
        heap = self._releasers
        if len(heap) > 2 * len(self._waiters) + 64:  # (lazy entries of completed flows: only `submit_floor` pops them)
            heap[:] = [e for e in heap if e[1] in flb and e[1] in self._waiters]
            heapq.heapify(heap)
        packet: list[int] = []
        for (at, side), batch in sorted(ready.items()):
            if side == OUTER:
                self._outer -= len(batch)
                packet += self.packet.open_outer([f.id for f in batch], at)  # type: ignore[attr-defined]
                continue
            self._engine(side).submit(batch, at)
            if side == FLUID:
                self._fluid_flows += len(batch)
                self._fluid_bounds(batch, at)
            else:
                packet += [f.id for f in batch]
        return packet

    def _arrived(self, arrived: dict[int, list[int]], now: int) -> None:
        """(`fluid_chains`) External deps ended at `now`: each shard waiting on some is told which, one message a
        shard."""
        tell = getattr(self.fluid, "arrive_by_shard", None)
        if tell is not None:
            tell(arrived, now)
        else:
            self.fluid.arrive(arrived[0], now)

    def _unchain(
        self,
        fid: int,
        at: int,
        ready: dict[tuple[int, int], list[Flow]],
        kept: WideDeps,
    ) -> None:
        """Held packet flow `fid` went to the packet side, submitted at `at`: the held packet flows chained on it
        whose last outstanding dep it was join `ready` (keyed by their submit ns and side), and so on down."""
        held, chained = self._held, self._chained
        todo = [(k, at) for k in reversed(chained.pop(fid))]
        while todo:
            j, t = todo.pop()
            entry = one_nearer(held, j)
            if entry is None:
                continue
            f, a, side, _ = entry
            if side == JOIN:
                self._arrive_join(j, t, ready, kept)
                continue
            self._side[j] = side
            a = max(a, t)
            # (a flow of one dep chained on `j` keeps it: `j` is on its side, the packet side, from now on)
            ready.setdefault((a, side), []).append(f if len(f.deps) == 1 else self._same_side(f, side, kept))
            nxt = chained.pop(j, None)
            if nxt is not None:
                todo.extend((k, a) for k in reversed(nxt))

    def _arrive_join(
        self,
        j: int,
        t: int,
        ready: dict[tuple[int, int], list[Flow]],
        kept: WideDeps,
    ) -> None:
        """Join `j`'s last dep arrived at `t` (it completed, or was handed to the packet side: `_unchain`): each flow
        waiting on the join is one dep nearer, as if that dep's arrival reached it directly; those it was the last
        for join `ready` at max(their submit ns, `t`), with what is chained on them."""
        self._joins -= 1
        held, chained = self._held, self._chained
        for k in self._waiters.pop(j):
            entry = one_nearer(held, k)
            if entry is None:
                continue
            f, at, side, _ = entry
            if side == OUTER:  # (its flow is on the packet side: its gate opens in `_release`)
                add_to(ready, (max(at, t), OUTER), f)
                continue
            self._side[k] = side
            at = max(at, t)
            ready.setdefault((at, side), []).append(self._same_side(f, side, kept))
            if k in chained:
                self._unchain(k, at, ready, kept)


def _known_none(fid: int) -> bool:
    """`FluidNvlinkSimulator._known` while no flow is placed, held or ended."""
    return False


def _ends_or_none(ended: IdSet) -> IdSet | tuple[()]:
    """`ended`, or an empty tuple while nothing has ended (a replay's first submit: the whole DAG), whose
    membership test is C's, not `IdSet`'s Python method."""
    return ended if len(ended) else ()


_order = attrgetter("end_ns", "flow_id")  # completions in time order, then by flow id


REPAIR_MOVES = 1024  # places `in_order` walks back in all before it sorts instead


def in_order(done: list[Completion]) -> list[Completion]:
    """`done` sorted by (end_ns, flow_id): itself when it is already, as the steps' completions come (each step's
    are in order, at or after the last step's), read once with no key made; else a sorted copy (`_repaired`)."""
    end, fid = -1, -1
    for c in done:
        e = c.end_ns
        if e < end or (e == end and c.flow_id < fid):
            return _repaired(done)
        end, fid = e, c.flow_id
    return done


def _repaired(done: list[Completion]) -> list[Completion]:
    """`sorted(done, key=_order)`, made by insertion where a few completions are out of place (a flow a step released
    that ended in the same ns as the step's, with a lower id, comes in the next step: a drained step's 1.8 M
    completions held 27 such), so no key is made a completion; past `REPAIR_MOVES` places walked back, the sort."""
    out: list[Completion] = []
    moved = 0
    end, fid = -1, -1
    for c in done:
        e, f = c.end_ns, c.flow_id
        if e > end or (e == end and f > fid):
            out.append(c)
            end, fid = e, f
            continue
        j = len(out) - 1
        while j >= 0 and (out[j].end_ns > e or (out[j].end_ns == e and out[j].flow_id > f)):
            j -= 1
            moved += 1
        if moved > REPAIR_MOVES:
            return sorted(done, key=_order)
        out.insert(j + 1, c)
    return out


def topological_order(flows: Sequence[Flow], batch: dict[int, Flow]) -> list[Flow]:
    """The batch with every flow after its in-batch deps (submission order otherwise kept)."""
    placed: set[int] = set()
    passed: tuple[int, ...] = ()  # the last deps list found placed or outside the batch: it stays so (`placed` grows)
    for f in flows:  # already in order (the usual case): the same list, without the search below
        deps = f.deps
        if deps is passed or deps == passed:  # (an all-to-all's dependents share one wide list: compared at C speed)
            placed.add(f.id)
            continue
        for d in deps:
            if d not in placed and d in batch:
                break
        else:
            placed.add(f.id)
            passed = deps
            continue
        placed.clear()
        break
    else:
        return list(flows)
    out: list[Flow] = []
    for root in flows:
        if root.id in placed:
            continue
        stack = [(root, 0)]
        while stack:
            f, i = stack.pop()
            if f.id in placed:
                continue
            deps = f.deps
            while i < len(deps) and (deps[i] not in batch or deps[i] in placed):
                i += 1
            if i < len(deps):
                stack.append((f, i + 1))
                stack.append((batch[deps[i]], 0))
                continue
            placed.add(f.id)
            out.append(f)
    return out
