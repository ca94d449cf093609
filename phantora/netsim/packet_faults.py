"""The packet engine (ns-3) under a scenario: the same link actions as the flow engine, applied by the fabric.

`FaultyNs3Simulator` is `Ns3Simulator` with a scenario's network events scheduled inside ns-3
(`PhantoraNetwork::ScheduleLinkState / ScheduleLinkDegrade / ScheduleReconverge`, docs/scenarios.md):

- **Down.** The cable fails: every packet on its wire and every packet sent on it later is lost; the PFC state
  of its two ports is cleared. Switches keep forwarding onto it until routing re-converges, so flows routed
  there stall and their transport (go-back-N or SACK, with a retransmission timeout) recovers what was lost.
- **Re-convergence**, `reconvergence` after each down or up: the switches' tables avoid exactly the links
  down at that instant, and each ECMP group keeps its surviving next hops with the same hash, as the flow
  engine's `Topology.with_links_down` (so both engines give the same routes after re-convergence).
- **Degrade.** Both ports of the link run at the new rate from their next packet, the cable adds its extra
  latency, and it drops data and ACK packets at random (never PFC frames) from a splitmix64 stream seeded by
  the scenario's seed and the link.
- **Background flows** ride in the same fabric with ids from `BACKGROUND_BASE`; their completions are kept
  apart (`background_done`).
- **Rerouted flows**: at each re-convergence, the started flows whose route changed, with the bytes they had not
  sent once (`rerouted_flows`, `rerouted_bytes`; per re-convergence in `applied_so_far`).
- **NIC failover and stalls**: at a re-convergence each NIC moves its queue pairs to the port routing now picks
  (a live port of the same endpoint where it has another: `nic_failovers`) and stalls those with no route
  (`no_route_flows`, until a later re-convergence finds one). A failure's `stalled` count is the started flows whose
  route crossed the link (they blackhole until re-convergence), as the flow engine counts them; a re-convergence's,
  the flows it left with no route (`PhantoraNetwork::StallLog`).

A scenario with failures or loss needs a retransmission timeout: without `rto_ns` in the config it gets
`SCENARIO_RTO_NS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from phantora.collectives.back_pressure import is_credit
from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.fault_plan import DEGRADE, DOWN, RESTORE, UP, LinkAction, expand, timed_actions
from phantora.netsim.faults import BACKGROUND_BASE, AppliedEvent, FaultyFlowSimulator
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.scenario import LinkEvent, Scenario, check_against
from phantora.perfmodel.throttle import Throttles
from phantora.topology.model import Topology

AT_MARKER_SUFFIX = "/marker/at"  # a workload's marker at an absolute time (phantora.replay: f"/{MARKER}/at")
SCENARIO_RTO_NS = 100_000  # go-back-N timeout of a scenario run whose config sets none (100 us)


def needs_rto(sc: Scenario) -> bool:
    """Whether the scenario can lose packets (a failure, or a degrade with loss)."""
    for ev in sc.network():
        if ev.kind != "link_degrade" or (isinstance(ev, LinkEvent) and ev.loss > 0):
            return True
    return False


def check_packet_scenario(sc: Scenario, topo: Topology, *, fluid_nvlink: bool = False) -> None:
    """What packet mode cannot do with a scenario: with nvlink=fluid the NVLink links are the flow engine's, so no
    event may touch a link of an NVSwitch (an InputError naming the file, line and field)."""
    check_against(sc, topo)
    if not fluid_nvlink:
        return
    for ev in sc.network():
        for link in expand(sc, ev, topo, 0)[0].links:
            ends = topo.links[link].a, topo.links[link].b
            if any(topo.nodes[n].kind == "nvswitch" for n in ends):
                raise InputError(
                    "with nvlink=fluid the NVLink links run in the flow engine: link events on them need nvlink=packet",
                    file=sc.source,
                    line=ev.line,
                    field=f"events[{ev.index}]",
                )


def scenario_engine(engine: object) -> FaultyFlowSimulator | FaultyNs3Simulator | None:
    """The engine that applies a scenario: `engine` itself, or the packet side of a fluid-NVLink hybrid."""
    for e in (engine, getattr(engine, "packet", None)):
        if isinstance(e, (FaultyFlowSimulator, FaultyNs3Simulator)):
            return e
    return None


def stall_log(flat: Sequence[int]) -> tuple[dict[tuple[int, int], int], list[int]]:
    """`PhantoraNetwork::StallLog` (ns, link, flows triples) split: the flows each failure stalled by (ns, link),
    and the flows each re-convergence (link -1) left with no route, in order."""
    downs: dict[tuple[int, int], int] = {}
    no_route: list[int] = []
    for t, link, flows in zip(flat[0::3], flat[1::3], flat[2::3], strict=True):
        if link < 0:
            no_route.append(flows)
        else:
            downs[(t, link)] = downs.get((t, link), 0) + flows
    return downs, no_route


class FaultyNs3Simulator(Ns3Simulator):
    """`Ns3Simulator` that applies a scenario's network events; see the module docstring."""

    def __init__(
        self,
        topology: Topology,
        scenario: Scenario,
        config: PacketConfig | None = None,
        calls: Path | None = None,
        *,
        background: Sequence[Flow] = (),
    ) -> None:
        check_against(scenario, topology)
        config = config or PacketConfig()
        if config.rto_ns is None and needs_rto(scenario):
            config = config.with_updates(rto_ns=SCENARIO_RTO_NS)
        super().__init__(topology, config, calls)
        self.scenario = scenario
        self.base_topology = topology
        self.applied: list[AppliedEvent] = []  # every action scheduled, in time order once the run passes it
        self.background_done: list[Completion] = []
        self._schedule(timed_actions(scenario, topology))
        if background:
            self.submit(background, at=0)

    # ----- scenario input -------------------------------------------------------------------
    def step_started(self, step: int, t_ns: int) -> None:
        """Step `step` started at `t_ns` (>= now()): schedule the network events given at that step."""
        actions: list[LinkAction] = []
        for ev in self.scenario.network():
            if ev.at_step == step:
                actions += expand(self.scenario, ev, self.base_topology, max(t_ns, self.now()))
        self._schedule(sorted(actions, key=lambda a: a.t_ns))

    def _schedule(self, actions: Sequence[LinkAction]) -> None:
        """Every physical change first, then the re-convergences, so that at one instant the links change before
        routing looks at them (as the flow engine orders them)."""
        net = self._net
        delay = self.scenario.reconvergence_ns
        for a in actions:
            for link in a.links:
                if a.op in (DOWN, UP):
                    net.ScheduleLinkState(a.t_ns, link, a.op == UP)
                elif a.op == DEGRADE:
                    net.ScheduleLinkDegrade(
                        a.t_ns, link, a.rate_bps or 0, a.extra_latency_ns, float(a.loss), self.scenario.seed
                    )
                elif a.op == RESTORE:
                    net.ScheduleLinkDegrade(a.t_ns, link, 0, 0, 0.0, self.scenario.seed)
            self.applied.append(AppliedEvent(a.t_ns, a.op, a.label, a.links))
        for a in actions:
            if a.op in (DOWN, UP):
                net.ScheduleReconverge(a.t_ns + delay)
                self.applied.append(AppliedEvent(a.t_ns + delay, "reroute", a.label, a.links))
        self.applied.sort(key=lambda e: e.t_ns)

    def throttle(self, throttles: Throttles) -> None:
        """Replays: slow GPUs stretch the compute markers (flows of no bytes from a rank's node to itself, with a
        delay) from their release, inside the fabric (`PhantoraNetwork::SetThrottle`), as the flow engine's
        `replay.compute_stretch` does; a workload's markers at an absolute time (`at`) keep their delay."""
        nodes = self.base_topology.endpoints
        for rank, windows in sorted(throttles.by_rank.items()):
            for w in windows:
                end = -1 if w.end_ns is None else w.end_ns
                self._net.SetThrottle(nodes[rank], w.start_ns, end, float(w.factor))
        self._throttled = True

    def throttle_from_flow(self, flow_id: int, rank: int, duration_ns: int | None, factor: float) -> None:
        """A slow GPU on `rank` that opens when flow `flow_id` (a graph's step marker) completes, before the flows it
        releases start (`PhantoraNetwork::ThrottleFromFlow`): a gpu_slow at a step in a graph replay."""
        node = self.base_topology.endpoints[rank]
        self._net.ThrottleFromFlow(flow_id, node, -1 if duration_ns is None else duration_ns, float(factor))
        self._throttled = True

    def submit(self, flows: Sequence[Flow], at: int, dports: Mapping[int, int] | None = None) -> None:
        if getattr(self, "_throttled", False):
            for f in flows:
                if not f.size and f.src == f.dst and (f.tag.endswith(AT_MARKER_SUFFIX) or is_credit(f)):
                    self._net.ExemptFromThrottle(f.id)  # not compute: an absolute time, or a slot's credit
        super().submit(flows, at, dports)

    # ----- results ----------------------------------------------------------------------------
    def _take(self) -> list[Completion]:
        out = super()._take()
        if not any(c.flow_id >= BACKGROUND_BASE for c in out):
            return out
        self.background_done.extend(c for c in out if c.flow_id >= BACKGROUND_BASE)
        return [c for c in out if c.flow_id < BACKGROUND_BASE]

    def applied_so_far(self) -> list[AppliedEvent]:
        """The actions whose time the run has reached; each re-convergence with the flows it moved and their bytes
        not yet sent once (`PhantoraNetwork::RerouteLog`, one entry per re-convergence in the order they ran)."""
        now = self.now()
        log = [int(x) for x in self._net.RerouteLog()]
        moves = iter(zip(log[1::3], log[2::3], strict=True))
        down_stalls, no_route = stall_log([int(x) for x in self._net.StallLog()])
        left = iter(no_route)
        out = []
        for e in self.applied:
            if e.t_ns > now:
                continue
            if e.op == "reroute":
                flows, nbytes = next(moves, (0, 0))
                e = dataclasses.replace(e, moved=flows, moved_bytes=nbytes, stalled=next(left, 0))
            elif e.op == DOWN:
                e = dataclasses.replace(e, stalled=sum(down_stalls.pop((e.t_ns, link), 0) for link in e.links))
            out.append(e)
        return out

    def stats(self) -> dict[str, object]:
        out = super().stats()
        out["lost_bytes"] = out.get("wire_lost_bytes", 0)
        out["lost_packets"] = out.get("wire_lost_packets", 0)
        out["scenario"] = self.scenario.name
        out["scenario_events"] = len(self.applied_so_far())
        out["background_flows_done"] = len(self.background_done)
        return out
