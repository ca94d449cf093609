"""Instructions per op of the simulated GPU's fast path, counted by callgrind: a figure the load does not move.

    .venv/bin/python bench/bench_simcuda_instructions.py [--baseline REV] [--torch] [--variants]

CPU time on a shared machine moves by ±20 % with the load; the number of instructions an op executes does not.
This runs `fastpath.device_op` (what the dispatch mode calls for an op on cuda tensors: unwrap, run, count memory,
charge, wrap) on `torch.add` of two 4-element tensors of the simulated GPU in one process, outside a rank (no
dispatch mode: the mode's own cost, torch's, is not counted), under `valgrind --tool=callgrind` with counting
switched on around the loop only, for `--ops` and 3 x `--ops` ops; the difference divided by the extra ops is
the count per op (the loop's set-up and the switching cancel). The trace is off, as in bench_simcuda_dispatch.py.

- `--baseline REV`: the same for the tree at git revision REV (`git archive`), before this tree.
- `--torch`: for scale, in the same run, plain torch.add of the two tensors' host data (no mode), and this tree's
  whole op as a program in a rank calls it: torch.add of the two cuda tensors under the rank's dispatch mode
  (`ChargeMode`; the mode's own cost, torch's Python dispatch, counted too); with `--baseline`, the whole op of
  the tree before too.
- `--gemm`: a bf16 `aten.mm` of [2048, 4096] by [4096, 4096] meta tensors, and F.linear(x, w)'s `aten.mm(x, w.t())`
  with the weight a transposed view, in phantom mode under the calibrated model (a matrix product's cost depends on
  its operands' layout there: runtime/compute.py), for this tree (and the `--baseline` tree). torch's own meta mm
  (a Python meta function) is counted in each; with a bias aten runs addmm, whose meta version is a Python
  decomposition many times slower (timeit), so the bias is left out. 2026-12-04, `--gemm --baseline b765c772
  --ops 500` (0035655c by the same command in its own tree): the mm 149,525 at b765c772, 164,886 at 0035655c,
  149,522 after; F.linear's mm 149,482, 164,899, 152,337 (docs/runtime.md).
- `--variants`: this tree with parts switched off: no memory tracking (PHANTORA_MEMORY=off), the tracker's
  bookkeeping off (only the storage object and a weak reference with an empty callback are made), the caching
  allocator model off, no charge.
Needs valgrind; about a minute per count at load 10.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from ab_trees import export_revision

ROOT = Path(__file__).resolve().parent.parent
GEMMS = {  # the variants of `--gemm`: a bf16 product of meta tensors in phantom mode, the calibrated model
    "bf16 mm": "bf16 mm [2048, 4096] x [4096, 4096]",
    "bf16 linear": "bf16 F.linear's mm(x, w.t())",
}

SCRIPT = """
import os, subprocess, sys, weakref, torch
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.compute import Roofline
from phantora.perfmodel.gpus import get_gpu
from phantora.runtime.simcuda import fastpath
from phantora.runtime.simcuda.tensor import SimCudaTensor
OPS, VARIANT = int(sys.argv[1]), sys.argv[2]
GEMMS = ("bf16 mm", "bf16 linear")
add = torch.ops.aten.add.Tensor
s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
s.report_every_ns = 1 << 62  # the clock report depends on real time: off, so that the count is exact
if VARIANT == "no charge":
    s.charge = lambda name, cost: None
if VARIANT == "no allocator model":
    class NoAllocator:
        reserved = 0
        def malloc(self, key, size): pass
        def free(self, key): pass
    s.memory.allocator = NoAllocator()
if VARIANT == "no tracker bookkeeping":
    refs = {}
    def on_tensor(t, site):
        st = t.untyped_storage()
        refs[0] = weakref.ref(st, lambda r: None)
    s.memory.on_tensor = on_tensor
