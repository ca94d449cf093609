"""`--scenario FILE` of `run`, `replay` and `netsim`: faults, stragglers and background traffic (docs/scenarios.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.netsim.scenario import Scenario, check_against, read_scenario
from phantora.netsim.standalone import Alone
from phantora.results import schema as S
from phantora.results.run_dir import RunDir
from phantora.topology.model import Topology

HELP = (
    "a scenario TOML: link failures, flaps and gray failures, switch and NIC failures, slow GPUs, background "
    "traffic, at simulated times or step boundaries (docs/scenarios.md; flow and packet networks)"
)


def add_scenario_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", type=Path, default=None, metavar="TOML", help=HELP)


def load_scenario(
    args: argparse.Namespace, topo: Topology, *, steps: bool = False, live: bool = False
) -> Scenario | None:
    """The --scenario of a command, checked against its topology and network (None without one). `steps`:
    the command knows step boundaries (else an event at `at_step` is refused); `live`: ranks run (their own
    gpu_slow works on either network)."""
    path = getattr(args, "scenario", None)
    if path is None:
        return None
    sc = read_scenario(path)
    check_against(sc, topo)
    if not steps:
        for ev in sc.events:
            if ev.at_step is not None:
                raise InputError(
                    f"{args.command if hasattr(args, 'command') else 'this command'} has no training steps here: give "
                    "`at` (a simulated time), or replay a recorded graph (its steps), or use phantora run",
                    file=str(path),
                    line=ev.line,
                    field=f"events[{ev.index}].at_step",
                )
    return sc


def install_throttles(sim: Any, sc: Scenario | None, topo: Topology, network: str) -> None:
    """Replays: slow GPUs stretch the compute delays of marker flows (the flow engine's `stretch`, or inside the
    ns-3 fabric: `FaultyNs3Simulator.throttle`)."""
    if sc is None or not sc.gpu_slow():
        return
    from phantora.netsim.flow import FlowSimulator
    from phantora.netsim.packet_faults import FaultyNs3Simulator, scenario_engine

    if isinstance(sim, FlowSimulator) and network == "flow":
        from phantora.replay import compute_stretch

        sim.stretch = compute_stretch(sc.throttles(), topo)
        return
    packet = scenario_engine(sim)
    if not isinstance(packet, FaultyNs3Simulator):
        raise InputError("gpu_slow in a replay needs the flow engine or ns-3 under the scenario", file=sc.source)
    packet.throttle(sc.throttles())


def report_scenario(
    sc: Scenario | None,
    topo: Topology,
    sim: Any,
    spans: list[tuple[int, int]],
    ml_done: list[Any],
    out: Path | None,
    span_name: str,
    step_starts: dict[int, int] | None = None,
    alone: dict[int, Alone] | None = None,
) -> dict[str, Any] | None:
    """Print what the scenario did and return results.json's "scenario" section (`alone`: the ECMP keys and rate
    caps of `ml_done`'s flows, `flow_alone`); with `out`, also plot step (or op) time against simulated time with the
    events marked (scenario_steps.png/.svg)."""
    if sc is None:
        return None
    from phantora.report.scenario_plot import plot_step_times
    from phantora.results.scenario import format_scenario, scenario_results

    res = scenario_results(sc, topo, sim, spans, ml_done, span_name, step_starts, alone)
    if step_starts:
        res["steps_started"] = {str(k): v for k, v in sorted(step_starts.items())}
    print(format_scenario(res))
    if out is not None and spans:
        base = RunDir(out).file(S.SCENARIO_STEPS_PNG).with_suffix("")
        paths = plot_step_times(spans, res, base, ylabel=f"{span_name[:-1]} time")
        print("wrote " + ", ".join(str(p) for p in paths))
    return res


def check_run_scenario(args: argparse.Namespace) -> None:
    """`phantora run --scenario`: the scenario is read and checked against the topology before anything starts
    (link events and background traffic run in the coordinator's engine, slow GPUs in the ranks, events at a step
    when the first rank starts that step)."""
    if args.scenario is None:
        return
    from phantora.topology import load_topology

    load_scenario(args, load_topology(args.topology), steps=True, live=True)
