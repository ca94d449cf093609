"""`phantora nccl-tests --network ns3` start-up: ns-3 loaded as phantora loads it (the core, network and stats
libraries and the fabric's facade header; ns-3's own headers only when asked, `Ns3Runtime.ns`) against the ns3
wheel's `from ns import ns` (every module's headers), in one run, the same command each way.

    .venv/bin/python bench/bench_nccl_tests_ns3_startup.py

Prints each way's wall and CPU seconds (children included) and whether the two tables are identical (the Pid
lines of the device list aside).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cpu_timing import run_timed

ROOT = Path(__file__).resolve().parents[1]  # the run's cwd: `python -c` then imports this tree's phantora
COMMAND = ["nccl-tests", "all_reduce_perf", "--topology", "testbed16", "--network", "ns3"]
COMMAND += ["-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1"]
WHEEL = "import phantora.netsim.packet as p; p._quiet_import_ns = lambda headers=True: __import__('ns').ns; "
LEAN = ""


def run(prelude: str) -> tuple[float, float, list[str]]:
    """Wall and CPU seconds of one run of COMMAND, and its table (Pid lines dropped)."""
    code = prelude + f"import sys; from phantora.cli import main; sys.exit(main({COMMAND!r}))"
    wall, cpu, out = run_timed([sys.executable, "-c", code], ROOT)
    return wall, cpu, [line for line in out.splitlines() if " Pid " not in line]


def main() -> None:
    print("phantora " + " ".join(COMMAND))
    tables = []
    for label, prelude in (("ns-3 core+network+stats libraries", LEAN), ("the wheel's from ns import ns", WHEEL)):
        wall, cpu, table = run(prelude)
        tables.append(table)
        print(f"{label}: {wall:.1f} s wall, {cpu:.1f} CPU s")
    print("tables identical" if tables[0] == tables[1] else "TABLES DIFFER")


if __name__ == "__main__":
    main()
