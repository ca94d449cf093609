"""Wall time of a torchtitan training step on the simulated CUDA device, for two trees alternately in one run.

    .venv/bin/python bench/bench_titan_step_wall.py --baseline REV [--steps 8] [--launches 2]

torchtitan's own train.py with llama3_debugmodel (FSDP2 on 2 ranks of testbed16, real tensors, sequence 256,
local batch 2, fp32: the configuration of tests/frameworks/test_torchtitan.py) runs `--steps` steps, from a copy
of the tree at REV (`git archive`) and from this tree, alternately, `--launches` times each. The launcher is told
of each step all ranks finished (`RunConfig.on_step`) and notes the wall clock; the figure is the median wall time
between consecutive steps from the third on (start-up and the first steps are left out).
Every op of the model's steps goes through the simulated device, so this is what its per-op cost means for a run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ab_trees import alternately

ROOT = Path(__file__).resolve().parent.parent

DRIVER = """
import json, sys, time
from pathlib import Path
import torchtitan
from phantora.launcher import RunConfig, launch
steps, out = int(sys.argv[1]), sys.argv[2]
args = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", str(steps),
        "--training.seq_len", "256", "--training.local_batch_size", "2", "--training.mixed_precision_param", "float32",
        "--parallelism.spmd_backend", "partial_dtensor", "--training.disable_cuda_graphs", "--debug.seed", "42"]
walls = []
train = str(Path(torchtitan.__file__).parent / "train.py")
launch(RunConfig(train, args, "testbed16", nproc=2, tensors="real", trace="none", timeout_s=900,
                 on_step=lambda step: walls.append(time.perf_counter())))
json.dump(walls, open(out, "w"))
"""


def _run(tree: Path, work: Path, steps: int, out: Path) -> list[float]:
    """Per-step wall times (s) of one run with phantora imported from `tree`, started in `work` (the assets)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "-c", DRIVER, str(steps), str(out)], cwd=work, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    walls: list[float] = json.loads(out.read_text())
    return [b - a for a, b in zip(walls[2:], walls[3:], strict=False)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="a git revision to compare against")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--launches", type=int, default=2)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "frameworks"))
    from assets import make_torchtitan_assets

    with tempfile.TemporaryDirectory() as tmp:
        work = make_torchtitan_assets(Path(tmp) / "titan")
        walls = Path(tmp) / "walls.json"
        times = alternately(
            args.baseline, Path(tmp) / "baseline", args.launches, lambda tree: _run(tree, work, args.steps, walls)
        )
    print(f"torchtitan llama3_debugmodel, FSDP2 on 2 ranks, real tensors: wall s per step ({args.launches} launches of "
          f"each tree, alternately; the step-to-step times after step 3 of {args.steps}):")  # fmt: skip
    for name, values in times.items():
        values = sorted(values)
        print(f"  {name:24s} median {values[len(values) // 2]:6.3f}   min {values[0]:6.3f}   (n = {len(values)})")


if __name__ == "__main__":
    main()
