"""A live run's planning with and without the memo of repeated collectives (`collectives/plan_memo.py`).

`python bench/bench_plan_memo.py RUN_DIR [--order off,on,on,off] [--calls 3,6,7]` plans the collectives a
`phantora run` recorded (cosim.json's `collectives`: kind, group, bytes, dtype, root, name, in launch order) on its
topology, model, granularity and rank deduplication (config.json, results.json), as the coordinator's
`CollectivePlanner` does, once per pass in `--order` (each pass a fresh planner, the memo off or on), and prints each
pass's CPU seconds, the memo's copies and a key of the planned flows (sha256 of every flow's fields in order with each
call's live ranks' last flows and choice, 16 hex digits): every pass's key must be the same. `--calls`: only those
calls (cosim.json ids). Each pass lies between ``os.getsid(0)`` marks: under ``valgrind --tool=callgrind
--dump-before=getsid`` it is one dump part (`bench/plan_marks.py sum DIR` prints them; the passes are parts 2, 4, ...).
Flows the coordinator gets from a job table or a lossy policy are not modelled (no such call in cosim.json here).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives.mirrors import Mirrors
from phantora.collectives.nccl import with_nccl_env
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.collectives.spec import AlgoOptions
from phantora.topology import load_topology


def calls(run: Path, only: set[int] | None) -> tuple[CollectivePlanner, CollectivePlanner, list[tuple[CallSpec, str]]]:
    """(a planner with the memo, one without, the run's calls with their tags)."""
    config = json.loads((run / "config.json").read_text())["options"]
    results = json.loads((run / "results.json").read_text())
    cosim = json.loads((run / "cosim.json").read_text())
    topo = load_topology(config["topology"])
    env = results.get("nccl", {}).get("env") or {}
    algo = with_nccl_env(AlgoOptions(model=config["collective_model"], granularity=cosim["granularity"]), env)
    world, live = results["world_size"], results["live_processes"]
    out = []
    for c in cosim["collectives"]:
        if only is not None and c["id"] not in only:
            continue
        if c["kind"] == "send_recv":
            raise SystemExit(f"{run}/cosim.json: call {c['id']} is a send/recv, which this bench does not replan")
        group = tuple(c["group"])
        root = group.index(c["root"]) if c["root"] is not None else None
        out.append((CallSpec(c["kind"], group, c["nbytes"], c["dtype"], root, c["name"]), c["name"]))
    on = CollectivePlanner(topo, algo, Mirrors(world, live))
    off = CollectivePlanner(topo, algo, Mirrors(world, live), memo=False)
    return on, off, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--order", default="off,on,on,off")
    ap.add_argument("--calls", default="")
    a = ap.parse_args()
    only = {int(x) for x in a.calls.split(",")} if a.calls else None
    order = a.order.split(",")
    if not order or set(order) - {"on", "off"}:
        raise SystemExit(f"--order {a.order!r}: a comma-separated list of on and off")
    keys = set()
    for mode in order:
        on, off, todo = calls(a.run, only)
        planner = on if mode == "on" else off
        h = hashlib.sha256()
        flows = 0
        c0 = time.process_time()
        os.getsid(0)
        plans = [planner.plan(call, tag) for call, tag in todo]
        os.getsid(0)
        cpu = time.process_time() - c0
        for plan in plans:
            flows += len(plan.flows)
            for f in plan.flows:
                h.update(repr(tuple(getattr(f, x.name) for x in dataclasses.fields(f))).encode())
            h.update(repr((sorted((r, sorted(v)) for r, v in plan.last.items()), plan.choice)).encode())
        key = h.hexdigest()[:16]
        keys.add(key)
        copies = f", {planner.memo.copies} of {len(todo)} calls copied" if planner.memo is not None else ""
        print(f"memo {mode:3}: {len(todo)} calls, {flows:,} flows, planning CPU {cpu:.3f} s{copies}, key {key}")
    print("keys equal" if len(keys) == 1 else f"KEYS DIFFER: {sorted(keys)}")
    if len(keys) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
