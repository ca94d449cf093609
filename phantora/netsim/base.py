"""The `NetworkSimulator` interface that every network engine implements.

Time is integer nanoseconds everywhere. A flow moves `size` bytes from endpoint node `src` to
endpoint node `dst`. A flow with `deps` starts when all of them have completed (and not before
the time it was submitted at), plus its own `delay_ns`. Completion means the last byte has
arrived at `dst`.

The bridge, the replay tool and the runtime only ever talk to engines through this interface: the core
protocol below, and its declared optional part, the observers of `phantora.netsim.observe`
(`channels()`, `fabric()`), which an engine returns or declines with None.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from phantora.errors import InputError, PhantoraError

if TYPE_CHECKING:
    from phantora.netsim.observe import ChannelObserver, FabricObserver
    from phantora.topology.model import Topology

INF_NS = 1 << 62  # "never": no time limit (fits int64 on the wire)


class CausalityError(PhantoraError, AssertionError):
    """Something was stamped earlier than the engine's current time (the network never rolls back)."""


@dataclass(frozen=True, slots=True)
class Flow:
    """A point-to-point transfer, possibly waiting on other flows (a DAG edge set)."""

    id: int
    src: int  # endpoint node id
    dst: int  # endpoint node id
    size: int  # bytes
    deps: tuple[int, ...] = ()  # flow ids that must complete first
    delay_ns: int = 0  # extra wait after the deps (e.g. a reduction kernel)
    tag: str = ""  # who owns it, e.g. "coll7/ring/ch0/step3"
    priority: int = 3  # traffic class (HPCC priority group)
    key: int | None = None  # ECMP hash key; defaults to id
    loss_budget: int = 0  # DLCP: payload bytes the network may drop for good (0 = lossless; packet engine only)
    rate_bps: int = 0  # per-flow rate cap, payload bits/s (an NCCL channel's throughput limit); 0 = no cap
    conn: int = 0  # connection: flows with the same id are messages on one queue pair (packet engine); 0 = its own
    queue: int = 0  # flows of one queue (0 = none) go on the wire one at a time, in release order (flow engine)
    via_nic: bool = False  # leaves through its NICs even between GPUs of one NVSwitch (NCCL's NET transport)

    def with_deps(self, deps: tuple[int, ...], delay_ns: int | None = None) -> Flow:
        """This flow with other deps (and delay): `dataclasses.replace`, at half the cost of `Flow(...)`: the slots are
        set one by one, not through the frozen dataclass's `__init__` (a decomposition worker gates and re-deps
        tens of thousands of flows)."""
        return self._remade(self.id, deps, self.delay_ns if delay_ns is None else delay_ns, self.tag)

    def moved(self, id: int, deps: tuple[int, ...], tag: str) -> Flow:
        """This flow with another id, deps and tag, as `with_deps` makes it (a collective's DAG copied to a repeat's
        ids: `collectives.dag_memo`)."""
        return self._remade(id, deps, self.delay_ns, tag)

    def with_ends(self, src: int, dst: int) -> Flow:
        """This flow from `src` to `dst`: `dataclasses.replace`, as `with_deps` makes it."""
        return flow_of(self.id, src, dst, self.size, self.deps, self.delay_ns, self.tag, self.priority, self.key,
                       self.loss_budget, self.rate_bps, self.conn, self.queue, self.via_nic)  # fmt: skip

    def _remade(self, id: int, deps: tuple[int, ...], delay_ns: int, tag: str) -> Flow:
        return flow_of(id, self.src, self.dst, self.size, deps, delay_ns, tag, self.priority, self.key,
                       self.loss_budget, self.rate_bps, self.conn, self.queue, self.via_nic)  # fmt: skip


_NEW = object.__new__
_FLOW_FIELDS = (
    *("id", "src", "dst", "size", "deps", "delay_ns", "tag", "priority", "key", "loss_budget", "rate_bps", "conn"),
    *("queue", "via_nic"),
)
if tuple(f.name for f in fields(Flow)) != _FLOW_FIELDS:  # (`Flow.with_deps` sets each of them)
    raise ImportError(f"phantora.netsim.base: Flow's fields are no longer {_FLOW_FIELDS}: update Flow.with_deps")
