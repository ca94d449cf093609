"""A partition worker's windows: conservative barrier windows between workers (issue 38, parallel packet mode).

Each worker is an ns-3 engine over the whole fabric that runs the events of its own switch group only
(PhantoraNetwork params partition.Groups and partition.Worker, keyed mode). A packet over a cut cable leaves as
a message and arrives no earlier than the least cut-cable latency L (the lookahead) after it was sent. So in a
window [W, W + L) every worker may run every event before W + L: whatever another worker sends it in that window
arrives at or after W + L, and is delivered at the barrier that ends the window.

Every window ends with one exchange between every pair of workers (`Peers.exchange`): each sends each other
worker its messages for it, the time of its own next event (before delivery) and the least arrival time of all
the messages it sent. Every worker then knows the same global next time G (the least of those): the next window
starts at G, so stretches where nothing happens anywhere cost one window, not one per L (the least-next-time
rule). A run to time T ends when G > T; with no limit, when nothing is left anywhere (G = NEVER).

Wider windows: the lookahead bounds when a message sent at or after G can arrive, but a worker often knows more.
Each also reports its earliest output (`CutOutputBound`): the least ns anything it may send from now on arrives
at, from its pending events (each event's ns plus the least delay from its node to an arrival across a cut: its
own group's cables, then the cut cable) and from the messages it sent in the window (their arrival plus the same
from the node they arrive at, for what they can make the receiver send). Messages sent in the next window are
caused by those events and messages only (whatever else arrives comes at the next barrier), so the window may run
to the least of these over every worker when that is past G + L (a null-message / earliest-output-time bound, as
ns-3's distributed simulator and Unison use).

Flows with dependencies: a dependency that completes in one worker releases a flow another worker starts by a
message (PhantoraNetwork, keyed as one engine's start), and the start may fall in the very ns of the completion,
under the lookahead. So each worker also reports the least ns a release it can cause may land at
(`CutReleaseBounds`: after its completion's ns, or in it), and the window ends before the least of them: before
ns A when a release lands after its completion, or through the events of ns A scheduled before A (`CutRunThrough`:
a release made at A orders after them) when it may land at A; then the rest of that ns (see `window_end`). A
release that still lands behind its worker's clock is an error there, never a silent difference. A flow whose
sender this worker runs and whose receiver another worker does is bounded better here (its bytes not yet sent,
the first send of its last byte): after each window its bound goes to the receiver's worker with the messages
(`CutShareBounds`), which bounds the flow's dependents by it from the next barrier on.

Queue sampling by owner (`sampling`): each worker samples the switches it runs at one engine's instants: a period
from a flow start anywhere, every interval, through the first instant at which no worker has flows (each sample the
last event of its ns); the next flow start begins a new period at its own phase. Each report carries the worker's
period start and the ns its last flow left (`idle`, NEVER while it has flows). While some worker has flows and no
start is known, a window runs one ns only (every start in it is at that ns, and nothing reaches another worker
within it), so at the next barrier every worker joins the period at its start (`CutSampling`), and the next window
begins there (for the joiners' first samples). A worker samples on while it or, at the last barrier, any other had
flows; once every worker says it has none (flows are added between runs only, so within a run they only leave),
the period ends at its first instant at or after the last one left: a worker drops the samples it made after that
(`FabricRecorder::EndPeriod`), and they are one engine's.

On one machine the peers run this same loop in C++ over their stream sockets (`Peers` with ``native`` set: their
`run_native`, `phantora.netsim.cut_native`), without a Python call per window; otherwise this module runs it.

The exchange itself is `bridge.cut_unix` on one machine (Unix stream sockets, `bridge.cut_frame`'s
length-prefixed msgpack frames) and `bridge.cut_peers` over tcp or CurveZMQ (ZeroMQ, msgpack), with the run's token
and receive timeouts; this module is the loop, independent of the transport.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any, Protocol

NEVER = (1 << 63) - 1  # no event, no message


@dataclasses.dataclass(frozen=True)
class PeerReport:
    """What one other worker said at a barrier."""

    group: int
    next_ns: int  # its next event before this barrier's deliveries, NEVER if none
    min_arrival: int  # the least arrival time of every message it sent in the window, NEVER if none
    batch: bytes  # its messages for this worker (PhantoraNetwork::CutDeliver's bytes)
    release_later: int = NEVER  # least ns a release it causes lands at, after its dependency's completion ns
    release_same: int = NEVER  # ... in its dependency's completion ns
    next_key: tuple[int, ...] = ()  # a lockstep round's: its next event's (ns, schedTs, node, count), () if none
    sample_from: int = NEVER  # queue sampling: the ns its sampling began at, NEVER if not (or off)
    idle: int = NEVER  # queue sampling: the ns its last flow left, NEVER while it has flows
    react_bound: int = NEVER  # stepped workers: the last ns to run through before a reacting flow it starts may end
    react_stop: int = NEVER  # ... the least end + reaction of a reacting flow completed in it (`reacting`)
    output: int = 0  # the least arrival of anything it may send from now on (`CutOutputBound`), 0 if not told
    left: int = 0  # a run to the last completion: the flows it completes still in flight
    finish: int = -1  # ... a lower bound on the last completion's ns (`CutFinishBound`; -1: none)


class Peers(Protocol):
    """The other workers of the partition."""

    def exchange(
        self,
        seq: int,
        next_ns: int,
        min_arrival: int,
        batches: Mapping[int, bytes],
        releases: tuple[int, int] = (NEVER, NEVER),
        key: tuple[int, ...] = (),
        sampling: tuple[int, int] = (NEVER, NEVER),
        react: tuple[int, int] = (NEVER, NEVER),
        output: int = 0,
        finish: tuple[int, int] = (0, -1),
    ) -> list[PeerReport]:
        """Send each other worker its batch with our next time, least arrival, release bounds (later, same), our
        queue sampling (period start, idle since), our reacting flows' bound and stop (stepped workers), our earliest
        output (0: none told), in a run to the last completion our flows in flight and their bound, and, in a
        lockstep round, our next event's key; return every other worker's report for barrier `seq` (raises naming
        the worker that does not answer in time)."""
        ...


@dataclasses.dataclass
class WindowStats:
    """A worker's count of its windows and where its time went."""

    windows: int = 0  # windows run (barriers after running events)
    exchanges: int = 0  # barriers, the initial one of each run included
    bytes_out: int = 0  # message bytes sent to other workers
    run_cpu_s: float = 0.0  # CPU in ns-3 (CutRunBefore)
    exchange_wall_s: float = 0.0  # wall time in the exchanges (waiting for the slowest worker included)
    lockstep_rounds: int = 0  # rounds of one ns run one worker at a time (zero-delay releases across workers)
    ended_by: dict[str, int] = dataclasses.field(default_factory=dict)  # windows by what ended them (`why_end`)
    widths: dict[str, int] = dataclasses.field(default_factory=dict)  # windows by width in ns (`width_bucket`)

    def count(self, why: str, width: int) -> None:
        """Count one window: what ended it and its width."""
        self.ended_by[why] = self.ended_by.get(why, 0) + 1
        bucket = width_bucket(width)
        self.widths[bucket] = self.widths.get(bucket, 0) + 1


