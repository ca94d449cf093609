"""The scenario study of docs/scenarios.md (issue 36): an FSDP job on a leaf-spine fabric under faults.

An FSDP-like step (8 layers: forward all-gathers, backward all-gather + reduce-scatter pairs, 16 MiB each, with
the layers' compute between them) on 8 GPUs under 2 leaves and 2 spines (100G NICs, non-blocking), replayed
clean and under five scenarios: a spine uplink failing mid-run, a gray failure (1% loss) on the other uplink,
a straggler GPU (x1.5), 30% WebSearch background load, and the four one after another. Each runs on the flow
engine (ECMP) and on ns-3 with DCQCN and HPCC, each with ECMP and adaptive routing; each is compared with the
clean run of the same engine. Events are placed at fractions of the clean makespan of the flow engine.

    .venv/bin/python bench/bench_scenario_study.py             # the table (markdown)
    .venv/bin/python bench/bench_scenario_study.py --only flow # one engine
    .venv/bin/python bench/bench_scenario_study.py --only hpcc-ecmp --scenario "all four"  # one scenario (and clean)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.commands.scenario_option import install_throttles
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.scenario import Scenario, parse_scenario
from phantora.replay import ReplayResult, replay_inprocess
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology
from phantora.workload import Workload, workload_from_dict

MIB = "16MiB"
SEED = 7
RECONVERGENCE = "50us"
ENGINES = {
    "flow": ("flow", {}),
    "dcqcn-ecmp": ("ns3", {"cc": "dcqcn", "lb": "ecmp"}),
    "dcqcn-adaptive": ("ns3", {"cc": "dcqcn", "lb": "adaptive"}),
    "hpcc-ecmp": ("ns3", {"cc": "hpcc", "lb": "ecmp"}),
    "hpcc-adaptive": ("ns3", {"cc": "hpcc", "lb": "adaptive"}),
}


def workload() -> Workload:
    """FSDP-like: 8 forward all-gathers at a 1 ms compute cadence, then 8 all-gather + reduce-scatter pairs."""
    ops = [
        {"name": "fwd_ag", "kind": "all_gather", "bytes": MIB, "ranks": "all", "every": "1ms", "repeat": 8},
        {"name": "bwd_ag", "kind": "all_gather", "bytes": MIB, "ranks": "all", "after": ["fwd_ag.7"], "gap": "1ms",
         "repeat": 8},
        {"name": "bwd_rs", "kind": "reduce_scatter", "bytes": MIB, "ranks": "all", "after": ["bwd_ag.7"],
         "gap": "2ms", "repeat": 8},
    ]  # fmt: skip
    return workload_from_dict({"name": "fsdp-study", "op": ops}, world=8)


def fabric() -> Topology:
    return leaf_spine(2, 4, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)


def _ev(kind: str, at: int, body: str) -> str:
    return f'[[events]]\nkind = "{kind}"\nat = "{at}ns"\n{body}'


def scenarios(t: int) -> dict[str, Scenario]:
    """The five scenarios, their events at fractions of the clean makespan `t` (ns)."""
    up = 'link = ["leaf0", "spine0"]\n'
    gray = 'link = ["leaf0", "spine1"]\nloss = 0.01\n'
    slow = "rank = 5\nfactor = 1.5\n"
    bg = f'duration = "{int(0.9 * t)}ns"\ncdf = "websearch"\nload = 0.3\n'
    bodies = {
        "uplink down": _ev("link_down", int(0.3 * t), up),
        "gray 1% loss": _ev("link_degrade", int(0.3 * t), gray),
        "straggler x1.5": _ev("gpu_slow", int(0.3 * t), slow),
        "30% websearch": _ev("background", 0, bg),
        "all four": _ev("link_down", int(0.2 * t), up)
        + _ev("link_degrade", int(0.4 * t), gray)
        + _ev("gpu_slow", int(0.6 * t), slow)
        + _ev("background", int(0.8 * t), bg),
    }
    head = f'seed = {SEED}\nreconvergence = "{RECONVERGENCE}"\n'
    return {name: parse_scenario(head + body, f"{name}.toml") for name, body in bodies.items()}


def run(engine: str, topo: Topology, wl: Workload, sc: Scenario | None) -> tuple[ReplayResult, dict[str, Any], float]:
    network, fields = ENGINES[engine]
    spec = EngineSpec(network, PacketConfig(**fields))  # type: ignore[arg-type]
    sim: Any = make_engine(spec, topo, scenario=sc)
    t0 = time.perf_counter()
    try:
        install_throttles(sim, sc, topo, network)
        res = replay_inprocess(wl, topo, sim)
        stats = dict(sim.stats())
    finally:
        sim.close()
    return res, stats, time.perf_counter() - t0


def absorbed(clean: ReplayResult, res: ReplayResult) -> str:
    """The op whose time grew most, with its share of the ops' total increase."""
    grown = {a.name: b.duration_ns - a.duration_ns for a, b in zip(clean.ops, res.ops, strict=True)}
    pos = {k: v for k, v in grown.items() if v > 0}
    if not pos:
        return "-"
    name = max(pos, key=lambda k: (pos[k], k))
    return f"{name} ({pos[name] / sum(pos.values()) * 100:.0f}%)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=list(ENGINES), action="append", help="engines to run (default: all)")
    p.add_argument("--scenario", action="append", help="scenarios to run, by name (default: all; the clean run always)")
    args = p.parse_args()
    topo, wl = fabric(), workload()
    base, _, _ = run("flow", topo, wl, None)
    cases = scenarios(base.makespan_ns)
    unknown = set(args.scenario or ()) - cases.keys()
    if unknown:
        p.error(f"unknown scenario {sorted(unknown)[0]!r} (known: {', '.join(cases)})")
    cases = {k: v for k, v in cases.items() if not args.scenario or k in args.scenario}
    print(f"clean makespan on the flow engine: {base.makespan_ns / 1e6:.3f} ms; events at fractions of it\n")
    cols = ["engine", "scenario", "makespan (ms)", "vs clean", "lost (KB)", "retransmitted (KB)", "absorbed most by"]
    print("| " + " | ".join([*cols, "wall (s)"]) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for engine in args.only or list(ENGINES):
        clean, _, wall = run(engine, topo, wl, None)
        print(f"| {engine} | clean | {clean.makespan_ns / 1e6:.3f} | - | - | - | - | {wall:.1f} |", flush=True)
        for name, sc in cases.items():
            res, st, wall = run(engine, topo, wl, sc)
            cost = (res.makespan_ns - clean.makespan_ns) / clean.makespan_ns * 100
            lost = st.get("lost_bytes", 0) / 1e3
            retx = st.get("retx_bytes")
            retx_s = "-" if retx is None else f"{retx / 1e3:.0f}"
            print(
                f"| {engine} | {name} | {res.makespan_ns / 1e6:.3f} | {cost:+.1f}% | {lost:.0f} | {retx_s} | "
                f"{absorbed(clean, res)} | {wall:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
