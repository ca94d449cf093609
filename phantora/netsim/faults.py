"""The flow engine under a scenario: links fail, come back and degrade at events (docs/scenarios.md).

- **Down.** At the instant a link goes down, every flow crossing it stalls (rate 0). The bytes on the dead
  wire (the flow's rate x the link's latency, at most what it had sent) are lost and sent again. Routing
  still points at the dead link until it re-converges, `reconvergence` later: flows that start meanwhile on
  it stall too.
- **Re-convergence.** Routes are recomputed on the topology without the links down at that instant (ECMP
  groups drop the dead next hop; shortest paths may change). Every active or stalled flow whose route
  changed moves to the new one and keeps its bytes left (rerouted bytes): a NIC down on an endpoint with another
  NIC fails over to it. A flow with no route left (a NIC down on a one-NIC endpoint) stays stalled until a link
  comes back (counted in `no_route_flows`); `drain` says so if none does.
- **Up.** A link that comes back carries its stalled flows at once; routes use it again after
  `reconvergence`.
- **Degrade.** The link's channels get the new rate, extra latency, and loss p as goodput x (1 - p) (the
  lost bytes are counted); restore undoes it. Max-min is re-solved at every event.
- **Background flows** (`phantora.netsim.background`) ride in the same engine; their completions are kept
  apart (`background_done`), so callers see only their own flows.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.fault_plan import DEGRADE, DOWN, RESTORE, UP, LinkAction, expand, timed_actions
from phantora.netsim.flow import FlowSimulator, _Active
from phantora.netsim.scenario import Scenario, check_against
from phantora.topology.model import Topology

BACKGROUND_BASE = 1 << 50  # flow ids of background traffic start here (far above any job's)
_REROUTE = "reroute"


@dataclass(frozen=True)
class AppliedEvent:
    """A link action as applied (the trace and results.json list these)."""

    t_ns: int
    op: str  # down | up | degrade | restore | reroute
    label: str  # the scenario event ('link_down#0'); reroute: the action that triggered it
    links: tuple[int, ...]
    stalled: int = 0  # flows that stopped
    moved: int = 0  # flows that moved to a new route (reroute) or resumed (up)
    moved_bytes: int = 0  # reroute: the bytes those flows had left to send


class FaultyFlowSimulator(FlowSimulator):
    """`FlowSimulator` that applies a scenario's network events; see the module docstring."""

    carries = False  # it moves flows and changes capacities under the solver: max-min is solved by components

    def __init__(
        self, topology: Topology, scenario: Scenario, *, background: Sequence[Flow] = (), **options: object
    ) -> None:
        super().__init__(topology, **options)  # type: ignore[arg-type]
        if self.lb not in ("ecmp", "flowlet"):
            raise InputError(
                f"a scenario with link events runs on per-flow routes; lb={self.lb} is not supported with it",
                field="lb",
            )
        check_against(scenario, topology)
        self.scenario = scenario
        self.base_topology = topology
        nch = topology.num_channels
        self._base_cap = self._cap[:nch]
        self._base_lat = list(self._lat)
        self._actions: list[tuple[int, int, LinkAction]] = []
        self._seq = 0
        for a in timed_actions(scenario, topology):
            self._push(a)
        self._down: dict[int, int] = {}  # link -> how many actions hold it down (a switch and a link may overlap)
        self._dead: set[int] = set()  # channels of the links down
        self._route_down: frozenset[int] = frozenset()
        self._stalled: dict[int, _Active] = {}
        self._no_route: set[int] = set()  # flows left stalled by a re-convergence: no route without the dead links
        self._placed_rem: dict[int, float] = {}  # moved flows: bytes left when placed on their current path
        self._lossy: dict[int, float] = {}  # channel -> loss rate
        self._t_loss = 0
        self.applied: list[AppliedEvent] = []
        self.background_done: list[Completion] = []
        self._fault_stats = {
            "rerouted_bytes": 0,
            "rerouted_flows": 0,
            "lost_bytes": 0,
            "stalls": 0,
            "loss_bytes": 0.0,
        }
        if background:
            self.submit(background, at=0)

    # ----- scenario input -------------------------------------------------------------------
    def _push(self, a: LinkAction) -> None:
        heapq.heappush(self._actions, (a.t_ns, self._seq, a))
        self._seq += 1

    def step_started(self, step: int, t_ns: int) -> None:
        """Step `step` started at `t_ns` (>= now()): schedule the network events given at that step."""
        for ev in self.scenario.network():
            if ev.at_step == step:
                for a in expand(self.scenario, ev, self.base_topology, max(t_ns, self._now)):
                    self._push(a)

    # ----- the event loop -------------------------------------------------------------------
    def next_event_time(self) -> int | None:
        t = super().next_event_time()
        if self._actions and (t is None or self._actions[0][0] < t):
            return self._actions[0][0]
        return t

    def _step(self, t: int) -> None:
        self._account_loss(t)
        super()._step(t)
        touched: set[int] = set()
        while self._actions and self._actions[0][0] == t:
            self._apply(heapq.heappop(self._actions)[2], t, touched)
        if self._dead:
            self._stall_dead(t, touched)
        if touched:
            self._resolve(touched, t)

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; scenario events after that wait for a later advance."""
        self._run_events(limit_ns, lambda: bool(self._flows))
        if self._stalled:
            f = self._stalled[min(self._stalled)].flow
            names = self.base_topology.nodes
            raise PhantoraError(
                f"{len(self._stalled)} flows stalled for good: no link came back on their route (first: flow {f.id} "
                f"from {names[f.src].name} to {names[f.dst].name}; links down: {sorted(self._down)})"
            )
        if self._flows:
            raise PhantoraError(f"{len(self._flows)} flows can never start: they wait on flows that never complete")
        return self._take()

    def _take(self) -> list[Completion]:
        out = super()._take()
        if not any(c.flow_id >= BACKGROUND_BASE for c in out):
            return out
        self.background_done.extend(c for c in out if c.flow_id >= BACKGROUND_BASE)
        return [c for c in out if c.flow_id < BACKGROUND_BASE]

    def stats(self) -> dict[str, object]:
        out = super().stats()
        fs = dict(self._fault_stats)
        fs["lost_bytes"] = int(fs["lost_bytes"]) + round(fs.pop("loss_bytes"))
        out.update(fs, scenario=self.scenario.name, scenario_events=len(self.applied))
        out["background_flows_done"] = len(self.background_done)
        out["no_route_flows"] = len(self._no_route)
        return out

    # ----- actions --------------------------------------------------------------------------
    def _apply(self, a: LinkAction, t: int, touched: set[int]) -> None:
        stalled = moved = moved_bytes = 0
        if a.op == DOWN:
            for link in a.links:
                self._down[link] = self._down.get(link, 0) + 1
                self._dead.update((2 * link, 2 * link + 1))
            stalled = self._stall_dead(t, touched)
            self._push_reroute(a, t)
        elif a.op == UP:
            for link in a.links:
                n = self._down.get(link, 0) - 1
                if n > 0:
                    self._down[link] = n
                elif link in self._down:
                    del self._down[link]
                    self._dead.difference_update((2 * link, 2 * link + 1))
            moved = self._resume(t, touched)
            self._push_reroute(a, t)
        elif a.op in (DEGRADE, RESTORE):
            self._degrade(a, touched)
        else:
            before = self._fault_stats["rerouted_bytes"]
            moved, stalled = self._reroute(t, touched)
            moved_bytes = int(self._fault_stats["rerouted_bytes"] - before)
        self.applied.append(AppliedEvent(t, a.op, a.label, a.links, stalled, moved, moved_bytes))

    def _push_reroute(self, a: LinkAction, t: int) -> None:
        self._push(LinkAction(t + self.scenario.reconvergence_ns, _REROUTE, a.links, a.label))

    def _degrade(self, a: LinkAction, touched: set[int]) -> None:
        for link in a.links:
            for c in (2 * link, 2 * link + 1):
                if a.op == RESTORE:
                    cap, lat, loss = self._base_cap[c], self._base_lat[c], 0.0
                else:
                    rate = self._base_cap[c] if a.rate_bps is None else a.rate_bps * self.payload_efficiency / 8e9
                    cap, lat, loss = rate * (1.0 - a.loss), self._base_lat[c] + a.extra_latency_ns, a.loss
                self._cap[c] = cap
                self._cap_arr[c] = cap
                self._lat[c] = lat
                if loss:
                    self._lossy[c] = loss
                else:
                    self._lossy.pop(c, None)
                touched.add(c)
        self._routes.clear()  # cached latencies
        for rec in self._active.values():
            if any(c in touched for c in rec.path):
                rec.lat = sum(self._lat[c] for c in rec.path)

    def _reroute(self, t: int, touched: set[int]) -> tuple[int, int]:
        """Routing re-converges on the links down now: every flow whose route changed moves. Returns the flows
        moved and the flows left with no route."""
        down = frozenset(self._down)
        if down != self._route_down:
            self._route_down = down
            self.topology = self.base_topology.with_links_down(down) if down else self.base_topology
            self._routes.clear()
        moved = left = 0
        for fid in sorted(self._active):
            rec = self._active[fid]
            path, lat = self.route(rec.flow)
            if path != rec.path:
                self._fault_stats["rerouted_bytes"] += round(self._bring_forward(rec, t))
                self._fault_stats["rerouted_flows"] += 1
                self._lift(rec, t, touched)
                self._place(rec, path, lat, t, touched)
                moved += 1
        for fid in sorted(self._stalled):
            rec = self._stalled[fid]
            path, lat = self.route(rec.flow)
            if any(c in self._dead for c in path):  # no route left (or a link failed since): it waits for one
                self._no_route.add(fid)
                left += 1
            elif path != rec.path:
                del self._stalled[fid]
                self._fault_stats["rerouted_bytes"] += round(rec.rem)
                self._fault_stats["rerouted_flows"] += 1
                self._place(rec, path, lat, t, touched)
                self._active[fid] = rec
                moved += 1
        return moved, left

    def route(self, f: Flow) -> tuple[tuple[int, ...], int]:
        """The flow's route in routing's current view; with no route left there, its route on the whole
        topology (it crosses a dead link, so the flow stalls until one comes back)."""
        try:
            return super().route(f)
        except InputError:
            if self.topology is self.base_topology:
                raise
            path = tuple(self.base_topology.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic))
            return path, sum(self._lat[c] for c in path)

    def _routable(self, f: Flow) -> bool:
        """Whether routing's current view has a route for the flow."""
        try:
            FlowSimulator.route(self, f)
        except InputError:
            return False
        return True

    # ----- moving flows between channels -----------------------------------------------------
    def _bring_forward(self, rec: _Active, t: int) -> float:
        """Count the bytes sent up to t at the current rate; the flow then has rate 0. Returns bytes left."""
        rec.rem = max(0.0, rec.rem - rec.rate * (t - rec.t_last))
        rec.t_last = t
        rec.rate = 0.0
        rec.ver += 1  # its scheduled transmit end is stale
        return rec.rem

    def _lift(self, rec: _Active, t: int, touched: set[int]) -> None:
        """Take a flow off its channels, crediting them the bytes it sent there."""
        fid = rec.flow.id
        placed = self._placed_rem.get(fid, float(rec.flow.size))
        sent = round(placed - rec.rem) + (rec.flow.size - round(placed))  # undo the debit made when placed
        for c in rec.path:
            self._bytes[c] += sent
        self._leave_channels(fid, rec.path, t, touched)

    def _place(self, rec: _Active, path: tuple[int, ...], lat: int, t: int, touched: set[int]) -> None:
        """Put a flow (rate 0, bytes left brought forward) on `path`; `_resolve` gives it a rate."""
        fid = rec.flow.id
        rec.path = path
        rec.solve_path = path if rec.cap_ch < 0 else (*path, rec.cap_ch)
        rec.lat = lat
        self._placed_rem[fid] = rec.rem
        debit = rec.flow.size - round(rec.rem)  # the transmit end adds the whole size: count only what is left
        for c in path:
            self._bytes[c] -= debit
        self._occupy(fid, path, t, touched)

    def _stall_dead(self, t: int, touched: set[int]) -> int:
        """Stop every active flow that crosses a dead channel; the bytes on the dead wire are lost."""
        hit = sorted({fid for c in self._dead for fid in self._ch_flows.get(c, ())})
        for fid in hit:
            rec = self._active.pop(fid)
            rate = rec.rate
            self._bring_forward(rec, t)
            on_wire = max((self._lat[c] for c in rec.path if c in self._dead), default=0) * rate
            lost = min(on_wire, rec.flow.size - rec.rem)
            self._lift(rec, t, touched)
            rec.rem += lost
            self._placed_rem[fid] = rec.rem
            self._fault_stats["lost_bytes"] += round(lost)
            self._fault_stats["stalls"] += 1
            self._stalled[fid] = rec
            if self._route_down and not self._routable(rec.flow):  # it started with no route (re-converged)
                self._no_route.add(fid)
        return len(hit)

    def _resume(self, t: int, touched: set[int]) -> int:
        """Stalled flows whose path is whole again carry on, on the same path."""
        back = [fid for fid, rec in sorted(self._stalled.items()) if not any(c in self._dead for c in rec.path)]
        for fid in back:
            rec = self._stalled.pop(fid)
            self._place(rec, rec.path, rec.lat, t, touched)
            self._active[fid] = rec
        return len(back)

    def _account_loss(self, t: int) -> None:
        """Bytes a lossy link dropped since the last event: goodput x p / (1 - p) over the time passed."""
        if self._lossy and t > self._t_loss:
            dt = t - self._t_loss
            for c, p in self._lossy.items():
                rate = sum(self._active[f].rate for f in self._ch_flows.get(c, ()))
                self._fault_stats["loss_bytes"] += rate * dt * p / (1.0 - p)
        self._t_loss = t
