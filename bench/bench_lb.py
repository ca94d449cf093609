"""Load-balancing benchmark (issue 17): CPU cost per ns-3 event of per-packet path choice. Prints figures,
asserts nothing.

One job, an all-to-all between every pair of GPUs on a 2:1 oversubscribed leaf-spine, run with each load-balancing
mode (the SACK receiver for all, so no mode pays for go-back-N's retransmissions). For each it prints the events,
the CPU seconds of the event loop, events per CPU second and the CPU cost per event relative to ECMP; the target
is spraying at most 10% more per event. Each mode runs --repeat times and keeps its fastest run (the machine is
shared), interleaved so that a slow spell hits every mode alike.

    .venv/bin/python bench/bench_lb.py                        # 4 leaves x 4 GPUs, 2 spines, 256 KiB per pair
    .venv/bin/python bench/bench_lb.py --leaves 8 --per-leaf 8 --spines 4 --bytes 1MiB --cc dcqcn
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator, load_ns3
from phantora.netsim.packet_config import LB_MODES, PacketConfig
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology
from phantora.units import parse_size_bytes


def all_to_all(gpus: list[int], nbytes: int) -> list[Flow]:
    """One flow per ordered pair of GPUs."""
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    return [Flow(i, a, b, nbytes) for i, (a, b) in enumerate(pairs)]


def run(topo: Topology, flows: list[Flow], cfg: PacketConfig) -> tuple[int, float, int]:
    """(events, CPU seconds of the event loop, makespan ns)."""
    with Ns3Simulator(topo, cfg) as sim:
        sim.submit(flows, at=0)
        c0 = time.process_time()
        done = sim.drain()
        cpu = time.process_time() - c0
        events = int(str(sim.stats()["events"]))
    return events, cpu, max(c.end_ns for c in done)


def fabric_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of the benchmark fabric (a leaf-spine) and its all-pairs traffic, shared with bench_classes."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--leaves", type=int, default=4)
    p.add_argument("--per-leaf", type=int, default=4)
    p.add_argument("--spines", type=int, default=2)
    p.add_argument("--bytes", default="256KiB", help="bytes per GPU pair")
    return p


def main() -> None:
    p = fabric_parser(__doc__)
    p.add_argument("--cc", default="none")
    p.add_argument("--modes", default=",".join(LB_MODES), help="comma-separated load-balancing modes")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    load_ns3()
    uplink = 100 * args.per_leaf // (2 * args.spines)  # 2:1 oversubscribed
    topo = leaf_spine(args.leaves, args.per_leaf, args.spines, nic_rate="100Gbps", uplink_rate=f"{uplink}Gbps",
                      latency="1us", nvswitch=False)  # fmt: skip
    flows = all_to_all(topo.endpoints, parse_size_bytes(args.bytes))
    modes = args.modes.split(",")
    best: dict[str, tuple[int, float, int]] = {}
    for _ in range(args.repeat):
        for mode in modes:
            got = run(topo, flows, PacketConfig(cc=args.cc, lb=mode, rx="sack"))
            if mode not in best or got[1] < best[mode][1]:
                best[mode] = got
    print(f"{len(flows)} flows of {args.bytes} on {args.leaves} leaves x {args.per_leaf} GPUs, {args.spines} spines "
          f"({uplink}G uplinks), cc {args.cc}, rx sack; best of {args.repeat}")  # fmt: skip
    print(f"{'lb':<10}{'events':>12}{'cpu s':>9}{'events/cpu s':>15}{'cpu/event vs ecmp':>20}{'makespan us':>14}")
    base = best[modes[0]][1] / best[modes[0]][0]
    for mode in modes:
        events, cpu, end = best[mode]
        ratio = (cpu / events) / base
        print(f"{mode:<10}{events:>12}{cpu:>9.3f}{events / cpu:>15,.0f}{ratio:>19.3f}x{end / 1000:>14.1f}")


if __name__ == "__main__":
    main()
