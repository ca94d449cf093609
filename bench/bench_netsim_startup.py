"""`phantora netsim --network ns3` start-up: wall and CPU seconds of a small packet-mode run, the standalone runner
(the default) against the in-process engine (`PHANTORA_NETSIM_ENGINE=inprocess`, which imports ns-3's Python
bindings), side by side; plus where the in-process start-up goes (Python and phantora's imports, `from ns import
ns`). Prints figures, asserts nothing; the machine may be shared, so CPU seconds are the steadier figure.

    .venv/bin/python bench/bench_netsim_startup.py                 # README's first netsim line, best of 3
    .venv/bin/python bench/bench_netsim_startup.py --repeat 5 -- --cc dcqcn -t star8 -f incast4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from cpu_timing import run_timed

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["--cc", "hpcc", "--topology", "hpcc/star8", "--flows", "workloads/incast4.flows.txt"]


def measure(cmd: list[str], repeat: int, env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(best wall, median wall, best CPU) over `repeat` runs."""
    runs = [run_timed(cmd, ROOT, env)[:2] for _ in range(repeat)]
    walls = [w for w, _ in runs]
    return min(walls), statistics.median(walls), min(c for _, c in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant (default 3)")
    ap.add_argument("--no-phases", action="store_true", help="skip timing the imports alone")
    ap.add_argument("netsim", nargs="*", help="netsim arguments after --network ns3 (default: README's first line)")
    args = ap.parse_args()
    py = sys.executable
    netsim = [py, "-m", "phantora.cli", "netsim", "--network", "ns3", *(args.netsim or DEFAULT), "--quiet"]
    print(f"$ phantora {' '.join(netsim[3:])}   (best of {args.repeat}; load {os.getloadavg()[0]:.1f})")
    rows = {
        "runner (default)": measure(netsim, args.repeat),
        "in-process (bindings)": measure(netsim, args.repeat, {"PHANTORA_NETSIM_ENGINE": "inprocess"}),
    }
    if not args.no_phases:
        parser = "from phantora.cli import build_parser; build_parser()"  # every command's module imported
        rows["  python + the CLI's parser"] = measure([py, "-c", parser], args.repeat)
        rows["  from ns import ns (cppyy)"] = measure([py, "-c", "from ns import ns"], args.repeat)
    base = rows["runner (default)"]
    print(f"{'variant':34} {'wall best':>10} {'wall median':>12} {'CPU best':>10} {'x runner (CPU)':>15}")
    for name, (best, median, cpu) in rows.items():
        print(f"{name:34} {best:9.2f}s {median:11.2f}s {cpu:9.2f}s {cpu / base[2]:14.1f}x")


if __name__ == "__main__":
    main()
