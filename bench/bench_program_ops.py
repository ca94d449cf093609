"""CPU time per op of whole programs in one rank of `phantora run`, side by side, before and after.

    .venv/bin/python bench/bench_program_ops.py [--programs gpt_ddp,cuda_ddp,llama_phantom,hf_trainer]
                                                [--baseline REV] [--launches 2]

Each program runs as one rank of testbed16 (flow network); its rank's CPU seconds of the run phase
(results.json `run.cpu_s.ranks`) divided by the ops it dispatched (`ranks[0].ops`) is printed in µs per op, with the
ops and the simulated step time (`step_time_ns`'s mean, which must not differ between the trees). The cost per op is the
whole rank's: the model's own arithmetic, autograd and the optimizer included, not only phantora's dispatch
(`bench_simcuda_dispatch.py` times that alone on one op). With `--baseline REV`, the tree at REV (exported and its
compiled path built, ab_trees.py) and this one run alternately, `--launches` times each, so both see the same load.

Programs: gpt_ddp (examples/gpt_ddp.py --steps 20: CPU tensors, charged as GPU work), cuda_ddp (examples/cuda_ddp.py
--steps 200: cuda tensors of the simulated GPU), llama_phantom (examples/llama_train.py --model tiny --steps 5 in
--phantom mode: meta tensors), gpt_fsdp (examples/gpt_fsdp.py --steps 20: FSDP2, its parameters and optimizer
state DTensors over CPU tensors), hf_trainer (examples/hf_trainer.py --max_steps 10, a Trainer with the HF extra),
cpu_add (20,000 torch.add of 4-element CPU tensors: the per-op path of a program on CPU tensors, almost alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ab_trees import export_revision

ROOT = Path(__file__).resolve().parent.parent

PROGRAMS: dict[str, tuple[list[str], list[str]]] = {  # name -> (run options, script and its arguments)
    "gpt_ddp": ([], ["examples/gpt_ddp.py", "--steps", "20"]),
    "cuda_ddp": ([], ["examples/cuda_ddp.py", "--steps", "200"]),
    "llama_phantom": (["--phantom"], ["examples/llama_train.py", "--model", "tiny", "--steps", "5"]),
    "gpt_fsdp": ([], ["examples/gpt_fsdp.py", "--steps", "20"]),
    "hf_trainer": ([], ["examples/hf_trainer.py", "--output_dir", "{tmp}/hf", "--max_steps", "10"]),
    "cpu_add": ([], ["{tmp}/cpu_add.py"]),
}
# 20,000 adds of two 4-element CPU tensors in a program that makes no cuda tensor: its ops are charged as GPU work,
# and the rank's CPU time is almost all the per-op path's
CPU_ADD = """import torch
a, b = torch.randn(4), torch.randn(4)
for _ in range(20000):
    torch.add(a, b)
"""


def run_once(tree: Path, name: str) -> dict[str, float]:
    """One launch of program `name` from `tree`: its rank's CPU µs per op, ops, CPU s and step time (ns)."""
    opts, script = PROGRAMS[name]
    with tempfile.TemporaryDirectory(prefix="phantora-progops-") as tmp:
        Path(tmp, "cpu_add.py").write_text(CPU_ADD)
        out = Path(tmp) / "run"
        code = "import sys; from phantora.cli import main; sys.argv[0] = 'phantora'; sys.exit(main())"
        cmd = [sys.executable, "-c", code, "run", "--topology", "testbed16", "--nproc", "1", "--out", str(out)]
        cmd += opts + [a.replace("{tmp}", tmp) for a in script]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed in {tree}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        res = json.loads((out / "results.json").read_text())
    cpu = float(res["run"]["cpu_s"]["ranks"])
    ops = int(res["ranks"][0]["ops"])
    step = float((res.get("step_time_ns") or {}).get("mean") or 0)
    return {"us_per_op": cpu / ops * 1e6, "ops": ops, "cpu_s": cpu, "step_ns": step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--programs", default="cpu_add,gpt_ddp,cuda_ddp,llama_phantom,gpt_fsdp", help=f"of {', '.join(PROGRAMS)}"
    )
    p.add_argument("--baseline", help="a git revision to run beside this tree")
    p.add_argument("--launches", type=int, default=2)
    a = p.parse_args()
    names = [n for n in a.programs.split(",") if n]
    for n in names:
        if n not in PROGRAMS:
            raise SystemExit(f"--programs: unknown program {n!r} (known: {', '.join(PROGRAMS)})")
    rows: dict[str, dict[str, list[dict[str, float]]]] = {n: {} for n in names}
    with tempfile.TemporaryDirectory(prefix="phantora-progops-base-") as base:
        trees = {"this tree": ROOT}
        if a.baseline:  # before, then after, alternately: both see the same load
            before = export_revision(a.baseline, Path(base) / "tree")
            trees = {f"before ({a.baseline})": before, "after (this tree)": ROOT}
        for _ in range(a.launches):
            for n in names:
                for label, tree in trees.items():
                    rows[n].setdefault(label, []).append(run_once(tree, n))
    print(f"{'program':<14} {'tree':<22} {'ops':>7} {'CPU s':>14} {'µs/op median':>13} {'min':>7}  step time ns")
    for n, by_tree in rows.items():
        for label, samples in by_tree.items():
            per = [s["us_per_op"] for s in samples]
            cpus = ", ".join(f"{s['cpu_s']:.2f}" for s in samples)
            steps = sorted({s["step_ns"] for s in samples})
            print(
                f"{n:<14} {label:<22} {int(samples[0]['ops']):>7} {cpus:>14} {statistics.median(per):>13.1f} "
                f"{min(per):>7.1f}  {', '.join(f'{x:.0f}' for x in steps)}"
            )


if __name__ == "__main__":
    main()
