"""`phantora netsim --network ns3 --set partition=N`: the flows on N partition worker processes (issue 38).

The batches of the flow file (each at its own start time, no dependencies) run on `bridge.cut_pool`'s workers,
one switch group each, and their records come back merged as one keyed engine's (`--set
scheduler=ns3::PhantoraKeyedScheduler`): the same FCTs, PFC frames, CNPs, CE marks, drops, transport and channel
counters, so the same files. A workload's flow DAG runs too: a dependency completed in one worker releases its
dependent in another (`phantora.netsim.cut_windows`); queues sampled with `--queue-sample-ns N` (off by default
with partition) by owner, merged as one engine's queues.csv. What the workers cannot do yet is refused, naming it: a
scenario.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from phantora.errors import InputError
from phantora.netsim.hpcc_io import pfc_txt_lines
from phantora.netsim.packet_summary import channel_usage
from phantora.netsim.partitioned import effective_settings, partition_summary
from phantora.topology.model import Topology

if TYPE_CHECKING:
    from pathlib import Path

    from phantora.netsim.base import Flow
    from phantora.netsim.engine_spec import EngineSpec


class FlowInput(Protocol):
    """What of `phantora.commands.netsim.NetsimInput` a partitioned run reads."""

    fmt: str
    path: Path | None
    batches: list[tuple[int, list[Flow]]]
    dports: dict[int, int]
    hidden: frozenset[int]

    @property
    def flows(self) -> list[Flow]: ...

    @property
    def first_start(self) -> int: ...


def run_partition(
    topo: Topology, inp: FlowInput, engine: EngineSpec, scenario: Any = None, progress: str = "off"
) -> dict[str, Any]:
    """`_run_ns3`'s result from `engine.packet.partition` worker processes; `progress` (a `Progress` mode): their
    clock, events and CPU from inside the run (`bridge.cut_pool`'s beats), then every flow done."""
    from bridge.cut_pool import run_partitioned_batches
    from phantora.progress import Progress

    config = engine.packet
    if scenario is not None:
        raise InputError(
            f"partition={config.partition}: a scenario's faults are not split between partition workers yet; "
            "run it on one engine (partition=0)",
            field="--scenario",
        )
    with Progress(progress, "netsim", len(inp.flows), "flow") as bar:
        show = None if progress == "off" else lambda b: bar.beat(b.sim_ns, lambda: b.events, workers=b)
        res = run_partitioned_batches(topo, config, inp.batches, None, inp.dports, on_beat=show)
        bar.update(done=len(res.completions), sim_ns=res.now, events=int(res.stats.get("events", 0)))
    done = {c.flow_id: c for c in res.completions}
    return {
        "done": done,
        "fct": [r for r in res.fct if r.flow_id in done and r.flow_id not in inp.hidden],
        "pfc": res.pfc,
        "pfc_txt": pfc_txt_lines(res.pfc),
        "queues": res.queues,
        "drops": res.drops,
        "cnps": res.cnps,
        "ecn": res.marks,
        "transport": res.transport,
        "links": channel_usage(res.channels, max(1, res.now - inp.first_start)),  # type: ignore[arg-type]
        "stats": res.stats,
        "effective": effective_settings(topo, config, res.effective),
        "wall_s": res.wall_s,
        "now": res.now,
        "partition": partition_summary(res.workers, res.ties),
    }
