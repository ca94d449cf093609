"""The flow engine's max-min solves of a real run, re-timed solver by solver: where `NUMPY_THRESHOLD` belongs.

Runs a flow-mode `phantora replay` (any arguments `phantora replay` takes) with the engine's calls to
`maxmin_rates` recorded (paths and the capacities they saw), then solves every recorded problem again with the heap
solver and the vectorised one, interleaved call by call, checks that both give the rates the run got, bit for bit,
and prints CPU seconds by problem size.

    .venv/bin/python bench/bench_maxmin_solves.py G --topology leafspine1024 --out F
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

import phantora.netsim.flow as flow_mod
from phantora.netsim.maxmin import NUMPY_THRESHOLD, maxmin_numpy, maxmin_python

Problem = tuple[list[tuple[int, ...]], dict[int, float], list[list[float]] | None, np.ndarray | None, list[float]]


def record(replay_args: Sequence[str]) -> tuple[list[Problem], float]:
    """Every solve of a `phantora replay` with these arguments, and the command's CPU seconds."""
    from phantora.cli import main

    problems: list[Problem] = []
    real = flow_mod.maxmin_rates

    def recorded(
        paths: Sequence[Sequence[int]],
        cap: Sequence[float],
        cap_array: np.ndarray | None = None,
        weights: Sequence[Sequence[float]] | None = None,
        groups: np.ndarray | None = None,
    ) -> list[float]:
        rates = real(paths, cap, cap_array, weights, groups)
        caps = {c: float(cap[c]) for p in paths for c in p}
        ws = None if weights is None else [list(w) for w in weights]
        problems.append(([tuple(p) for p in paths], caps, ws, None if groups is None else np.array(groups), rates))
        return rates

    flow_mod.maxmin_rates = recorded
    t0 = time.process_time()
    try:
        main(["replay", *replay_args, "--network", "flow", "--quiet"])
    finally:
        flow_mod.maxmin_rates = real
    return problems, time.process_time() - t0


def retime(problems: list[Problem]) -> dict[int, list[float]]:
    """Per size bucket (a power of 2 of flows): [calls, heap CPU s, vectorised CPU s]; asserts equal rates."""
    width = 1 + max(c for _, caps, _, _, _ in problems for c in caps)
    out: dict[int, list[float]] = {}
    for k, (paths, caps, ws, groups, rates) in enumerate(problems):
        cap = [0.0] * width
        for c, v in caps.items():
            cap[c] = v
        arr = np.asarray(cap)
        row = out.setdefault(len(paths).bit_length() - 1, [0, 0.0, 0.0])
        row[0] += 1
        for which in (0, 1) if k % 2 else (1, 0):
            t = time.process_time()
            got = maxmin_python(paths, cap, ws) if which == 0 else maxmin_numpy(paths, arr, groups, ws).tolist()
            row[1 + which] += time.process_time() - t
            # (the heap solver takes no groups: solved together, each group's rates are those it gets alone)
            assert got == rates, f"solve {k}: the {'heap' if which == 0 else 'vectorised'} solver differs"
    return out


def main(argv: Sequence[str]) -> None:
    problems, cpu = record(argv)
    weighted = sum(ws is not None for _, _, ws, _, _ in problems)
    print(f"replay: {cpu:.2f} CPU s, {len(problems):,} solves ({weighted:,} weighted)")
    print(f"solves by flows (NUMPY_THRESHOLD = {NUMPY_THRESHOLD}): calls, heap CPU s, vectorised CPU s, all equal")
    for b, (n, heap, vec) in sorted(retime(problems).items()):
        print(f"  {1 << b:>6}-{(2 << b) - 1:<6} {int(n):>7,} {heap:9.3f} {vec:9.3f}  {heap / max(vec, 1e-9):5.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
