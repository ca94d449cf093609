"""What ns-3 runs of a recorded graph's prefix under nvlink=fluid, captured for partition runs (issue 38). Prints
figures and writes the capture.

Partition workers (`partition=N`) run one DAG of packet flows whole, so they cannot run the hybrid's fluid NVLink
side, which releases fabric flows as its NVLink flows end. This runs a prefix (`--until-ms` past the first flow
ns-3 gets) on one keyed engine with the fluid side, and writes what its ns-3 engine was given: every batch of fabric
flows at the ns it was submitted (with the dependencies the hybrid left to ns-3), and ns-3's completions.
`bench/bench_partition.py --batches FILE` then runs those batches on one engine and on N partition workers: the
ns-3 work of the fast settings, split by switch group, with each worker's CPU. Printed here: planning, set-up, the
prefix's run CPU and the share of it inside ns-3's run calls (the rest is the fluid side and the hybrid's Python),
ns-3 events. (On the Llama-3-8B step on leafspine1024 ns-3's first flows, coarse rings, wait 2.22 ms: their
steps' latency.)

    .venv/bin/python bench/capture_packet_side.py G --topology leafspine1024 --cc dcqcn --until-ms 3.2225 \\
        --set nvlink=fluid --set wire=roce4k --out /tmp/cap.msgpack
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from bridge.columns import completions_to_columns, flows_to_columns
from phantora.egraph.format import load
from phantora.egraph.replay import algo_from_meta, plan_graph
from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.topology.loader import load_topology

RUN_CALLS = ("advance", "advance_to_completion", "advance_watching")


class Tap:
    """Records what an `Ns3Simulator` is given and returns, and the CPU of its run calls (instance attributes over
    its methods: the engine itself is not changed)."""

    def __init__(self, ns3: Ns3Simulator) -> None:
        self.batches: list[tuple[int, list[Flow]]] = []
        self.done: list[Completion] = []
        self.cpu_s = 0.0
        submit = ns3.submit

        def tapped_submit(flows: Sequence[Flow], at: int, dports: Any = None) -> None:
            if flows:
                self.batches.append((at, list(flows)))
            submit(flows, at, dports)

        ns3.submit = tapped_submit  # type: ignore[method-assign]
        for name in RUN_CALLS:
            setattr(ns3, name, self._timed(getattr(ns3, name)))

    def _timed(self, call: Callable[..., list[Completion]]) -> Callable[..., list[Completion]]:
        def run(*args: Any, **kwargs: Any) -> list[Completion]:
            c0 = time.process_time()
            got = call(*args, **kwargs)
            self.cpu_s += time.process_time() - c0
            self.done.extend(got)
            return got

        return run


def find_ns3(engine: Any) -> Ns3Simulator:
    """The `Ns3Simulator` under the hybrid's packet side (reuse and NIC latency wrap it as `inner`)."""
    side = engine.packet
    while not isinstance(side, Ns3Simulator):
        side = getattr(side, "inner", None)
        if side is None:
            raise InputError("no ns-3 engine under the packet side (decomposition is not captured)", field="--set")
    return side


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("graph", help="execution-graph directory (phantora run --record DIR)")
    ap.add_argument("--topology", required=True)
    ap.add_argument("--cc", default="dcqcn")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="a PacketConfig field (repeatable)")
    ap.add_argument("--until-ms", type=float, required=True, help="simulated ms to run after ns-3's first flow")
    ap.add_argument("--quantum-ns", type=int, default=20_000, help="simulated ns between advance calls")
    ap.add_argument("--out", required=True, help="msgpack file of the capture")
    args = ap.parse_args()
    sets = [f"cc={args.cc}", *args.sets, f"scheduler={KEYED_SCHEDULER}", "queue_sample_ns=0"]
    cfg = apply_overrides(PacketConfig(), sets)
    if cfg.nvlink != "fluid" or cfg.reuse == "on" or cfg.workers or cfg.partition:
        raise InputError(
            "capture the fluid NVLink hybrid over one engine: nvlink=fluid, no reuse or workers", field="--set"
        )
    c0 = time.process_time()
    graph = load(args.graph)
    topo = load_topology(args.topology)
    flows = plan_graph(graph, topo, algo_from_meta(graph)).flows
    plan_cpu = time.process_time() - c0
    c1 = time.process_time()
    sim = make_engine(EngineSpec("ns3", cfg), topo)
    tap = Tap(find_ns3(sim))
    sim.submit(flows, 0)
    setup_cpu = time.process_time() - c1
    c2, w2 = time.process_time(), time.perf_counter()
    until = None
    while (until is None or sim.now() < until) and (nxt := sim.next_event_time()) is not None:
        step = max(nxt, sim.now() + args.quantum_ns)
        sim.advance(step if until is None else min(until, step))
        if until is None and tap.batches:
            until = tap.batches[0][0] + round(args.until_ms * 1e6)
    if until is None:
        raise InputError(f"{args.graph}: no flow reached ns-3", field="graph")
    run_cpu, run_wall = time.process_time() - c2, time.perf_counter() - w2
    stats = sim.stats()
    sim.close()
    events = int(str(stats.get("events", 0)))
    fabric = sum(len(b) for _, b in tap.batches)
    done = sorted(tap.done, key=lambda c: (c.end_ns, c.flow_id))
    out = {"topology": args.topology, "sets": sets, "until": until, "events": events,
           "batches": [[at, flows_to_columns(b)] for at, b in tap.batches], "done": completions_to_columns(done),
           "run_cpu_s": run_cpu, "ns3_cpu_s": tap.cpu_s}  # fmt: skip
    Path(args.out).write_bytes(msgpack.packb(out))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"graph {args.graph}: {len(flows):,} flows planned in {plan_cpu:.1f} CPU s; set-up {setup_cpu:.1f} CPU s")
    print(f"prefix to {until:,} ns, {args.until_ms:g} ms after ns-3's first flow ({', '.join(args.sets)}, keyed): "
          f"run {run_cpu:.1f} CPU s "
          f"({run_wall:.1f} s wall), of which ns-3's run calls {tap.cpu_s:.1f} s ({100 * tap.cpu_s / run_cpu:.1f} %); "
          f"{events:,} ns-3 events ({events / max(tap.cpu_s, 1e-9) / 1e6:.2f} M per ns-3 CPU s)")  # fmt: skip
    print(f"ns-3 got {fabric:,} fabric flows in {len(tap.batches):,} batches; {len(done):,} completed by "
          f"{until:,} ns; peak RSS {rss:.2f} GB; written to {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
