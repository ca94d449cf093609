"""What the dispatch path of an op on the simulated CUDA device costs, part by part, A/B in one rank process.

    .venv/bin/python bench/bench_simcuda_dispatch.py [--ops 3000] [--reps 8]

One rank of `phantora run` (1 GPU of testbed16, no trace) times `torch.add` of two 4-element cuda tensors in
CPU time (`time.process_time`, less disturbed by other jobs on a shared machine than wall time), with the parts
switched on and off in turn, interleaved, so every variant sees the same load:

- torch's dynamo-disable wrapper around the dispatch mode's `__torch_dispatch__` (dispatch.py drops it where
  torch.compile runs eagerly; an op of the simulated GPU passes the mode twice);
- `rng.is_random` answered from a per-op cache, or from the op's tags each time.

Prints the median and the minimum over the repetitions, in µs per op.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
from pathlib import Path

RANK_SCRIPT = """
import json, sys, torch
from time import process_time as clock
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.simcuda import rng
OPS, REPS, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.cuda.set_device(0)
a, b = torch.randn(4, device="cuda"), torch.randn(4, device="cuda")
raw = ChargeMode.__dict__["__torch_dispatch__"]
guarded = torch._disable_dynamo(raw, recursive=True)  # what torch puts around a mode's dispatch
cached = rng.is_random
def from_tags(func):
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
variants = {
    "as shipped (no guard, cached)": (raw, cached),
    "with torch's dynamo guard": (guarded, cached),
    "is_random from the tags": (raw, from_tags),
    "both (before 7d1ac7f)": (guarded, from_tags),
}
def per_op():
    t = clock()
    for _ in range(OPS):
        torch.add(a, b)
    return (clock() - t) / OPS * 1e6
for _ in range(300):
    torch.add(a, b)
times = {name: [] for name in variants}
for _ in range(REPS):
    for name, (dispatch, is_random) in variants.items():
        ChargeMode.__torch_dispatch__, rng.is_random = dispatch, is_random
        times[name].append(per_op())
ChargeMode.__torch_dispatch__, rng.is_random = raw, cached
json.dump(times, open(OUT, "w"))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--reps", type=int, default=8)
    args = p.parse_args()
    from phantora.launcher import RunConfig, launch

    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "dispatch_ab.py", Path(tmp) / "times.json"
        script.write_text(textwrap.dedent(RANK_SCRIPT))
        launch(RunConfig(str(script), [str(args.ops), str(args.reps), str(out)], "testbed16", nproc=1, trace="none"))
        times: dict[str, list[float]] = json.loads(out.read_text())
    print(f"torch.add of two 4-element cuda tensors, CPU µs per op ({args.reps} interleaved runs of {args.ops}):")
    for name, values in times.items():
        values.sort()
        print(f"  {name:32s} median {values[len(values) // 2]:7.2f}   min {values[0]:7.2f}")


if __name__ == "__main__":
    main()
