"""CPU time per op of what a traced run adds to each op: its trace chunk's text, and the compiled charge's recording.

    .venv/bin/python bench/bench_traced_ops.py [--ops 100000] [--reps 3] [--baseline REV] [--launches 3]

Every real run writes trace.json, with every compute op of its first `--trace-steps` steps. Two parts:

- write: a TraceRecorder holding `--ops` compute ops (four names, integer ns) turned into its chunk's line, by
  `append_to`'s route (the ops formatted straight to JSON text, runtime/trace_json.py) and by the dict route
  (`chunk_line(rank, step, take_events())`, each op a dict, then json.dumps), alternately in one process, `--reps`
  times each: CPU µs per op, median (min); the two lines must be equal.
- charge: `--ops` torch.add of two 4-element CPU tensors under a rank's ChargeMode with the trace at "ops" (a program
  that has made no cuda tensor: the compiled entry, simcuda/_fastop.c, charges and records each), in a process per
  launch: CPU µs per op. With `--baseline REV` the tree at REV (exported, its compiled path built: ab_trees.py) and
  this one alternately, `--launches` times each. Under `valgrind --tool=callgrind`, run `--part charge-once --ops N`
  for two N: the instructions' difference over the ops' is the count per op, which the load does not move.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab_trees import export_revision

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's phantora, not another install
NAMES = ("aten::add.Tensor", "aten::mm", "aten::_foreach_add_.List", "aten::native_layer_norm")


def write_part(ops: int, reps: int) -> None:
    """The chunk line of `ops` compute ops by append_to's route and by the dict route, alternately."""
    from phantora.results.trace_chunks import chunk_line
    from phantora.runtime.trace import TraceRecorder

    def recorder() -> TraceRecorder:
        rec = TraceRecorder(0, "ops")
        t = 0
        for i in range(ops):
            rec.op(NAMES[i % len(NAMES)], t, t + 1234 + i % 7)
            t += 2000 + i % 13
        rec.step(0, 0, t)
        return rec

    times: dict[str, list[float]] = {"append_to (text)": [], "chunk_line (dicts)": []}
    with tempfile.TemporaryDirectory(prefix="phantora-traced-") as tmp:
        for r in range(reps):
            path = Path(tmp) / f"rank{r}.jsonl"
            rec = recorder()
            c0 = time.process_time()
            rec.append_to(path, 0)
            times["append_to (text)"].append((time.process_time() - c0) / ops * 1e6)
            rec = recorder()
            c0 = time.process_time()
            line = chunk_line(0, 0, rec.take_events())
            with open(Path(tmp) / "dicts.jsonl", "w") as f:
                f.write(line)
            times["chunk_line (dicts)"].append((time.process_time() - c0) / ops * 1e6)
            if path.read_text() != line:
                raise SystemExit("the two routes wrote different lines")
    print(f"write: {ops} ops, CPU µs per op, median (min) of {reps}")
    for name, per in times.items():
        print(f"  {name:<20} {statistics.median(per):6.3f} ({min(per):.3f})")


CHARGE = """
import sys, time, torch
from phantora.perfmodel.gpus import get_gpu
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, device
from phantora.runtime.simcuda import tensor as simtensor
if compiled.load() is None:
    raise SystemExit("the compiled per-op path is not built")
device._installed, simtensor._seen = True, False  # a rank's program that has made no cuda tensor
ops = int(sys.argv[1])
s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="ops")
a, b = torch.randn(4), torch.randn(4)
with ChargeMode(s):
    for _ in range(1000):
        torch.add(a, b)
    c0 = time.process_time()
    for _ in range(ops):
        torch.add(a, b)
    c1 = time.process_time()
assert s.ops == ops + 1000 and len(s.trace._ops) == ops + 1000
print((c1 - c0) / max(ops, 1) * 1e6)
"""


def charge_once(tree: Path, ops: int) -> float:
    """CPU µs per op of `ops` traced adds in a fresh process on `tree`'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CHARGE, str(ops)], cwd=tree, env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"charge in {tree} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def charge_part(ops: int, baseline: str | None, launches: int) -> None:
    """Traced adds in this tree (and the baseline's, alternately): CPU µs per op."""
    with tempfile.TemporaryDirectory(prefix="phantora-traced-base-") as base:
        trees = {"this tree": ROOT}
        if baseline:
            trees = {f"before ({baseline})": export_revision(baseline, Path(base) / "tree"), "after (this tree)": ROOT}
        per: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(launches):
            for name, tree in trees.items():
                per[name].append(charge_once(tree, ops))
    print(f"charge: {ops} traced torch.add of CPU tensors, CPU µs per op, median (min) of {launches}")
    for name, xs in per.items():
        print(f"  {name:<22} {statistics.median(xs):6.3f} ({min(xs):.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--baseline", help="a git revision whose charge part runs beside this tree's")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--part", choices=["both", "write", "charge", "charge-once"], default="both")
    a = p.parse_args()
    if a.part == "charge-once":  # one process's loop, for callgrind
        sys.argv = [sys.argv[0], str(a.ops)]
        exec(compile(CHARGE, "<charge>", "exec"), {"__name__": "__charge__"})
        return
    if a.part in ("both", "write"):
        write_part(a.ops, a.reps)
    if a.part in ("both", "charge"):
        charge_part(a.ops, a.baseline, a.launches)


if __name__ == "__main__":
    main()
