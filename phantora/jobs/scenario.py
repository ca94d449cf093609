"""A scenario in a run of several jobs (`phantora run --jobs` and `phantora replay --jobs` with `--scenario`).

The jobs share one engine, so the scenario's network events (link, switch and NIC failures, gray failures) and its
background traffic act on every job, as in a single-job run. What names a job's own rank or step is refused, because
a rank or a step number means a different GPU or time in each job: `gpu_slow`, `at_step`, `nic_down` by `rank` and
`background` by `hosts` (name nodes instead). results.json's `scenario` is the single-job section
(`phantora.results.scenario`) with, per event, each job's steps before, during and after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from phantora.errors import InputError
from phantora.netsim.scenario import Background, GpuSlow, NodeEvent, Scenario, check_against, read_scenario
from phantora.netsim.standalone import Alone
from phantora.results.scenario import phases
from phantora.topology.model import Topology

WHY = "several jobs share the run, and a rank or step number is each job's own"


def load_jobs_scenario(path: str, topo: Topology) -> Scenario:
    """The scenario file, checked against the (unplaced) topology and for what a run of several jobs cannot apply
    (InputError naming the file, line and field)."""
    sc = read_scenario(path)
    check_against(sc, topo)
    for ev in sc.events:
        field, fix = None, ""
        if isinstance(ev, GpuSlow):
            field, fix = "kind", "gpu_slow is not applied in a run of several jobs; run the job alone"
        elif ev.at_step is not None:
            field, fix = "at_step", "give `at` (a simulated time)"
        elif isinstance(ev, NodeEvent) and ev.rank is not None:
            field, fix = "rank", 'name the NIC\'s node (node = "gpu3")'
        elif isinstance(ev, Background) and ev.hosts is not None:
            field, fix = "hosts", "leave hosts out (every endpoint)"
        if field is not None:
            raise InputError(f"{WHY}: {fix}", file=sc.source, line=ev.line, field=f"events[{ev.index}].{field}")
    return sc


def job_spans(doc: Mapping[str, Any]) -> list[tuple[int, int]]:
    """A job's step spans (start, end) in ns, from its results.json's steps."""
    return [(int(s["end_ns"]) - int(s["time_ns"]), int(s["end_ns"])) for s in doc.get("steps") or []]


def add_job_phases(section: dict[str, Any], jobs: Mapping[str, Mapping[str, Any]], end_ns: int) -> dict[str, Any]:
    """`section` (a single-job scenario section) with each event's `steps` replaced by `jobs`: per job, its steps
    before, during and after the event; `end_ns` (the run's makespan) ends the open windows in the trace."""
    spans = {name: job_spans(doc) for name, doc in jobs.items()}
    for ev in section.get("events", []):
        ev.pop("steps", None)
        ev["jobs"] = {name: phases(s, ev["start_ns"], ev["end_ns"]) for name, s in spans.items()}
    section["end_ns"] = end_ns
    return section


def live_jobs_section(
    sc: Scenario, topo: Topology, outcome: Mapping[str, Any], stats: Mapping[str, Any], makespan_ns: int
) -> dict[str, Any]:
    """The section of live jobs' run (`bridge.run.CosimResult.scenario` as `outcome`), before `add_job_phases`:
    the engine's applied actions, or the timed schedule up to the makespan when the engine ran in a server."""
    from phantora.results.scenario_live import live_section, planned_rows

    section = live_section(sc, topo, outcome, {}, [], stats)
    section["applied"] = list(outcome.get("applied") or planned_rows(sc, topo, makespan_ns))
    for key in ("gpu_slow", "steps_started"):
        section.pop(key, None)
    return section


def recorded_jobs_section(
    sc: Scenario, topo: Topology, engine: Any, done: Sequence[Any], alone: Mapping[int, Alone] | None = None
) -> dict[str, Any]:
    """The section of recorded jobs replayed in this process, from the engine itself (before it is closed; `alone`:
    the flows' ECMP keys and rate caps)."""
    from phantora.results.scenario import scenario_results

    return scenario_results(sc, topo, engine, (), done, "steps", alone=alone)
