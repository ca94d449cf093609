"""`partition=N` as an engine of the commands (issue 38): one DAG of flows, run to its end on N partition workers.

The workers (`bridge.cut_pool`, started through the `runner` the command passes, as decomposition gets its
spawner) run every flow submitted before the first run call, through the ns of the last completion (one engine's
drain stops right after that completion, its last ACKs still on their way), and their records come back merged as
one keyed engine's. That is what `phantora replay` does: it submits the whole DAG of a workload or an execution
graph, then drains it. The completions are handed out in (end, flow id) order, to the time each call asks for; what a
batch run cannot give is refused, naming why: flows submitted once the run has started (a live run, nccl-tests'
call after call), a run limit (`drain(limit_ns)`). Queue samples (queue_sample_ns > 0) are sampled by owner, each worker
the switches it runs at one engine's instants, and merged as one engine's (`bridge.cut_pool`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from types import MethodType
from typing import Any, Generic, TypeVar, overload

from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.effective import EffectiveSettings
from phantora.netsim.observe import CnpEvent, Drop, EcnMark, FlowTransport, PfcEvent, QueueSample, Trim
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.packet_summary import channel_usage
from phantora.progress import Beat
from phantora.topology.model import Topology

# (topology, config, batches, until, dports, to_last_completion) -> bridge.cut_pool.PartitionResult
Runner = Callable[..., Any]
R = TypeVar("R")


class _Records(Generic[R]):
    """A `FabricObserver` record accessor of `PartitionedSimulator`: a copy of the merged result's `field`. It is
    a method: read through an instance it is bound (`sim.drops()`), through the class it is the plain accessor
    (`PartitionedSimulator.drops(sim)`), and `doc` is its docstring either way."""

    def __init__(self, field: str, doc: str) -> None:
        self.field = field
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.__name__, self.__qualname__ = name, f"{owner.__qualname__}.{name}"

    def __call__(self, sim: PartitionedSimulator) -> list[R]:
        return list(getattr(sim._res, self.field))

    @overload
    def __get__(self, sim: None, owner: type | None = None) -> _Records[R]: ...

    @overload
    def __get__(self, sim: PartitionedSimulator, owner: type | None = None) -> Callable[[], list[R]]: ...

    def __get__(self, sim: PartitionedSimulator | None, owner: type | None = None) -> Any:
        return self if sim is None else MethodType(self, sim)


class PartitionedSimulator:
    """A `NetworkSimulator` over partition workers, for a DAG submitted whole before it runs."""

    def __init__(self, topology: Topology, config: PacketConfig, runner: Runner) -> None:
        self.topology, self.config, self._runner = topology, config, runner
        self._batches: list[tuple[int, list[Flow]]] = []
        self._res: Any = None  # the merged PartitionResult, once run
        self._left: list[Completion] = []  # completions not handed out yet, (end, id) order
        self._now = 0
        self._effective: EffectiveSettings | None = None
        self.on_beat: Callable[[Beat], None] | None = None  # a progress display's: the workers' beats, merged ...
        self.beat_s = 0.5  # ... at most this often (`phantora.netsim.heartbeat.attach_beats`)

    @property
    def beat_source(self) -> PartitionedSimulator:
        """Itself: the runner passes the workers' beats on to `on_beat` while they run the DAG."""
        return self

    # ----- NetworkSimulator -----------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        if self._res is not None:
            raise InputError(
                f"partition={self.config.partition}: the workers run one DAG of flows submitted before the run, to "
                "its end; flows submitted once it has started (a live run, nccl-tests' call after call) are not "
                "driven yet: use one engine (partition=0)",
                field="partition",
            )
        if flows:
            self._batches.append((at, list(flows)))
        self._now = max(self._now, at)

    def _run(self) -> None:
        if self._res is None:
            # a replay's drain: one engine stops after the ns of the last completion, its last ACKs on their way
            beats = {} if self.on_beat is None else {"on_beat": self.on_beat, "beat_s": self.beat_s}
            self._res = self._runner(self.topology, self.config, self._batches, None, None, True, **beats)
            self._left = list(self._res.completions)

    def _take(self, until: int) -> list[Completion]:
        self._run()
        n = 0
        while n < len(self._left) and self._left[n].end_ns <= until:
            n += 1
        got, self._left = self._left[:n], self._left[n:]
        if got:
            self._now = max(self._now, got[-1].end_ns)
        if until < INF_NS:
            self._now = max(self._now, until)
        return got

    def advance(self, until: int) -> list[Completion]:
        return self._take(until)

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """Up to the first end time at which a watched flow completes (all completions of that ns), else `until`."""
        self._run()
        hit = next((c.end_ns for c in self._left if c.end_ns <= until and c.flow_id in watch), None)
        return self._take(until if hit is None else hit)

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        if limit_ns is not None:
            raise InputError(
                f"partition={self.config.partition}: the workers run the DAG to its end, not to a limit "
                f"({limit_ns} ns)",
                field="partition",
            )
        return self._take(INF_NS)

    def next_event_time(self) -> int | None:
        if self._res is None:
            return min((at for at, _ in self._batches), default=None)
        return self._left[0].end_ns if self._left else None

    def now(self) -> int:
        return self._now

    def run_by(self) -> str:
        """`RunsWholeDag`: the workers run the DAG whole in the first run call."""
        return f"{self.config.partition} partition workers"

    def in_flight(self) -> int:
        if self._res is None:
            return sum(len(b) for _, b in self._batches)
        return len(self._left)

    def stats(self) -> dict[str, object]:
        if self._res is None:
            return {"partition": {"workers": self.config.partition}}
        return {**self._res.stats, "partition": partition_summary(self._res.workers, self._res.ties)}

    def close(self) -> None:
        self._left = []

    def keepalive(self) -> None:
        return None

    def channels(self) -> PartitionedSimulator | None:
        return self if self._res is not None else None

    fabric = channels

    # ----- FabricObserver: the merged records --------------------------------------------------
    def channel_usage(self, elapsed_ns: int | None = None) -> list[Any]:
        return channel_usage(self._res.channels, max(1, self._now if elapsed_ns is None else elapsed_ns))

    pfc_events = _Records[PfcEvent]("pfc", "Every PFC pause and resume frame, in time order (pfc.csv).")
    queue_samples = _Records[QueueSample](
        "queues", "Every switch's queue samples at one engine's instants (queues.csv)."
    )
    drops = _Records[Drop]("drops", "Every packet dropped (drops.csv; empty with `trace_drops` off).")
    trims = _Records[Trim](
        "trims", "Every loss-tolerant packet trimmed to its header (DLCP; empty with `trace_drops` off)."
    )
    cnp_events = _Records[CnpEvent]("cnps", "Every CNP, in time order (cnps.csv; empty with `trace_cnp` off).")
    ecn_mark_events = _Records[EcnMark](
        "marks", "Every CE mark, in time order (ecn_marks.csv; empty with `trace_ecn` off)."
    )

    def flow_transport(self) -> Mapping[int, FlowTransport]:
        return dict(self._res.transport)

    def effective(self) -> EffectiveSettings:
        if self._effective is None:
            self._effective = effective_settings(self.topology, self.config, self._res.effective)
        return self._effective


