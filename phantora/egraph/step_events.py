"""Scenario events at a step boundary (`at_step = k`) in a graph replay, as a live run applies them.

A recorded graph marks the end of each rank's steps (`GraphPlan.step_markers`): step k starts where step k - 1
ends. A network event at step k fires when the first rank starts step k (the first of the ranks' step k - 1
markers to complete): the engine runs with those markers watched (`advance_watching` stops at each), so the
event applies at that ns, before anything later runs. A `gpu_slow` at step k opens when its own rank starts step
k (`StepThrottles`: on the flow network through its release hook, in ns-3 inside the fabric as the rank's step
k - 1 marker completes). Step 0 starts at the replay's start. A step the graph never reaches is refused before
anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Completion, Flow, NetworkSimulator
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.packet_faults import FaultyNs3Simulator, scenario_engine
from phantora.netsim.scenario import GpuSlow, Scenario
from phantora.perfmodel.throttle import Throttle, Throttles
from phantora.topology.model import Topology


def has_step_events(sc: Scenario | None) -> bool:
    """Whether the scenario has an event at a step boundary."""
    return sc is not None and any(ev.at_step is not None for ev in sc.events)


def check_steps(sc: Scenario, steps: int) -> None:
    """Refuse an event at a step the graph never starts (a graph of `steps` steps starts steps 0 .. steps)."""
    for ev in sc.events:
        if ev.at_step is not None and ev.at_step > steps:
            have = (
                "no steps (record with phantora.runtime.step() calls, or give `at`)"
                if not steps
                else (f"{steps} steps: step {ev.at_step} never starts")
            )
            raise InputError(
                f"the replayed graph has {have}", file=sc.source, line=ev.line, field=f"events[{ev.index}].at_step"
            )


@dataclass
class _Boundary:
    """Markers whose first completion opens an event; `fire(t)` applies it."""

    markers: frozenset[int]
    fire: Callable[[int], None]


def run_with_step_events(
    sim: NetworkSimulator, flows: list[Flow], step_markers: Sequence[Sequence[int]], sc: Scenario, topo: Topology
) -> tuple[list[Completion], dict[int, int]]:
    """Submit `flows` and run them to the end, applying the scenario's step events as their steps start.
    Returns the completions and the ns each step with an event started (as the first rank started it)."""
    check_steps(sc, min((len(m) for m in step_markers), default=0))
    engine = scenario_engine(sim)
    started: dict[int, int] = {}
    StepThrottles(sim, sc, topo, step_markers)

    def network(k: int) -> Callable[[int], None]:
        def fire(t: int) -> None:
            started[k] = t
            if engine is None:
                raise InputError("network events at a step need the scenario's engine", file=sc.source)
            engine.step_started(k, t)

        return fire

    sim.submit(flows, at=sim.now())
    pending: list[_Boundary] = []
    for k in sorted({ev.at_step for ev in sc.network() if ev.at_step is not None}):
        _add(pending, [m[k - 1] for m in step_markers] if k else [], network(k), sim.now())
    done: list[Completion] = []
    while pending:
        watch = set().union(*(b.markers for b in pending))
        got = sim.advance_watching(INF_NS, watch)
        done += got
        ends = {c.flow_id: c.end_ns for c in got if c.flow_id in watch}
        if not got and not sim.in_flight():
            raise InputError("the replay ended before every step with an event started", file=sc.source)
        for b in [b for b in pending if b.markers & ends.keys()]:
            pending.remove(b)
            b.fire(min(ends[m] for m in b.markers & ends.keys()))
    return done + sim.drain(), started


def _add(pending: list[_Boundary], markers: list[int], fire: Callable[[int], None], now: int) -> None:
    """A boundary at the first of `markers` to complete; none (step 0): it fires now."""
    if markers:
        pending.append(_Boundary(frozenset(markers), fire))
    else:
        fire(now)


class StepThrottles:
    """Slow-GPU windows that open as a rank starts a step. On the flow engine its `stretch` hook sees each compute
    marker as it is released; one that depends on the rank's step k - 1 marker opens the window at its release,
    the rank's start of step k, before its own delay is stretched (exact). ns-3 stretches markers inside the
    fabric: the window opens there as the rank's step k - 1 marker completes, before the markers it releases start
    (`FaultyNs3Simulator.throttle_from_flow`, exact too); windows at a time are installed with the scenario
    (`install_throttles`)."""

    def __init__(
        self, sim: NetworkSimulator, sc: Scenario, topo: Topology, step_markers: Sequence[Sequence[int]]
    ) -> None:
        from phantora.replay import compute_stretch

        self.topo, self.compute_stretch = topo, compute_stretch
        self.windows = [w for ev in sc.gpu_slow() if ev.at_ns is not None for w in _windows(ev, ev.at_ns)]
        self.opens: dict[int, GpuSlow] = {}  # step marker -> the event its completion opens
        packet = scenario_engine(sim)
        for ev in sc.gpu_slow():
            if ev.at_step is not None:
                if not isinstance(sim, FlowSimulator):
                    if not isinstance(packet, FaultyNs3Simulator):
                        raise InputError(
                            "a slow GPU from a step in a graph replay needs the flow network or ns-3 under the "
                            "scenario",
                            file=sc.source,
                            line=ev.line,
                            field=f"events[{ev.index}].at_step",
                        )
                    if ev.at_step == 0:
                        packet.throttle(Throttles(_windows(ev, sim.now())))
                    else:
                        packet.throttle_from_flow(
                            step_markers[ev.rank][ev.at_step - 1], ev.rank, ev.duration_ns, ev.factor
                        )
                    continue
                if ev.at_step == 0:
                    self.windows += _windows(ev, 0)
                else:
                    self.opens[step_markers[ev.rank][ev.at_step - 1]] = ev
        self.started: dict[int, int] = {}  # rank -> ns a window at a step opened (its rank's step start)
        self._stretch = compute_stretch(Throttles(self.windows), topo)
        if isinstance(sim, FlowSimulator) and (self.opens or self.windows):
            sim.stretch = self.stretch

    def stretch(self, f: Flow, release_ns: int) -> int:
        hit = [m for m in f.deps if m in self.opens]
        for m in hit:
            self.windows += _windows(self.opens.pop(m), release_ns)
        if hit:
            self._stretch = self.compute_stretch(Throttles(self.windows), self.topo)
        return self._stretch(f, release_ns)


def _windows(ev: GpuSlow, start: int) -> list[Throttle]:
    end = None if ev.duration_ns is None else start + ev.duration_ns
    return [Throttle(ev.rank, start, end, ev.factor)]
