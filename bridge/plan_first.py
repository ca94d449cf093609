"""A decomposition worker's start when its setup holds groups of a workload's ops (`RunSpec.plan_jobs`).

Run as ``python -m bridge.plan_first --setup <dir>/setup.msgpack ...`` (the network server's flags, passed on): it
plans the groups with only the planning's modules loaded and leaves the answer beside the setup
(`bridge.plan_groups.write_planned`, where the driver waits for it: `bridge.workers`), then runs the network server
(`bridge.netserver.main`), which loads the rest and ns-3. The driver's plan so waits for the worker's interpreter
and the collectives' modules, not for its whole start.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bridge.plan_groups import PLANNED, write_planned
from bridge.protocol import MAX_MESSAGE_BYTES
from bridge.runspec import RunSpec


def plan_ahead(setup: Path) -> None:
    """Plan the setup's groups of ops, if any, into `PLANNED` beside it; a setup that cannot be read is left to the
    network server, which names the error."""
    try:
        spec = RunSpec.read(setup)
    except Exception:  # noqa: BLE001 - `bridge.netserver.main` reads it again and reports it
        return
    if not spec.plan_jobs:
        return
    # numpy with the planning's other modules, before the plan's CPU is counted (`rank_last` imports it at its first
    # call): a one-time import, as the driver's and one engine's processes make it before their clocks start
    import numpy  # noqa: F401

    t0 = time.perf_counter()
    cpu = write_planned(setup.parent / PLANNED, spec.topology, spec.plan_jobs, MAX_MESSAGE_BYTES - 1024)
    line = f"planned {len(spec.plan_jobs)} groups of ops in {cpu:.2f} CPU s ({time.perf_counter() - t0:.2f} s)"
    print(f"[phantora netserver {os.getpid()}] {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(add_help=False)  # (the server's own parser checks every flag)
    parser.add_argument("--setup")
    known, _ = parser.parse_known_args(args)
    if known.setup:
        plan_ahead(Path(known.setup))
    from bridge import netserver  # (its modules, then ns-3's, load after the plan)

    return netserver.main(args)


if __name__ == "__main__":
    sys.exit(main())