_FLOW_SET = tuple(getattr(Flow, name).__set__ for name in _FLOW_FIELDS)


class _Slots:
    """A `Flow`'s slots, not frozen: a flow is made as one of these, its slots set by plain stores, then made a `Flow`
    by setting its `__class__`, which CPython allows between classes of one slot layout (checked below). About a
    fifth of `Flow(...)`'s instructions and half of setting a frozen flow's slots one by one (callgrind); the
    planners make one a message (`collectives.dag.DagBuilder`, `collectives.dag_memo`)."""

    __slots__ = _FLOW_FIELDS

    def __init__(
        self,
        id: int,
        src: int,
        dst: int,
        size: int,
        deps: tuple[int, ...],
        delay_ns: int,
        tag: str,
        priority: int,
        key: int | None,
        loss_budget: int,
        rate_bps: int,
        conn: int,
        queue: int,
        via_nic: bool,
    ) -> None:
        self.id = id
        self.src = src
        self.dst = dst
        self.size = size
        self.deps = deps
        self.delay_ns = delay_ns
        self.tag = tag
        self.priority = priority
        self.key = key
        self.loss_budget = loss_budget
        self.rate_bps = rate_bps
        self.conn = conn
        self.queue = queue
        self.via_nic = via_nic


def _check_slots() -> None:
    """`_Slots` made a `Flow` is the `Flow` of the same fields (else the import fails, naming why)."""
    probe: Any = _Slots(1, 2, 3, 4, (5,), 6, "t", 7, 8, 9, 10, 11, 12, True)
    try:
        probe.__class__ = Flow
    except TypeError as exc:
        raise ImportError(f"phantora.netsim.base: _Slots no longer has Flow's slot layout ({exc})") from None
    if probe != Flow(1, 2, 3, 4, (5,), 6, "t", 7, 8, 9, 10, 11, 12, True):
        raise ImportError("phantora.netsim.base: _Slots made a Flow is not the Flow of its fields")


_check_slots()


def flow_of(
    id: int,
    src: int,
    dst: int,
    size: int,
    deps: tuple[int, ...],
    delay_ns: int,
    tag: str,
    priority: int,
    key: int | None,
    loss_budget: int,
    rate_bps: int,
    conn: int,
    queue: int,
    via_nic: bool,
) -> Flow:
    """`Flow(...)` of every field, in order, at a fifth of the cost (`_Slots`)."""
    g: Any = _Slots(id, src, dst, size, deps, delay_ns, tag, priority, key, loss_budget, rate_bps, conn, queue, via_nic)
    g.__class__ = Flow
    return g


def new_flow(
    id: int,
    src: int,
    dst: int,
    size: int,
    deps: tuple[int, ...],
    delay_ns: int,
    tag: str,
    key: int | None = None,
    conn: int = 0,
    queue: int = 0,
) -> Flow:
    """`Flow(id, src, dst, size, deps, delay_ns, tag, key=key, conn=conn, queue=queue)` at a fifth of the cost
    (`_Slots`)."""
    g: Any = _Slots(id, src, dst, size, deps, delay_ns, tag, 3, key, 0, 0, conn, queue, False)
    g.__class__ = Flow
    return g


def moved_flows(
    flows: Sequence[Flow], delta: int, prefix: str, tails: Sequence[str], gate: tuple[int, ...]
) -> list[Flow]:
    """`flows` with their ids and deps moved by `delta`, tag i ``prefix + tails[i]``, and `gate` as the deps of those
    that have none: `Flow.moved` for each, in one loop (a collective's DAG copied to a repeat's ids,
    `collectives.dag_memo`)."""
    make, cls, shift = _Slots, Flow, delta.__add__
    out: list[Flow] = []
    put = out.append
    for f, tail in zip(flows, tails, strict=True):
        deps = f.deps
        moved = tuple(map(shift, deps)) if deps else gate
        g: Any = make(f.id + delta, f.src, f.dst, f.size, moved, f.delay_ns, prefix + tail, f.priority, f.key,
                      f.loss_budget, f.rate_bps, f.conn, f.queue, f.via_nic)  # fmt: skip
        g.__class__ = cls
        put(g)
    return out


