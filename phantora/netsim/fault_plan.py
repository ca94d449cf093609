"""A scenario's network events as link actions: which links go down, come up or change, and when.

A `link_flap` becomes `count` down/up pairs, an event with a duration gets its undo at the end of it, a
`switch_down` takes every link of the switch and a `nic_down` the endpoint's links to switches. An event at
a step boundary (`at_step`) is expanded once the engine is told when that step starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from phantora.netsim.scenario import Event, LinkEvent, NodeEvent, Scenario, link_id, node_links
from phantora.topology.model import Topology

DOWN, UP, DEGRADE, RESTORE = "down", "up", "degrade", "restore"


@dataclass(frozen=True)
class LinkAction:
    """One change of some links at `t_ns`; `label` names the scenario event it comes from."""

    t_ns: int
    op: str  # down | up | degrade | restore
    links: tuple[int, ...]
    label: str
    rate_bps: int | None = None  # degrade: new line rate (None: unchanged)
    extra_latency_ns: int = 0  # degrade
    loss: float = 0.0  # degrade


def expand(sc: Scenario, ev: Event, topo: Topology, t0: int) -> list[LinkAction]:
    """The link actions of one network event that starts at `t0` (its `at`, or its step's start)."""
    if isinstance(ev, NodeEvent):
        links = node_links(sc, ev, topo)
        out = [LinkAction(t0, DOWN, links, ev.label)]
        if ev.duration_ns is not None:
            out.append(LinkAction(t0 + ev.duration_ns, UP, links, ev.label))
        return out
    assert isinstance(ev, LinkEvent)
    link = (link_id(sc, ev, topo),)
    if ev.kind == "link_down":
        out = [LinkAction(t0, DOWN, link, ev.label)]
        if ev.duration_ns is not None:
            out.append(LinkAction(t0 + ev.duration_ns, UP, link, ev.label))
        return out
    if ev.kind == "link_up":
        return [LinkAction(t0, UP, link, ev.label)]
    if ev.kind == "link_flap":
        down = int(ev.period_ns * ev.duty)
        out = []
        for i in range(ev.count):
            start = t0 + i * ev.period_ns
            out += [LinkAction(start, DOWN, link, ev.label), LinkAction(start + down, UP, link, ev.label)]
        return out
    out = [LinkAction(t0, DEGRADE, link, ev.label, ev.rate_bps, ev.extra_latency_ns, ev.loss)]
    if ev.duration_ns is not None:
        out.append(LinkAction(t0 + ev.duration_ns, RESTORE, link, ev.label))
    return out


def timed_actions(sc: Scenario, topo: Topology) -> list[LinkAction]:
    """The link actions of every network event given at a simulated time (`at`), in time then file order."""
    out: list[LinkAction] = []
    for ev in sc.network():
        if ev.at_ns is not None:
            out += expand(sc, ev, topo, ev.at_ns)
    return sorted(out, key=lambda a: a.t_ns)  # stable: same-time actions keep file order


def event_window(ev: Event, start_ns: int) -> tuple[int, int | None]:
    """[start, end) of an event that starts at `start_ns` (end None: until the end of the run)."""
    if isinstance(ev, LinkEvent) and ev.kind == "link_flap":
        return start_ns, start_ns + (ev.count - 1) * ev.period_ns + int(ev.period_ns * ev.duty)
    return start_ns, None if ev.duration_ns is None else start_ns + ev.duration_ns