def width_bucket(width: int) -> str:
    """A window's width in ns as a decade: "1", "2-9", "10-99", ... (a lockstep round counts 0)."""
    if width <= 1:
        return str(max(width, 0))
    lo = 10 ** (len(str(width)) - 1)
    return f"{max(lo, 2)}-{10 * lo - 1}"


def _next(net: Any) -> int:
    t = int(net.NextEventTime())
    return NEVER if t < 0 else t


def _releases(net: Any, floor_ns: int) -> tuple[int, int]:
    later, same = (int(x) for x in net.CutReleaseBounds(floor_ns))
    return (NEVER if later < 0 else later, NEVER if same < 0 else same)


BEFORE, THROUGH, LOCKSTEP = "before", "through", "lockstep"


# what ended a window (WindowStats.ended_by)
LOOKAHEAD, RELEASE_LATER, RELEASE_SAME = "lookahead", "release after", "release in"
LOCKSTEP_NS, UNTIL = "lockstep", "until"
OUTPUT = "earliest output"  # every worker's next send across a cut arrives later than the lookahead from the start
REACT = "reacting flow"  # stepped workers: the driver may hand over a flow once a flow it reacts to ends
SAMPLING_START = "sampling start"  # one ns while no worker's queue sampling has begun (`run_windows`' cap)
LAST = "last completion"  # a run to the last completion: no further than the flows in flight may all end