def effective_settings(topology: Topology, config: PacketConfig, pairs: Sequence[tuple[str, str]]) -> EffectiveSettings:
    """The first worker's EffectiveParams() pairs read as one engine's (the config as each worker ran it)."""
    ran = config.with_updates(ecmp_hash=config.ecmp_hash or topology.ecmp_hash)
    return EffectiveSettings.parse(ran, pairs)


# What the engine's `events` counts with partition workers (results.json says it beside the figure)
EVENTS_COUNTED = (
    "the workers' ns-3 events summed: each worker builds the whole fabric and runs its setup events "
    "(events_setup, every node's), so the sum has N - 1 times them more than one engine; the windows run with "
    "no event of their own, where each bounded run call of one engine runs a stop event (one engine's advance, "
    "its stops at completions), so one engine has those more; reuse_events_avoided, from recorded episodes' "
    "events, differs by the stop events inside them"
)


def partition_summary(workers: list[dict[str, Any]], ties: int) -> dict[str, Any]:
    """What summary.json (netsim) and the engine's stats say of the workers: how many, their windows (what ended
    them, their widths), messages, CPU, wall and peak memory, and the records of one ns from two workers, put in
    one engine's order by their events' keys (`phantora.netsim.record_order`)."""
    return {
        "workers": len(workers),
        "ties_by_key": ties,
        "windows": max((w["windows"] for w in workers), default=0),
        "message_bytes": sum(w["bytes_out"] for w in workers),
        "run_cpu_s": [round(w["run_cpu_s"], 3) for w in workers],
        "ns3_cpu_s": [round(w["ns3_cpu_s"], 3) for w in workers],  # of it, inside ns-3's window runs
        "run_wall_s": [round(w["run_wall_s"], 3) for w in workers],
        "worker_wall_s": [round(w["wall_s"], 3) for w in workers],
        "windows_ended_by": workers[0]["ended_by"] if workers else {},  # every worker runs the same windows
        "window_widths_ns": workers[0]["widths"] if workers else {},
        "setup_cpu_s": [round(w["setup_cpu_s"], 3) for w in workers],
        "maxrss_mb": max((w["maxrss_kb"] // 1024 for w in workers), default=0),
        "maxrss_mb_each": [w["maxrss_kb"] // 1024 for w in workers],  # each worker's peak RSS
        "events_setup": max((int(w.get("setup_events", 0)) for w in workers), default=0),
        "events_counted": EVENTS_COUNTED,
    }