@dataclass(frozen=True, slots=True)
class Completion:
    """When a flow actually started (its deps released) and finished (last byte received)."""

    flow_id: int
    start_ns: int
    end_ns: int
    size: int
    src: int
    dst: int
    tag: str = ""
    lost: tuple[tuple[int, int], ...] = ()  # DLCP: (offset, bytes) of the flow never delivered, merged, in order

    @property
    def lost_bytes(self) -> int:
        """Bytes of this flow the network dropped for good (a loss-tolerant flow's holes)."""
        return sum(n for _, n in self.lost)


Lost = tuple[tuple[int, int], ...]
_COMPLETION_FIELDS = ("flow_id", "start_ns", "end_ns", "size", "src", "dst", "tag", "lost")
if tuple(f.name for f in fields(Completion)) != _COMPLETION_FIELDS:  # (`completion` sets each of them)
    raise ImportError(
        f"phantora.netsim.base: Completion's fields are no longer {_COMPLETION_FIELDS}: update completion"
    )
_COMPLETION_SET = tuple(getattr(Completion, name).__set__ for name in _COMPLETION_FIELDS)


def completion(
    flow_id: int, start: int, end: int, size: int, src: int, dst: int, tag: str = "", lost: Lost = ()
) -> Completion:
    """`Completion(flow_id, start, end, size, src, dst, tag, lost)` at about half the cost: the slots are set one by
    one, not through the frozen dataclass's `__init__` (engines build one a flow; a decomposition worker's ns-3
    side builds each fabric completion twice, once with its first packet's start, once with its post)."""
    c = _NEW(Completion)
    s_id, s_start, s_end, s_size, s_src, s_dst, s_tag, s_lost = _COMPLETION_SET
    s_id(c, flow_id)
    s_start(c, start)
    s_end(c, end)
    s_size(c, size)
    s_src(c, src)
    s_dst(c, dst)
    s_tag(c, tag)
    s_lost(c, lost)
    return c


@runtime_checkable
class NetworkSimulator(Protocol):
    """What the coordinator, replay and runtime need from a network engine."""

    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows that become eligible at time `at` (>= now(); engines assert it)."""
        ...

    def advance(self, until: int) -> list[Completion]:
        """Run the network to `until` ns and return the completions in (end_ns, flow_id) order."""
        ...

    def next_event_time(self) -> int | None:
        """The earliest time anything can happen inside the engine, or None if idle."""
        ...

    def now(self) -> int:
        """The engine's current time in ns."""
        ...

    def in_flight(self) -> int:
        """Flows submitted but not yet completed."""
        ...

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion. Raise past limit_ns."""
        ...

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """Run towards `until` (INF_NS: no limit) but stop after the first event time at which a flow in
        `watch` completes; `earliest` is a lower bound on those completions. See `step_watching`."""
        ...

    def stats(self) -> dict[str, object]:
        """Engine-specific counters (events, recomputations, drops, pauses ...)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...

    def keepalive(self) -> None:
        """Called about once a second by a caller that is busy elsewhere; a remote engine tells its server."""
        ...

    def channels(self) -> ChannelObserver | None:
        """Per-channel traffic, if this engine observes it here (None for a remote engine)."""
        ...

    def fabric(self) -> FabricObserver | None:
        """PFC, queues, drops, CNPs and ECN marks, if this engine simulates packets here (the ns-3 engine)."""
        ...


