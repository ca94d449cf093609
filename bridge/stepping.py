"""Advancing an engine without overshooting a completion someone waits on (exact mode).

`advance_watching(sim, until, watch)` runs the engine towards `until` but stops at the end of the
first event time at which a watched flow completes, so a rank woken by that completion can still
inject flows at that time. Each engine does it its own way (`NetworkSimulator.advance_watching`):
`Ns3Simulator` stops ns-3 from the completion callback and finishes that ns, `RemoteSimulator`
forwards it to the network server, and the flow engine is stepped one event time at a time
(`phantora.netsim.base.step_watching`).
"""

from __future__ import annotations

from collections.abc import Collection

from phantora.netsim.base import INF_NS, Completion, NetworkSimulator


def advance_watching(
    sim: NetworkSimulator, until: int, watch: Collection[int], earliest: int | None = None
) -> list[Completion]:
    """Run to `until` (INF_NS: no limit), stopping early after the first watched completion.

    `earliest` is a time before which no watched flow can complete (a lower bound from line rate
    and propagation). Returns the completions in (end_ns, flow_id) order. With no limit and nothing
    watched it does nothing. After an early stop, now() is the time of the watched completion.
    """
    if not watch:
        return sim.advance(until) if until < INF_NS else []
    return sim.advance_watching(until, watch, earliest)