def why_end(glob: int, lookahead_ns: int, later: int, same: int, end: int, how: str, reach: int = 0) -> str:
    """What set the end of the window from `glob` that `window_end` gave: the lookahead, the workers' earliest
    output past it (`reach`), a release landing after its dependency's completion ns (`later`), one that may land
    in it (`same`), a lockstep round."""
    if how == LOCKSTEP:
        return LOCKSTEP_NS
    if how == THROUGH:
        return RELEASE_SAME if same != NEVER and max(same, glob) == end else RELEASE_LATER
    if end == glob + lookahead_ns:
        return LOOKAHEAD
    if end == reach:
        return OUTPUT
    return RELEASE_LATER


def window_end(
    glob: int, lookahead_ns: int, later: int, same: int, through: int, cap: int = NEVER, reach: int = 0
) -> tuple[int, str]:
    """How the window from `glob` ends: (ns, BEFORE) runs every event before ns; (ns, THROUGH) also the events of
    ns scheduled before it (`CutRunThrough`); (glob, LOCKSTEP) runs the rest of ns glob in lockstep rounds, one
    worker at a time (`CutRunLeast`). `later` / `same`: the least ns a release lands at after / in its
    dependency's completion ns (bounds below `glob` count as `glob`: nothing runs before it); `through`: the ns
    whose events scheduled before it ran in the last window (then a release may still come from an event
    scheduled in that ns, in a zero-delay chain: the rest of it runs in lockstep); `cap`: end before it at the
    latest; `reach`: no message sent from now on arrives before it (the least earliest output over the workers,
    `CutOutputBound`; NEVER: none will be sent), so the window may run past the lookahead to it."""
    code = min(2 * max(glob + lookahead_ns, reach), 2 * cap)  # 2 x ns: before ns; 2 x ns + 1: through ns
    if later != NEVER:
        code = min(code, 2 * later if later > glob else 2 * glob + 1)
    if same != NEVER:
        code = min(code, 2 * max(same, glob) + 1)
    if code == 2 * glob + 1 and through == glob:
        return glob, LOCKSTEP
    return code // 2, THROUGH if code % 2 else BEFORE


def _lockstep_round(net: Any, peers: Peers, group: int, glob: int, stats: WindowStats, left: int = 0) -> None:
    """One lockstep round of ns `glob`: every worker says the key of its next event (after this barrier's
    deliveries); the one with the least at `glob` runs its events of `glob` while they order before every other
    worker's, stopping after one that releases a flow elsewhere (`CutRunLeast`): one engine's order, one worker
    at a time. Its records carry the round (every worker counts the same exchanges). `left` (a run to the last
    completion): the flows in flight anywhere; the running worker stops right after the last of them."""
    mine = tuple(int(x) for x in net.CutNextKey())
    t0 = time.perf_counter()
    reports = peers.exchange(stats.exchanges, NEVER, NEVER, {}, key=mine)
    stats.exchange_wall_s += time.perf_counter() - t0
    stats.exchanges += 1
    net.CutLockstep(glob, stats.exchanges)
    keys = {r.group: r.next_key for r in reports}
    keys[group] = mine
    at = {g: tuple(k[1:]) for g, k in keys.items() if k and k[0] == glob}
    if at and min(at, key=lambda g: at[g]) == group:
        others = [k for g, k in at.items() if g != group]
        if left:
            net.CutFinishAfter(left)
        net.CutRunLeast(glob, list(min(others)) if others else [])
    stats.lockstep_rounds += 1