def step_watching(
    sim: NetworkSimulator, until: int, watch: Collection[int], earliest: int | None = None
) -> list[Completion]:
    """`advance_watching` for an engine that can only advance: one event time at a time.

    After a jump to just before `earliest`, the engine is stepped with `next_event_time` until a watched
    flow completes or `until` is reached. Returns the completions in (end_ns, flow_id) order; after an
    early stop, now() is the time of the watched completion. With nothing watched it runs to `until`
    (nothing at all when there is no limit).
    """
    if not watch:
        return sim.advance(until) if until < INF_NS else []
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


class _Stepper(Protocol):
    def advance_to_completion(self, until: int) -> list[Completion]: ...
    def now(self) -> int: ...
    def in_flight(self) -> int: ...


def advance_by_completions(sim: _Stepper, until: int) -> list[Completion]:
    """`advance(until)` of an engine that runs to its next completion: every event at or before `until`."""
    done: list[Completion] = []
    while True:
        got = sim.advance_to_completion(until)
        done.extend(got)
        if not got and sim.now() >= until:
            return done


def watch_by_completions(sim: _Stepper, until: int, watch: Collection[int]) -> list[Completion]:
    """`advance_watching` of such an engine: towards `until` (INF_NS: no limit), returning after the first ns at
    which a flow in `watch` completes."""
    if not watch:
        return advance_by_completions(sim, until) if until < INF_NS else []
    done: list[Completion] = []
    while True:
        got = sim.advance_to_completion(until)
        done.extend(got)
        if any(c.flow_id in watch for c in got) or (not got and (until >= INF_NS or sim.now() >= until)):
            return done


def drain_by_completions(sim: _Stepper, limit_ns: int | None = None) -> list[Completion]:
    """`drain` of such an engine: until nothing is in flight; now() ends at the last completion. Raise past
    `limit_ns`, or when flows wait on flows that never complete."""
    limit = INF_NS if limit_ns is None else limit_ns
    done: list[Completion] = []
    while sim.in_flight():
        got = sim.advance_to_completion(limit)
        done.extend(got)
        if not got:
            left = sim.in_flight()
            if limit < INF_NS and sim.now() >= limit:
                raise PhantoraError(f"the network did not drain by {limit} ns: {left} flows still in flight")
            raise PhantoraError(f"{left} flows can never start: they wait on flows that never complete")
    return done


