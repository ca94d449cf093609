"""Advancing an engine without overshooting a completion someone waits on (exact mode).

`advance_watching(sim, until, watch)` runs the engine towards `until` but stops at the end of the
first event time at which a watched flow completes, so a rank woken by that completion can still
inject flows at that time. An engine may provide its own ``advance_watching(until, watch[, earliest])``
(`Ns3Simulator` does: ns-3 stops from the completion callback and finishes that ns; `RemoteSimulator`
forwards it to the network server); otherwise the engine is stepped one event time at a time with
`next_event_time` (after a jump to the watched flows' lower bound, if given).
"""

from __future__ import annotations

from collections.abc import Collection

from bridge.protocol import INF_NS
from phantora.netsim.base import Completion, NetworkSimulator


def advance_watching(
    sim: NetworkSimulator, until: int, watch: Collection[int], earliest: int | None = None
) -> list[Completion]:
    """Run to `until` (INF_NS: no limit), stopping early after the first watched completion.

    `earliest` is a time before which no watched flow can complete (a lower bound from line rate
    and propagation): the engine runs to just before it in one call. Returns the completions in
    (end_ns, flow_id) order. With no limit and nothing watched it does nothing. After an early
    stop, now() is the time of the watched completion.
    """
    if not watch:
        return sim.advance(until) if until < INF_NS else []
    if hasattr(sim, "advance_watching"):  # duck-typed: the engine stops at the completion itself
        native = sim.advance_watching
        return native(until, watch, earliest) if earliest is not None else native(until, watch)
    done: list[Completion] = []
    if earliest is not None and earliest - 1 > sim.now():
        quiet = min(until, earliest - 1)
        done.extend(sim.advance(quiet))
        if quiet == until:
            return done
    while True:
        t = sim.next_event_time()
        if t is None or t > until:
            if until < INF_NS and until > sim.now():
                done.extend(sim.advance(until))
            return done
        got = sim.advance(t)
        done.extend(got)
        if any(c.flow_id in watch for c in got):
            return done
