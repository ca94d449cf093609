"""The keyed scheduler mode's cost (issue 38): events per CPU second and instructions per data packet.

Records the call script of a dependency-free ring all-reduce (bench_per_packet.py's: default 16 GPUs, 4 MiB,
400G leaf-spine, cc none, 1000-byte payloads) and replays it with the standalone runner of each build given,
with the default scheduler (ns3::PhantoraWheelScheduler) and, where the build has it, the keyed mode
(ns3::PhantoraKeyedScheduler): CPU seconds (best of --repeat), events per CPU second and, under valgrind, the
instructions per data packet (the same count on a loaded machine). The keyed rows also give the last FCT and
how many flows end at another ns than in the default order (the keyed mode is another order of same-ns
events, so a new reference, not today's results). A last row per build replays the same all-reduce in the keyed
mode with the fabric cut into --groups (partition_loopback: packets over cut cables as messages, delivered at
window barriers, every group in this one engine): its FCTs against the keyed row's (0 moved: byte-identical).

    .venv/bin/python bench/bench_keyed.py                     # ns3-scratch/build
    .venv/bin/python bench/bench_keyed.py --build OLD_BUILD --build ns3-scratch/build --no-callgrind
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_packet import allreduce_flows, fabric
from bench_per_packet import callgrind, record, replay, with_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator, runner_path
from phantora.netsim.packet_config import PacketConfig
from phantora.units import parse_size_bytes

WHEEL = "ns3::PhantoraWheelScheduler"
KEYED = "ns3::PhantoraKeyedScheduler"


def fcts(out: Path) -> dict[str, str]:
    """fct.txt's lines by their first three fields (src, dst, port or id), the rest as text."""
    rows = {}
    for line in (out / "fct.txt").read_text().splitlines():
        f = line.split()
        if len(f) > 3:
            rows[" ".join(f[:4])] = " ".join(f[4:])
    return rows


def record_loopback(script: Path, gpus: int, nbytes: int, cc: str, groups: int) -> None:
    """`record`'s all-reduce in the keyed mode with the fabric cut into `groups` (partition_loopback)."""
    topo = fabric(gpus, "400Gbps")
    flows = [Flow(i, f.src, f.dst, f.size, key=i) for i, f in enumerate(allreduce_flows(topo, nbytes, "coarse", 2))]
    config = PacketConfig(cc=cc, scheduler=KEYED, partition_loopback=groups)
    with Ns3Simulator(topo, config, calls=script) as sim:
        sim.submit(flows, at=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, action="append", help="build directory with phantora-ns3-runner (repeatable)")
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--bytes", default="4MiB", help="all-reduce size")
    ap.add_argument("--cc", default="none")
    ap.add_argument("--groups", type=int, default=2, help="groups of the loopback rows (partition_loopback)")
    ap.add_argument("--repeat", type=int, default=3, help="replays per row for CPU seconds (best kept)")
    ap.add_argument("--no-callgrind", action="store_true", help="skip the instruction count")
    args = ap.parse_args()
    builds = args.build or [runner_path().parent]
    use_cg = not args.no_callgrind and shutil.which("valgrind") is not None
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        nbytes = parse_size_bytes(args.bytes)
        script = d / "calls.txt"
        record(script, args.gpus, nbytes, args.cc)
        cut_script = d / "calls-cut.txt"
        record_loopback(cut_script, args.gpus, nbytes, args.cc, args.groups)
        print(f"{args.gpus} GPUs, ring all-reduce {args.bytes}, cc {args.cc}, 1000-byte payloads, standalone runner")
        print(
            "flows moved: flows whose FCT line differs from the first row's (keyed rows) / the keyed row's (loopback)"
        )
        head = f"{'events':>10}{'CPU s':>8}{'M ev/CPU s':>11}{'instr/pkt':>11}  flows moved"
        print(f"{'build':<40}{'mode':<30}{head}")
        base: dict[str, str] | None = None
        for build in builds:
            runner = build / "phantora-ns3-runner"
            keyed: dict[str, str] | None = None
            rows = (
                (WHEEL, with_scheduler(script, WHEEL, d / "w.txt")),
                (KEYED, with_scheduler(script, KEYED, d / "k.txt")),
            )
            for mode, s in (*rows, (f"keyed, loopback {args.groups} groups", cut_script)):
                out = d / "o"
                try:
                    summary, cpu = replay(runner, s, out)
                except subprocess.CalledProcessError:
                    print(f"{str(build):<40}{mode:<30}{'(not in this build)':>40}")
                    continue
                cpu = min([cpu] + [replay(runner, s, out)[1] for _ in range(args.repeat - 1)])
                got = fcts(out)
                base = got if base is None else base
                ref = keyed if mode.startswith("keyed,") and keyed is not None else base
                keyed = got if mode == KEYED else keyed
                moved = sum(got.get(k) != v for k, v in ref.items())
                instr = f"{callgrind(runner, s, out) / summary['data_packets']:>11,.0f}" if use_cg else f"{'-':>11}"
                print(
                    f"{str(build):<40}{mode:<30}{summary['events']:>10}{cpu:>8.2f}"
                    f"{summary['events'] / cpu / 1e6:>11.2f}{instr}  {moved} of {len(ref)}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
