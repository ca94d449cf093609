"""Class scheduling benchmark (issue 17): CPU cost per ns-3 event of scheduling switch and NIC queues by traffic
class. Prints figures, asserts nothing.

One all-to-all between every pair of GPUs on a 2:1 oversubscribed leaf-spine, each flow in one of three traffic
classes (by pair), run with `sched=rr` (the HPCC models' round robin), `strict` and `wrr`. For each it prints the
events, the CPU seconds of the event loop, events per CPU second and the CPU cost per event relative to rr. Each
scheduler runs --repeat times and keeps its fastest run (the machine is shared), interleaved.

    .venv/bin/python bench/bench_classes.py                     # 4 leaves x 4 GPUs, 2 spines, 256 KiB per pair
    .venv/bin/python bench/bench_classes.py --classes 1 --repeat 5
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_lb import fabric_parser, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.packet import load_ns3
from phantora.netsim.packet_config import CLASS_SCHEDULERS, PacketConfig
from phantora.topology.generators import leaf_spine
from phantora.units import parse_size_bytes


def main() -> None:
    p = fabric_parser(__doc__)
    p.add_argument("--classes", type=int, default=3, help="traffic classes the flows spread over (1..3 -> 1, 2, 3)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    load_ns3()
    uplink = 100 * args.per_leaf // (2 * args.spines)  # 2:1 oversubscribed
    topo = leaf_spine(args.leaves, args.per_leaf, args.spines, nic_rate="100Gbps", uplink_rate=f"{uplink}Gbps",
                      latency="1us", nvswitch=False)  # fmt: skip
    gpus = topo.endpoints
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    size = parse_size_bytes(args.bytes)
    flows = [Flow(i, a, b, size, priority=1 + i % args.classes) for i, (a, b) in enumerate(pairs)]
    best: dict[str, tuple[int, float, int]] = {}
    for _ in range(args.repeat):
        for sched in CLASS_SCHEDULERS:
            got = run(topo, flows, PacketConfig(sched=sched))
            if sched not in best or got[1] < best[sched][1]:
                best[sched] = got
    print(f"{len(flows)} flows of {args.bytes} in {args.classes} classes on {args.leaves} leaves x {args.per_leaf} "
          f"GPUs, {args.spines} spines ({uplink}G uplinks), cc none; best of {args.repeat}")  # fmt: skip
    print(f"{'sched':<8}{'events':>12}{'cpu s':>9}{'events/cpu s':>15}{'cpu/event vs rr':>18}{'makespan us':>14}")
    base = best["rr"][1] / best["rr"][0]
    for sched in CLASS_SCHEDULERS:
        events, cpu, end = best[sched]
        print(
            f"{sched:<8}{events:>12}{cpu:>9.3f}{events / cpu:>15,.0f}{(cpu / events) / base:>17.3f}x{end / 1000:>14.1f}"
        )


if __name__ == "__main__":
    main()
