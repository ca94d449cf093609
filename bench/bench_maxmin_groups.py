"""Max-min over many independent components (the flow engine's batched re-solve, `FlowSimulator._solved`): one
vectorised call with a level a group (`maxmin_numpy(..., groups)`), one call with one level for all, and one
`maxmin_python` call a component; the rates are checked equal bit for bit, the CPU printed side by side.

    .venv/bin/python bench/bench_maxmin_groups.py [--seed N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.netsim.maxmin import maxmin_numpy, maxmin_python

CASES = ((2000, 1), (1000, 4), (128, 6), (50, 12))  # (components, flows a component)


def _problem(rng: random.Random, ncomp: int, size: int) -> tuple[list[list[int]], list[float], list[int]]:
    paths: list[list[int]] = []
    cap: list[float] = []
    groups: list[int] = []
    for g in range(ncomp):
        base, nch = len(cap), size + 1
        cap += [float(rng.randint(50, 500)) for _ in range(nch)]
        for _ in range(size):
            paths.append([base + rng.randrange(nch), base + rng.randrange(nch)] if size > 1 else [base])
            groups.append(g)
    return paths, cap, groups


def _timed(fn: Callable[[], list[float]]) -> tuple[list[float], float]:
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    rng = random.Random(ap.parse_args().seed)
    for ncomp, size in CASES:
        paths, cap, groups = _problem(rng, ncomp, size)
        arr = np.asarray(cap)
        one, t_one = _timed(lambda: maxmin_numpy(paths, arr).tolist())  # noqa: B023
        grouped, t_grp = _timed(lambda: maxmin_numpy(paths, arr, np.asarray(groups)).tolist())  # noqa: B023
        each, t_py = _timed(
            lambda: [r for g in range(ncomp) for r in maxmin_python(paths[g * size : (g + 1) * size], cap)]  # noqa: B023
        )
        assert one == grouped == each, "the solvers disagree"
        print(
            f"{ncomp} components of {size} flows: a level a group {t_grp * 1e3:.1f} ms, one level "
            f"{t_one * 1e3:.1f} ms ({t_one / t_grp:.1f}x), maxmin_python a component {t_py * 1e3:.1f} ms "
            f"({t_py / t_grp:.1f}x); rates equal bit for bit"
        )


if __name__ == "__main__":
    main()
