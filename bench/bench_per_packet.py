"""Per-packet cost of the ns-3 models: events per CPU second and, under valgrind, instructions per data packet.

Records the call script of a dependency-free ring all-reduce (default: 16 GPUs, 4 MiB, 400G non-blocking
leaf-spine, cc none, 1000-byte payloads, as docs/status.md's "per-packet cost" row), replays it with the
standalone runner of each build given (CPU seconds of the whole process, best of --repeat), and, if valgrind is
installed, counts the instructions of one replay with callgrind (the same count on a loaded machine). A build
older than ns3::PhantoraWheelScheduler runs ns3::MapScheduler (`--scheduler` of each build: the first
scheduler its runner accepts).

    .venv/bin/python bench/bench_per_packet.py                                   # ns3-scratch/build
    .venv/bin/python bench/bench_per_packet.py --build /work/wt13p-oldbuild --build ns3-scratch/build
    .venv/bin/python bench/bench_per_packet.py --gpus 16 --bytes 64MiB --no-callgrind
    # the exact mode's per-event cost (issue 38): NVLink as packets on DGX-like hosts, DCQCN; keep the profile
    .venv/bin/python bench/bench_per_packet.py --topology testbed16 --cc dcqcn --keep-callgrind /tmp/cg.out
    # cache misses per event (cachegrind's simulated caches: the same counts under any load), a large fabric
    .venv/bin/python bench/bench_per_packet.py --build OLD --build NEW --topology leafspine1024 --bytes 128KiB \
        --cc dcqcn --repeat 1 --no-callgrind --cache-sim
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_packet import allreduce_flows, fabric

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.base import Flow
from phantora.netsim.packet import Ns3Simulator, runner_path
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from phantora.units import parse_size_bytes

SCHEDULERS = ("ns3::PhantoraWheelScheduler", "ns3::MapScheduler")


def record(script: Path, topo: Topology, nbytes: int, cc: str) -> None:
    """The call script of a ring all-reduce of `nbytes` over every GPU of `topo`, each flow submitted at 0, no deps."""
    flows = [Flow(i, f.src, f.dst, f.size, key=i) for i, f in enumerate(allreduce_flows(topo, nbytes, "coarse", 2))]
    with Ns3Simulator(topo, PacketConfig(cc=cc), calls=script) as sim:
        sim.submit(flows, at=0)


def with_scheduler(script: Path, scheduler: str, out: Path) -> Path:
    text = re.sub(
        r"^SetParam fabric\.Scheduler .*$", f"SetParam fabric.Scheduler {scheduler}", script.read_text(), flags=re.M
    )
    out.write_text(text)
    return out


def replay(runner: Path, script: Path, out: Path) -> tuple[dict[str, float], float]:
    """Run the runner once: its JSON summary and the CPU seconds of the process."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([str(runner), str(script), str(out)], capture_output=True, text=True, check=True)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime


def callgrind(runner: Path, script: Path, out: Path, keep: Path | None = None) -> int:
    """Instructions of one replay (valgrind --tool=callgrind); the profile kept at `keep` if given."""
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={keep or out / 'callgrind.out'}",
            str(runner),
            str(script),
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if not match:
        raise RuntimeError("callgrind printed no instruction count")
    return int(match.group(1))


# Cache geometry of the simulated misses (--cache-sim): a first level of 48 KiB, 12-way, and a last level of 2 MiB,
# 16-way, 64-byte lines (the development machine's AMD EPYC has 48 KiB of L1d and 1 MiB of L2 a core, 32 MiB of
# shared L3). Fixed, so the counts are the same on any machine and under any load.
CACHE_SIM = ("--D1=49152,12,64", "--LL=2097152,16,64")


