"""CPU of the fluid NVLink side (`nvlink=fluid`) on a recorded step, without ns-3: the recording's flow DAG run
through `FluidNvlinkSimulator` with the flow engine as its packet side, so the fluid engine sees exactly the NVLink
flows and markers, releases and hand-offs a packet run gives it (the fabric's times differ). Prints the fluid
engine's CPU (its `advance`, its max-min re-solves, its submits), the hybrid's whole run and a key over every
completion, so two trees can be run side by side:

    PYTHONPATH=TREE .venv/bin/python bench/bench_fluid_side.py G128 --topology rail128

(G128: the recording of docs/packet-model.md's 128-GPU step.) The cyclic GC runs under the run policy that the
`phantora` program sets (`gc_pause.use_run_policy`, from the start, as `phantora replay`); `--gc default` keeps
CPython's, to measure what the policy changes. `--shards N` splits the fluid side by host (`fluid_shards=N`,
`phantora.netsim.fluid_shards`) and also prints each shard's CPU and the split's critical path (per exchange the
busiest shard, summed); the key must be the one engine's. `--chains` hands a fluid flow whose deps are fluid flows of
its own shard to its flow engine when placed (`fluid_chains=on`), so their releases run in the shards. `--procs` runs
each shard in a process of its own (`fluid_procs=on`, `phantora.netsim.fluid_procs`): the shards' CPU is then read
from their processes (each answer carries its request's), and "the rest in this process" is the driver's own, its
sockets' sends and receives included. With `--shards`, "of it the placement" is the first submit's CPU (the whole
DAG placed, less the stand-in's submits in it; the in-process shards' submits in it without `--procs`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("PHANTORA_TREE") or str(Path(__file__).resolve().parents[1]))

from cpu_timing import cpu_timed

from phantora.egraph.format import load
from phantora.egraph.replay import algo_from_meta, plan_graph
from phantora.netsim.base import Flow
from phantora.netsim.factory import nvlink_efficiency
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.fluid_procs import ProcShardedFluid
from phantora.netsim.fluid_shards import ShardedFluid
from phantora.netsim.gc_pause import policy_line, use_run_policy
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.netsim.packet_config import WIRE_PRESETS, PacketConfig
from phantora.replay import run_engine
from phantora.topology.loader import load_topology


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graph", help="a recording (phantora run --record G)")
    ap.add_argument("--topology", required=True)
    ap.add_argument(
        "--gc", choices=("run", "default"), default="run", help="the run policy (as `phantora replay`) or CPython's"
    )
    ap.add_argument("--shards", type=int, default=0, help="the fluid side on N flow engines, one a run of hosts")
    ap.add_argument(
        "--wire", action="store_true", help="with --shards: each batch and its completions through msgpack, both ways"
    )
    ap.add_argument(
        "--chains", action="store_true", help="fluid chains (fluid_chains=on): their releases in the shards"
    )
    ap.add_argument("--procs", action="store_true", help="with --shards: each shard in a process of its own")
    args = ap.parse_args()
    if args.procs and not args.shards:
        ap.error("--procs needs --shards N")
    if args.gc == "run":
        use_run_policy()
    gc_line = policy_line()  # (as set: `run_engine` unfreezes what it froze, the policy's too, at its end)
    graph = load(args.graph)
    topo = load_topology(args.topology)
    t0 = time.process_time()
    plan = plan_graph(graph, topo, algo_from_meta(graph))
    t_plan = time.process_time() - t0
    config = PacketConfig(cc="dcqcn", **WIRE_PRESETS["roce4k"])  # type: ignore[arg-type]  # wire=roce4k

    def fresh() -> FlowSimulator:
        return FlowSimulator(topo, payload_efficiency=nvlink_efficiency(config))

    split = ProcShardedFluid if args.procs else ShardedFluid
    fluid: Any = split(topo, args.shards, fresh) if args.shards else fresh()
    if args.shards and not args.procs:
        fluid.wire = args.wire
    sim = FluidNvlinkSimulator(
        FlowSimulator(topo), fluid, payload_bytes=config.payload_bytes, header_bytes=config.header_bytes
    )
    sim.fluid_chains = args.chains
    spent = {"advance": 0.0, "resolve": 0.0, "submit": 0.0, "packet": 0.0, "place": 0.0}
    placed = sim.submit

    def place(flows: Sequence[Flow], at: int) -> None:
        """The whole DAG's placement, less the stand-in's submits in it (`spent["place"]`)."""
        was = spent["packet"]
        t = time.process_time()
        placed(flows, at)
        spent["place"] += time.process_time() - t - (spent["packet"] - was)

    sim.submit = place  # type: ignore[method-assign]
    packet = sim.packet
    for name in ("advance", "advance_to_completion", "submit"):
        setattr(packet, name, cpu_timed(spent, "packet", getattr(packet, name)))
    fluid.advance = cpu_timed(spent, "advance", fluid.advance)  # type: ignore[method-assign]
    for engine in [] if args.procs else fluid.shards if args.shards else [fluid]:
        engine._resolve = cpu_timed(spent, "resolve", engine._resolve)
    fluid.submit = cpu_timed(spent, "submit", fluid.submit)  # type: ignore[method-assign]
    t1 = time.process_time()
    got = run_engine(sim, plan.flows)  # (as `phantora replay` runs it)
    t_run = time.process_time() - t1
    key = hashlib.sha256()
    for c in sorted(got, key=lambda c: c.flow_id):
        key.update(f"{c.flow_id},{c.start_ns},{c.end_ns};".encode())
    st = fluid.stats()
    fluid.close()
    print(
        f"{len(plan.flows):,} flows ({st['flows_completed']:,} fluid), plan {t_plan:.2f} CPU s; hybrid run "
        f"{t_run:.2f} CPU s, of it the packet side's stand-in {spent['packet']:.2f}, the rest (the fluid side and "
        f"the hybrid's releases) {t_run - spent['packet']:.2f}; fluid engine: advance {spent['advance']:.2f} "
        f"(max-min re-solves {spent['resolve']:.2f}, {st['resolves']:,} components in {st['events']:,} event "
        f"times), submit {spent['submit']:.2f} CPU s; end {sim.now():,} ns; key {key.hexdigest()[:12]}; "
        f"{gc_line}"
    )
    if args.shards:
        split = st["fluid_shards"]
        cpu = split["shard_cpu_s"]
        here = t_run - spent["packet"] - (0.0 if args.procs else sum(cpu))
        print(
            f"fluid shards {args.shards}: shards' CPU {sum(cpu):.2f} s (busiest {max(cpu):.2f}, least {min(cpu):.2f}), "
            f"critical path {split['critical_cpu_s']:.2f} s over {split['exchanges']:,} exchanges "
            f"({split['together_ns']:,} ns stepped together); the rest in this process {here:.2f} s, of it the "
            f"placement {spent['place']:.2f}"
            + (" (the shards in processes of their own)" if args.procs else "")
            + (f"; {split['wire_bytes'] / 1e6:.1f} MB through msgpack" if args.wire or args.procs else "")
            + (f"; {sim.fluid_chained:,} flows placed in the shards ahead of a held dep" if args.chains else "")
        )


if __name__ == "__main__":
    main()
