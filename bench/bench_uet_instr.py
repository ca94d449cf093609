"""Instructions per ns-3 event, `--set transport=uet` against RoCE on the same live job's traffic (issue 37's
benchmark: UET at most 15% more CPU per event), counted by valgrind, so the figure does not move with the
machine's load. Prints figures, asserts nothing.

bench_uet_cpu.py times the event loop with the CPU clock, which on a shared machine moves with the load (other
processes evict our caches). Here the same replay (the healthy live job's flows, recorded under RoCE + DCQCN by
bench_uet_live.py, submitted at their start times) is written once per preset as a call script and run by
phantora-ns3-runner under callgrind, collecting only inside `ns3::Simulator::Run()` (the event loop: handlers,
scheduler, packets; not the fabric's construction). Per preset it prints the events, the instructions per event
and, with --cache-sim, the first-level and last-level data-cache misses per event of callgrind's cache model
(deterministic as well: the same on any load; `--ll-kib` shrinks the simulated last-level cache, standing for one
shared with other processes). `--until-us T` replays only the flows starting before T.

    .venv/bin/python bench/bench_uet_instr.py --jobs fsdp --until-us 3000
    .venv/bin/python bench/bench_uet_instr.py --until-us 3000 --cache-sim --ll-kib 2048
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import bench_uet_cpu as cpu
import bench_uet_live as live
from callgrind_out import totals

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.launcher import resolve_topology
from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "ns3-scratch/build/phantora-ns3-runner"
EVENTS = ("Ir", "D1mr", "D1mw", "DLmr", "DLmw")  # callgrind's counters with --cache-sim=yes


def write_script(topo: Topology, by_start: dict[int, list[Flow]], cfg: PacketConfig, path: Path) -> None:
    """The call script of the replay (flows submitted at their start times), written while running it once."""
    with Ns3Simulator(topo, cfg, calls=path) as sim:
        for start, flows in by_start.items():
            sim.advance(start)
            sim.submit(flows, at=start)
        sim.drain()


def callgrind(script: Path, out: Path, cache_sim: bool, ll_bytes: int | None = None) -> tuple[int, dict[str, int]]:
    """Run `script` by the runner under callgrind (only ns3::Simulator::Run collected): its events and counters.
    `ll_bytes`: the simulated last-level cache's size (16-way, 64-byte lines; None: this machine's)."""
    prof = out / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={prof}", "--toggle-collect=ns3::Simulator::Run()",
           f"--cache-sim={'yes' if cache_sim else 'no'}"]  # fmt: skip
    if ll_bytes is not None:
        cmd.append(f"--LL={ll_bytes},16,64")
    cmd += [str(RUNNER), str(script), str(out / "runner")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script}: the runner under callgrind failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return int(summary["events"]), totals(prof)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", nargs="+", default=list(live.JOBS), choices=list(live.JOBS))
    ap.add_argument("--cc", default="dcqcn", help="RoCE's congestion control (default dcqcn)")
    ap.add_argument("--until-us", type=float, default=None, help="replay only the flows starting before this")
    ap.add_argument("--cache-sim", action="store_true", help="also count data-cache misses (callgrind's model)")
    ap.add_argument("--ll-kib", type=int, default=None,
                    help="with --cache-sim: the simulated last-level cache in KiB (default: this machine's); a "
                         "small one stands for a cache shared with other processes")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("runs/uet-cpu"), help="the live runs whose flows are replayed")
    ap.add_argument("--skip-done", action="store_true", help="reuse live runs that have results.json")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (apt-get install valgrind)")
    args.out = args.out.resolve()
    fabric, configs = cpu.prepare(args.out, args.cc)
    cut = "all flows" if args.until_us is None else f"flows starting before {args.until_us:g} us"
    ll_note = "" if args.ll_kib is None else f", simulated last-level cache {args.ll_kib} KiB"
    print(f"replayed live-job flows (recorded under roce+dcqcn; {cut}), roce with cc {args.cc}, callgrind{ll_note}")
    extra = ["D1 misses / event", "LL misses / event"] if args.cache_sim else []
    head = ["job", "preset", "events", "instructions / event", *extra, "UET / RoCE instructions"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * (len(head) - 2))
    for job in args.jobs:
        src = args.out / f"{job}-roce+dcqcn-healthy"
        live.run(job, "roce+dcqcn", None, fabric, src, args.skip_done)
        by_start = cpu.read_flows(src / "flows.csv")
        if args.until_us is not None:
            by_start = {t: fl for t, fl in by_start.items() if t < args.until_us * 1e3}
        topo = resolve_topology(fabric)
        per: dict[str, float] = {}
        for name, cfg in configs.items():
            work = args.out / f"instr-{job}-{name}"
            work.mkdir(exist_ok=True)
            write_script(topo, by_start, cfg, work / "calls.txt")
            ll = None if args.ll_kib is None else args.ll_kib * 1024
            events, c = callgrind(work / "calls.txt", work, args.cache_sim, ll)
            per[name] = c["Ir"] / events
            cells = [job, name, f"{events:,}", f"{per[name]:.0f}"]
            if args.cache_sim:
                cells += [f"{(c['D1mr'] + c['D1mw']) / events:.2f}", f"{(c['DLmr'] + c['DLmw']) / events:.3f}"]
            cells.append("1" if name == "roce" else f"{per[name] / per['roce']:.3f}x")
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