def cache_misses(runner: Path, script: Path, out: Path) -> dict[str, int]:
    """Data references and simulated data-cache misses of one replay (valgrind --tool=cachegrind --cache-sim=yes)."""
    proc = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=yes", *CACHE_SIM, "--cachegrind-out-file=/dev/null"]
        + [str(runner), str(script), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    counts = {}
    for name, label in (("refs", "D   refs"), ("d1_misses", "D1  misses"), ("ll_misses", "LLd misses")):
        match = re.search(rf"{label}:\s+([\d,]+)", proc.stderr)
        if not match:
            raise RuntimeError(f"cachegrind printed no '{label}'")
        counts[name] = int(match.group(1).replace(",", ""))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, action="append", help="build directory with phantora-ns3-runner (repeatable)")
    ap.add_argument("--gpus", type=int, default=16, help="GPUs of the non-blocking 400G leaf-spine (no --topology)")
    ap.add_argument("--topology", help="a named topology instead (testbed16: NVLink as packets inside DGX hosts)")
    ap.add_argument("--keep-callgrind", type=Path, help="write the (last build's) callgrind profile here")
    ap.add_argument("--bytes", default="4MiB", help="all-reduce size")
    ap.add_argument("--cc", default="none")
    ap.add_argument(
        "--repeat", type=int, default=3, help="replays per build for CPU seconds (best kept; builds alternate)"
    )
    ap.add_argument("--no-callgrind", action="store_true", help="skip the instruction count")
    ap.add_argument(
        "--cache-sim",
        action="store_true",
        help="also count simulated data-cache misses per event (cachegrind, fixed geometry: CACHE_SIM)",
    )
    args = ap.parse_args()
    if args.cache_sim and shutil.which("valgrind") is None:
        raise SystemExit("--cache-sim needs valgrind (cachegrind), not found on PATH (apt-get install valgrind)")
    builds = args.build or [runner_path().parent]
    use_cg = not args.no_callgrind and shutil.which("valgrind") is not None
    if not args.no_callgrind and not use_cg:
        print("valgrind not found: no instruction counts")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        script = d / "calls.txt"
        topo = load_topology(args.topology) if args.topology else fabric(args.gpus, "400Gbps")
        record(script, topo, parse_size_bytes(args.bytes), args.cc)
        where = args.topology or f"{args.gpus} GPUs"
        print(f"{where}, ring all-reduce {args.bytes}, cc {args.cc}, 1000-byte payloads, standalone runner")
        head = f"{'events':>10}{'data pkts':>10}{'CPU s':>8}{'M ev/CPU s':>11}{'instr/pkt':>11}"
        print(f"{'build':<40}{'scheduler':<30}{head}")
        # Each build's first replay finds its scheduler; the repeats then alternate between the builds, so on a
        # shared machine every build meets the same swings of load (the CPU seconds kept: each build's best).
        runs: list[tuple[Path, str, Path, dict[str, float], float]] = []
        for i, build in enumerate(builds):
            runner = build / "phantora-ns3-runner"
            for sched in SCHEDULERS:  # the first one this build knows
                s = with_scheduler(script, sched, d / f"calls-{i}.txt")
                try:
                    summary, cpu = replay(runner, s, d / "o")
                    break
                except subprocess.CalledProcessError:
                    continue
            else:
                raise SystemExit(f"{runner}: runs with none of {', '.join(SCHEDULERS)}")
            runs.append((runner, sched, s, summary, cpu))
        for _ in range(args.repeat - 1):
            for i, (runner, sched, s, summary, cpu) in enumerate(runs):
                runs[i] = (runner, sched, s, summary, min(cpu, replay(runner, s, d / "o")[1]))
        for build, (runner, sched, s, summary, cpu) in zip(builds, runs, strict=True):
            pkts = summary["data_packets"]
            instr = f"{callgrind(runner, s, d / 'o', args.keep_callgrind) / pkts:>11,.0f}" if use_cg else f"{'-':>11}"
            print(
                f"{str(build):<40}{sched:<30}{summary['events']:>10}{pkts:>10}{cpu:>8.2f}"
                f"{summary['events'] / cpu / 1e6:>11.2f}{instr}"
            )
            if args.cache_sim:
                m = cache_misses(runner, s, d / "o")
                ev = summary["events"]
                print(
                    f"{'':<40}data refs {m['refs'] / ev:.1f}, first-level misses {m['d1_misses'] / ev:.2f}, "
                    f"last-level misses {m['ll_misses'] / ev:.2f} per event (set-up included)"
                )


if __name__ == "__main__":
    main()