class RunsByCompletion:
    """`advance`, `advance_watching` and `drain` for an engine whose one primitive is `advance_to_completion`
    (with `now` and `in_flight`): the NIC-latency and decomposed engines."""

    def advance(self: _Stepper, until: int) -> list[Completion]:
        """Run every event at or before `until`; now() becomes `until`."""
        return advance_by_completions(self, until)

    def advance_watching(
        self: _Stepper, until: int, watch: Collection[int], earliest: int | None = None
    ) -> list[Completion]:
        """Run towards `until` (INF_NS: no limit); return after the first ns at which a flow in `watch` completes."""
        return watch_by_completions(self, until, watch)

    def drain(self: _Stepper, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion. Raise past limit_ns."""
        return drain_by_completions(self, limit_ns)


def watch_sample(ids: Sequence[int], samples: int = 200) -> set[int]:
    """About `samples` of the flows `ids`, evenly spread, the last one included (the display keeps moving to the
    end): the flows `drain_observed` stops at."""
    stride = max(1, len(ids) // samples)
    return set(list(ids)[::-1][::stride])


@runtime_checkable
class RunsWholeDag(Protocol):
    """An engine that runs every flow submitted so far to the end in its first run call, reporting nothing until
    it returns (the partition workers): a progress display can show no rate or ETA before that."""

    def run_by(self) -> str:
        """Who runs the DAG, for the display: "4 partition workers"."""
        ...


class Observed(set[int]):
    """Flows watched only to report progress (`drain_observed`): their caller submits nothing when one completes,
    so an engine need not stop its workers there (`HybridSimulator.reacts_to`); it still returns at each."""


def drain_observed(
    sim: NetworkSimulator, ids: Sequence[int], tick: Callable[[list[Completion]], None], samples: int = 200
) -> list[Completion]:
    """`sim.drain()`, handing control back to `tick` each time one of about `samples` of the flows `ids`
    completes (for a progress display). The engine runs the very events one drain() runs, in the same
    order: it stops only between two event times (`advance_watching`), never mid-way, and now() ends at
    the last completion. Returns the completions in (end_ns, flow_id) order, as drain() does."""
    watch = Observed(watch_sample(ids, samples))
    done: list[Completion] = []
    while watch and sim.in_flight():
        got = sim.advance_watching(INF_NS, watch)
        done.extend(got)
        tick(got)
        hit = watch.intersection(c.flow_id for c in got)
        if not hit:
            break  # idle, or nothing more can run: drain() below finishes or says why
        watch -= hit
    rest = sim.drain()
    done.extend(rest)
    tick(rest)
    return done


def check_flow_batch(flows: Sequence[Flow], topology: Topology, known: Callable[[int], bool]) -> set[int]:
    """What every engine checks before accepting a batch; returns the batch's ids.

    Unique ids (`known(id)` says an earlier batch used it), endpoints of `topology`, sizes, delays and rate
    caps >= 0, deps on this batch or on known flows, and no dependency cycle. Errors name the flow.
    """
    ends = topology.endpoint_set
    ids: set[int] = set()
    checked: set[int] = set()  # the batch's ids so far and the deps found known: a wide deps list is checked at C speed
    ordered = True  # every dep so far on an earlier flow of the batch or a known one: no cycle possible
    passed: tuple[int, ...] = ()  # the last deps list found in `checked` (it stays there: `checked` only grows)
    for f in flows:
        if f.id in ids or known(f.id):
            raise InputError(f"flow {f.id}: duplicate flow id", field="id")
        deps = f.deps
        if ordered and deps is not passed and deps != passed:  # (an all-to-all's dependents share one wide list)
            if not checked.issuperset(deps):
                for d in deps:
                    if d not in checked:
                        if not known(d):
                            ordered = False
                            break
                        checked.add(d)
            if ordered:
                passed = deps
        ids.add(f.id)
        checked.add(f.id)
        if f.src not in ends or f.dst not in ends:
            end = f.src if f.src not in ends else f.dst
            raise InputError(f"flow {f.id}: node {end} is not an endpoint of '{topology.name}'", field="src/dst")
        if f.size < 0:
            raise InputError(f"flow {f.id}: size must be >= 0, got {f.size}", field="size")
        if f.delay_ns < 0:
            raise InputError(f"flow {f.id}: delay_ns must be >= 0, got {f.delay_ns}", field="delay_ns")
        if f.rate_bps < 0:
            raise InputError(f"flow {f.id}: rate_bps must be >= 0 (0 = no cap), got {f.rate_bps}", field="rate_bps")
        if not 0 <= f.conn < 1 << 64:
            raise InputError(f"flow {f.id}: conn must be a 64-bit id >= 0 (0 = none), got {f.conn}", field="conn")
        if not 0 <= f.queue < 1 << 64:
            raise InputError(f"flow {f.id}: queue must be a 64-bit id >= 0 (0 = none), got {f.queue}", field="queue")
    if ordered:  # (the usual batch: deps before their dependents) nothing unknown, and no cycle
        return ids
    indeg = dict.fromkeys(ids, 0)
    succ: dict[int, list[int]] = {}
    for f in flows:
        for d in dict.fromkeys(f.deps):
            if d in ids:
                indeg[f.id] += 1
                succ.setdefault(d, []).append(f.id)
            elif not known(d):
                raise InputError(f"flow {f.id} depends on unknown flow {d}", field="deps")
    ready = [i for i, k in indeg.items() if k == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in succ.get(i, ()):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if seen < len(ids):
        cyc = sorted(i for i, k in indeg.items() if k)[:5]
        raise InputError(f"dependency cycle among flows {', '.join(map(str, cyc))}", field="deps")
    return ids
