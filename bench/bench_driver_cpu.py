"""The driver's own CPU in one `phantora` command, split: the simulation (`run_engine`), results writing
(`write_network_files`) and the rest (start-up, graph load, planning); plus its child processes' CPU (a
decomposed run's workers). CPU seconds, because the machine is shared. Prints one line; the command's own
output goes on as usual. Used for docs/packet-model.md, "The driver's serial CPU":

    PYTHONPATH=. .venv/bin/python bench/bench_driver_cpu.py replay G --topology rail128 --network ns3 --cc dcqcn \\
        --set nvlink=fluid --set wire=roce4k --set nic_latency=1us --set workers=2 -o /tmp/x --overwrite --no-progress

`engine_stats.decompose.critical_cpu_s` in the run's results.json gives the workers' critical path.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from cpu_timing import cpu_timed

import phantora.egraph.replay as egraph_replay
import phantora.results.write as results_write
from phantora.cli import main

spent = {"engine": 0.0, "write": 0.0}


def run(argv: list[str]) -> int:
    egraph_replay.run_engine = cpu_timed(spent, "engine", egraph_replay.run_engine)  # type: ignore[assignment]
    results_write.write_network_files = cpu_timed(spent, "write", results_write.write_network_files)  # type: ignore[assignment]
    rc = main(argv)
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime
    rest = total - spent["engine"] - spent["write"]
    print(
        f"driver CPU {total:.2f} s: run_engine {spent['engine']:.2f}, write_network_files {spent['write']:.2f}, "
        f"start-up/load/plan {rest:.2f}; child processes {kids.ru_utime + kids.ru_stime:.2f} s",
        file=sys.stderr,
    )
    return rc


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