def warm_up(net: Any, group: int, groups: int) -> None:
    """Call each window method of `net` once, doing nothing (cppyy's first-call cost, kept out of the figures; the
    C++ loop's own is `phantora.netsim.cut_native.warm_up`)."""
    net.CutRunBefore(0)
    net.CutReleaseBounds(0)
    net.CutShareBounds(-1)
    net.CutReacting([])
    net.CutReactBounds(0)
    net.CutNextKey()
    for g in range(groups):
        if g != group:
            net.CutTakeOutbox(g)
    net.CutTakeMinArrival()
    net.CutOutputBound()
    net.CutDeliver(b"")
    net.CutAdvanceTo(net.Now())
    net.NextEventTime()
    net.CutSamplingFrom()
    net.CutIdleSince()
    net.CutSampling(-1, True, -1, NEVER)  # (the first barrier says whether the others are busy)
    net.CutFinishBound()
    net.CutFinishAfter(0)


def _react(net: Any, floor_ns: int) -> tuple[int, int]:
    bound, stop = (int(x) for x in net.CutReactBounds(floor_ns))
    return (NEVER if bound < 0 else bound, NEVER if stop < 0 else stop)


def _finish(net: Any) -> tuple[int, int]:
    left, bound = (int(x) for x in net.CutFinishBound())
    return left, bound


def _output(net: Any) -> int:
    t = int(net.CutOutputBound())
    return NEVER if t < 0 else t


def _sampling(net: Any) -> tuple[int, int]:
    t, idle = int(net.CutSamplingFrom()), int(net.CutIdleSince())
    return (NEVER if t < 0 else t, NEVER if idle < 0 else idle)