a, b = SimCudaTensor(torch.randn(4), 0), SimCudaTensor(torch.randn(4), 0)
op = fastpath.device_op
call = (add, (a, b))
if VARIANT in GEMMS:  # a bf16 product of meta tensors in phantom mode, costed by the calibrated model
    from phantora.runtime.compute import build_model
    s = RankSession(0, 1, NoNetworkClient(), build_model("calibrated", "h100"), trace_level="none", phantom=True)
    s.report_every_ns = 1 << 62
    def meta(*shape):
        return torch.empty(*shape, device="meta", dtype=torch.bfloat16)
    x, w = SimCudaTensor(meta(2048, 4096), 0), SimCudaTensor(meta(4096, 4096), 0)
    if VARIANT == "bf16 mm":
        call = (torch.ops.aten.mm.default, (x, w))
    else:  # F.linear(x, w) of a 2-D x as aten runs it: mm(x, w.t()), the weight a transposed view
        call = (torch.ops.aten.mm.default, (x, SimCudaTensor(meta(4096, 4096).t(), 0)))
    assert op(s, *call, {}) is not fastpath.SLOW
def toggle(state):
    subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], stdout=subprocess.DEVNULL, check=True)
if VARIANT == "plain torch":  # torch.add of the two host tensors, no mode: torch's own cost
    a, b = a.elem, b.elem
if VARIANT in ("plain torch", "through the dispatch mode"):
    from contextlib import nullcontext
    mode = nullcontext()
    if VARIANT == "through the dispatch mode":  # torch.add(a, b) as a program calls it in a rank
        from phantora.runtime.dispatch import ChargeMode
        from phantora.runtime.simcuda import device
        device._installed = True  # what simcuda.install sets in a rank (the device guard is not loaded here)
        mode = ChargeMode(s)
    with mode:
        for _ in range(200):
            torch.add(a, b)
        toggle("on")
        for _ in range(OPS):
            torch.add(a, b)
        toggle("off")
    sys.exit(0)
func, fargs = call
for _ in range(200):
    op(s, func, fargs, {})
toggle("on")
for _ in range(OPS):
    op(s, func, fargs, {})
toggle("off")
"""


def _count(tree: Path, script: Path, ops: int, variant: str, tmp: Path) -> int:
    """Instructions callgrind counted between the toggles for `ops` ops of `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    if variant == "no memory tracking":
        env["PHANTORA_MEMORY"] = "off"
    out = tmp / "callgrind.out"
    args = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    args += [sys.executable, str(script), str(ops), variant]
    done = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run failed ({tree}, {variant}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_op(tree: Path, script: Path, ops: int, variant: str, tmp: Path) -> float:
    """Instructions per op: the count for 3 x `ops` ops minus that for `ops`, over 2 x `ops`."""
    return (_count(tree, script, 3 * ops, variant, tmp) - _count(tree, script, ops, variant, tmp)) / (2 * ops)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--baseline", help="a git revision to count too (its tree, exported)")
    p.add_argument("--variants", action="store_true", help="this tree with parts switched off, too")
    p.add_argument("--torch", action="store_true", help="plain torch.add and the whole op under the mode, too")
    p.add_argument("--gemm", action="store_true", help="bf16 mm and F.linear's addmm under the calibrated model, too")
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("this benchmark needs valgrind (callgrind and callgrind_control) on PATH")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "device_op.py"
        script.write_text(textwrap.dedent(SCRIPT))
        runs: list[tuple[str, Path, str]] = []
        if args.baseline:
            before = export_revision(args.baseline, tmp / "baseline")
            runs.append((f"before ({args.baseline})", before, "as shipped"))
            if args.torch:
                whole = f"before ({args.baseline}), torch.add under the mode"
                runs.append((whole, before, "through the dispatch mode"))
        runs.append(("this tree", ROOT, "as shipped"))
        if args.torch:
            runs.append(("plain torch.add (host tensors, no mode)", ROOT, "plain torch"))
            runs.append(("this tree, torch.add under the rank's mode", ROOT, "through the dispatch mode"))
        if args.variants:
            for variant in ("no memory tracking", "no tracker bookkeeping", "no allocator model", "no charge"):
                runs.append((f"this tree, {variant}", ROOT, variant))
        if args.gemm:
            for variant, what in GEMMS.items():
                if args.baseline:
                    runs.append((f"before ({args.baseline}), {what}", before, variant))
                runs.append((f"this tree, {what}", ROOT, variant))
        print("fastpath.device_op(torch.add of two 4-element cuda tensors), instructions per op (callgrind):")
        for name, tree, variant in runs:
            print(f"  {name:56s} {per_op(tree, script, args.ops, variant, tmp):9,.0f}", flush=True)


if __name__ == "__main__":
    main()
