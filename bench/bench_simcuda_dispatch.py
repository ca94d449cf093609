"""What an op on the simulated CUDA device costs, before and after, and part by part, on one machine in one run.

    .venv/bin/python bench/bench_simcuda_dispatch.py [--ops 2000] [--reps 6] [--baseline REV] [--launches 3]

A rank of `phantora run` (1 GPU of testbed16, no trace) times `torch.add` of two 4-element cuda tensors in CPU
time (`time.process_time`: less disturbed by other jobs on a shared machine than wall time), `--reps` times
`--ops` ops, and the median and the minimum are printed in µs per op.

- With `--baseline REV`, the same rank runs from a copy of the tree at REV (`git archive`) and from this tree,
  alternately, `--launches` times each, so both see the same load: the cost before and after, as shipped and
  beside a thread the program started (the last two parts below).
- In this tree's rank, the parts are switched off in turn, interleaved: the fast path (simcuda/fastpath.py),
  then the unwrapped op charged without a second trip through the dispatcher (tensor.run_op with the mode's
  charging path), then the round trip (the mode answers NotImplemented, the cuda tensors' own dispatch
  unwraps the op and sends it through the dispatcher and the mode again). For scale: an op on host
  tensors (the mode's host-work answer), torch.add with no mode at all, and the floor of this design: a bare
  dispatch mode over a bare wrapper subclass that only unwraps the arguments, runs the op and wraps its output
  (no memory, no charge, no checks). Last, the op as shipped while a thread the program started is alive, one
  that ran only host work (a DataLoader's pin-memory thread), then one that ran GPU work: the rank's ops then run
  one at a time under one lock (runtime/dispatch.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from ab_trees import export_revision

ROOT = Path(__file__).resolve().parent.parent

RANK_SCRIPT = """
import json, sys, torch
from time import process_time as clock
OPS, REPS, OUT, PARTS = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "parts"
torch.cuda.set_device(0)
a, b = torch.randn(4, device="cuda"), torch.randn(4, device="cuda")
ha, hb = torch.randn(4), torch.randn(4)
def per_op(x, y):
    t = clock()
    for _ in range(OPS):
        torch.add(x, y)
    return (clock() - t) / OPS * 1e6
def no_mode():
    from torch.utils._python_dispatch import _pop_mode_temporarily
    with _pop_mode_temporarily():
        return per_op(ha, hb)
def bare():
    from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode_temporarily
    META = torch.device("meta")
    class Bare(torch.Tensor):
        __torch_function__ = torch._C._disabled_torch_function_impl
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise AssertionError("the mode answers every op")
    def wrap(e):
        r = torch.Tensor._make_wrapper_subclass(Bare, e.size(), strides=e.stride(), dtype=e.dtype, device=META)
        r.elem = e
        return r
    class Unwrap(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return wrap(func._op(*[x.elem for x in args]))
    method = Unwrap.__dict__["__torch_dispatch__"]
    Unwrap.__torch_dispatch__ = getattr(method, "__wrapped__", method)  # as dispatch.py: no dynamo guard
    with _pop_mode_temporarily(), Unwrap():
        return per_op(wrap(ha), wrap(hb))
def beside_a_thread(x, y):
    import threading
    go, done = threading.Event(), threading.Event()
    def run():
        torch.add(x, y)  # while it lives, the rank's ops run in turn (dispatch.py)
        go.set()
        done.wait()
    t = threading.Thread(target=run)
    t.start()
    go.wait()
    try:
        return per_op(a, b)
    finally:
        done.set()
        t.join()
variants = {"as shipped": lambda: None}
BESIDE = {
    "beside a host-only thread (ops in turn)": lambda: beside_a_thread(ha, hb),
    "beside a thread's GPU work (ops in turn)": lambda: beside_a_thread(a, b),
}
if PARTS:
    from phantora.runtime.simcuda import device as simcuda, fastpath
    fast, direct = fastpath.device_op, simcuda.direct
    def use(fast_on, direct_on):
        fastpath.device_op = fast if fast_on else (lambda *a: fastpath.SLOW)
        simcuda.direct = direct if direct_on else (lambda func: False)
    variants = {
        "fast path (as shipped)": lambda: use(True, True),
        "no fast path: run_op, charged in the mode": lambda: use(False, True),
        "round trip through the dispatcher": lambda: use(False, False),
    }
for _ in range(300):
    torch.add(a, b)
times = {name: [] for name in variants}
if PARTS:
    times["host tensors (the mode's host work)"] = []
    times["plain torch, no mode"] = []
    times["floor: a bare mode unwraps, runs, wraps"] = []
times.update({name: [] for name in BESIDE})
for _ in range(REPS):
    for name, switch in variants.items():
        switch()
        times[name].append(per_op(a, b))
    if PARTS:
        times["host tensors (the mode's host work)"].append(per_op(ha, hb))
        times["plain torch, no mode"].append(no_mode())
        times["floor: a bare mode unwraps, runs, wraps"].append(bare())
        use(True, True)  # as shipped
    for name, beside in BESIDE.items():
        times[name].append(beside())
if PARTS:
    use(True, True)
json.dump(times, open(OUT, "w"))
"""

LAUNCH = """
import sys
from phantora.launcher import RunConfig, launch
launch(RunConfig(sys.argv[1], sys.argv[2:], "testbed16", nproc=1, trace="none"))
"""


def _rank(tree: Path, script: Path, ops: int, reps: int, out: Path, parts: bool) -> dict[str, list[float]]:
    """Run the rank script once with phantora imported from `tree`; its per-variant times."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    args = [sys.executable, "-c", LAUNCH, str(script), str(ops), str(reps), str(out), "parts" if parts else "-"]
    subprocess.run(args, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    times: dict[str, list[float]] = json.loads(out.read_text())
    return times


def _print(title: str, times: dict[str, list[float]]) -> None:
    print(title)
    width = max(46, *(len(name) for name in times))
    for name, values in times.items():
        values = sorted(values)
        print(f"  {name:{width}s} median {values[len(values) // 2]:7.2f}   min {values[0]:7.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--baseline", help="a git revision to compare against (its tree, run alternately with this one)")
    p.add_argument("--launches", type=int, default=3, help="rank launches per tree with --baseline")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "dispatch_ab.py", Path(tmp) / "times.json"
        script.write_text(textwrap.dedent(RANK_SCRIPT))
        if args.baseline:
            trees = {f"before ({args.baseline})": export_revision(args.baseline, Path(tmp) / "baseline"),
                     "after (this tree)": ROOT}  # fmt: skip
            both: dict[str, list[float]] = {}
            for _ in range(args.launches):  # alternately: both see the same drift of the load
                for tree_name, tree in trees.items():
                    for name, values in _rank(tree, script, args.ops, args.reps, out, parts=False).items():
                        both.setdefault(f"{name}, {tree_name}", []).extend(values)
            _print(f"torch.add of two 4-element cuda tensors, CPU µs per op ({args.launches} launches of each "
                   f"tree, alternately, {args.reps} x {args.ops} ops each):", dict(sorted(both.items())))  # fmt: skip
        parts = _rank(ROOT, script, args.ops, args.reps, out, parts=True)
        _print(f"the parts, in one rank of this tree ({args.reps} interleaved runs of {args.ops} ops):", parts)


if __name__ == "__main__":
    main()