def run_windows(
    net: Any,
    peers: Peers,
    *,
    group: int,
    groups: int,
    lookahead_ns: int,
    until: int | None,
    stats: WindowStats,
    sampling: bool = False,
    reacting: bool = False,
    finish: bool = False,
) -> int | None:
    """This worker's part of one engine's RunUntil(until) (every event at or before `until`, then the clock at
    `until`); `until` None: run until no worker has an event left and no message is in flight.

    `net`: the worker's PhantoraNetwork. Every worker of the partition must make the same calls. `sampling`: the
    workers sample queues (recorder.QueueSampleInterval > 0). `reacting` (stepped workers, whose driver set
    `CutReacting`): each window also ends by the least reacting flow's bound + reaction over every worker (the
    sender's worker bounds it), so no worker runs past a flow the driver may hand over because of one, and once
    one completes (its receiver's worker says so at the next barrier) the run stops at its end + reaction instead
    of `until`: that ns is returned (None: it ran to `until`). `finish` (with `until` None, a replay's drain; with
    `until`, a stepped drain's round to the driver's bound on the last completion), as one engine's drain, which
    stops right after the last completion's event, its last ACKs still on their way: each report also
    carries the flows the worker completes still in flight and a lower bound on the last completion
    (`CutFinishBound`); a window runs no further than through the greatest of those bounds and its start (the
    last completion is at or after both), and the run stops at the barrier where no flow is left: the window
    that ran the last completion stops right after that completion's event, as one engine does.
    """
    if lookahead_ns <= 0:
        raise ValueError(f"partition worker {group}: lookahead must be > 0 ns, got {lookahead_ns}")
    if getattr(peers, "native", False):  # local stream sockets: the same loop in C++ (phantora.netsim.cut_native)
        return peers.run_native(net, lookahead_ns=lookahead_ns, until=until, stats=stats,  # type: ignore[attr-defined]
                                sampling=sampling, reacting=reacting, finish=finish)  # fmt: skip
    batches: dict[int, bytes] = {}
    min_arrival = NEVER
    start = through = lock = -1  # the last window's start; the ns it ran through (CutRunThrough); in lockstep
    sampled = NEVER  # queue sampling: the ns the period began at in some worker, once known
    opening = True  # the run's first barrier (a period known there began before it)
    stopped = None  # reacting: the ns a reacting flow's completion stops the run at
    finishing = finish
    while True:
        mine = _next(net)
        later, same = _releases(net, max(start, 0))
        samp = _sampling(net) if sampling else (NEVER, NEVER)
        bound, stop = _react(net, max(start, 0)) if reacting else (NEVER, NEVER)
        reach = _output(net)
        fin = _finish(net) if finishing else (0, -1)
        t0 = time.perf_counter()
        more: dict[str, Any] = {"react": (bound, stop)} if reacting else {}
        if finishing:
            more["finish"] = fin
        reports = peers.exchange(
            stats.exchanges, mine, min_arrival, batches, (later, same), sampling=samp, output=reach, **more
        )
        stats.exchange_wall_s += time.perf_counter() - t0
        stats.exchanges += 1
        glob = min(mine, min_arrival)
        for r in sorted(reports, key=lambda r: r.group):
            if r.batch:
                net.CutDeliver(r.batch)
            glob = min(glob, r.next_ns, r.min_arrival)
            later, same = min(later, r.release_later), min(same, r.release_same)
            bound, stop = min(bound, r.react_bound), min(stop, r.react_stop)
            reach = min(reach, r.output)
        left, last = fin[0] + sum(r.left for r in reports), max([fin[1], *(r.finish for r in reports)])
        if stop != NEVER and (until is None or stop < until):
            until = stopped = stop
        idle = max([samp[1], *(r.idle for r in reports)])  # every worker's last flow left by then (NEVER: not)
        if sampling:
            known, sampled = sampled, min([sampled, samp[0], *(r.sample_from for r in reports)])
            if known == NEVER and sampled != NEVER and not opening:  # begun in the last window: its joiners' first
                glob = min(glob, sampled)
            busy = any(r.idle == NEVER for r in reports)
            if net.CutSampling(-1 if sampled == NEVER else sampled, busy, -1 if idle == NEVER else idle, glob):
                sampled = NEVER  # the period ended (the next flow start begins another)
        opening = False
        if glob == NEVER or (until is not None and glob > until) or (finishing and left == 0):
            break
        # flows and no period start known: one ns (see the docstring)
        cap = glob + 1 if sampling and sampled == NEVER and idle == NEVER else NEVER
        # a reacting flow not complete ends no earlier than glob: run through its bound (at least glob) + reaction
        react_cap = NEVER if bound == NEVER else max(bound, glob) + 1
        # the last completion is at or after every bound and glob (flows are still in flight): run the events before
        # the greatest bound; once at it, its ns in lockstep rounds, which stop at the last completion's event
        finish_lock = finishing and last <= glob
        finish_cap = last if finishing and not finish_lock else NEVER
        end, how = window_end(glob, lookahead_ns, later, same, through, min(cap, react_cap, finish_cap), reach)
        why = why_end(glob, lookahead_ns, later, same, end, how, reach)
        if how == BEFORE and end == cap and why != LOOKAHEAD:
            why = SAMPLING_START
        elif how == BEFORE and end == react_cap and why != LOOKAHEAD:
            why = REACT
        elif how == BEFORE and end == finish_cap and why != LOOKAHEAD:
            why = LAST
        if lock == glob:
            how, why = LOCKSTEP, LOCKSTEP_NS  # a ns begun in lockstep ends in it (its records carry rounds)
        elif finish_lock:
            how, why = LOCKSTEP, LAST
        # (a finishing lockstep round stays one: glob <= until, and it stops at the last completion's event)
        if until is not None and end > until and not (finishing and how == LOCKSTEP):
            end, how, why = until + 1, BEFORE, UNTIL
        end = min(end, NEVER)
        start = glob
        through = end if how == THROUGH else glob if how == LOCKSTEP else -1
        c0 = time.process_time()
        if how == LOCKSTEP:
            lock = glob
            _lockstep_round(net, peers, group, glob, stats, left if finishing else 0)
        elif how == THROUGH:
            net.CutRunThrough(end)
        else:
            net.CutRunBefore(end)
        stats.run_cpu_s += time.process_time() - c0
        stats.windows += 1
        stats.count(why, 0 if how == LOCKSTEP else end - glob + (how == THROUGH))
        net.CutShareBounds(glob)  # completion bounds of flows another worker completes, in the outboxes
        batches = {}
        for g in range(groups):
            if g != group:
                out = bytes(net.CutTakeOutbox(g))
                batches[g] = out
                stats.bytes_out += len(out)
        arrival = int(net.CutTakeMinArrival())
        min_arrival = NEVER if arrival < 0 else arrival
    if until is not None:
        net.CutAdvanceTo(until)
    return stopped
