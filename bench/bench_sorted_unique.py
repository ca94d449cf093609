"""`sorted_unique` against `np.unique` (numpy 2 hashes first), alone and inside the max-min solver's sparse rounds.

Prints the CPU of each on random int arrays of several sizes (the same values checked equal), then `maxmin_numpy` on
random large problems (the sparse rounds, `SPARSE_ENTRIES` entries or more) with the module's `sorted_unique` and
with `np.unique` put back in its place, alternated, the rates checked equal bit for bit.

    .venv/bin/python bench/bench_sorted_unique.py [--seed N] [--repeat R]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.netsim import maxmin
from phantora.netsim.sorted_unique import sorted_unique


def _cpu(fn: Callable[[np.ndarray], object], x: np.ndarray, times: int) -> float:
    t = time.process_time()
    for _ in range(times):
        fn(x)
    return (time.process_time() - t) / times


def arrays(rng: np.random.Generator, repeat: int) -> None:
    print(f"{'ints':>8} {'np.unique us':>13} {'sorted_unique us':>17} {'x':>6}")
    for n in (64, 512, 4096, 32768, 262144):
        x = rng.integers(0, n, n, dtype=np.int64)
        assert np.array_equal(np.unique(x), sorted_unique(x))
        times = max(3, repeat * 20_000 // n)
        a, b = _cpu(np.unique, x, times), _cpu(sorted_unique, x, times)
        print(f"{n:>8} {a * 1e6:>13.1f} {b * 1e6:>17.1f} {a / b:>6.2f}")


def problem(rng: np.random.Generator, flows: int, channels: int, equal: bool) -> tuple[list[list[int]], np.ndarray]:
    """Random paths of 2-6 channels over `channels` channels of random capacity (many distinct levels), or with
    `equal` a fabric's shape: 4-channel paths over channels of one capacity, every flow through one of a few
    bottlenecks (few levels, so a round freezes many flows at once, as an all-to-all's first round does)."""
    if equal:
        paths = [sorted({f % 64, 64 + int(a), 64 + int(b), 64 + int(c)}) for f, (a, b, c) in
                 enumerate(rng.integers(0, channels, (flows, 3)))]  # fmt: skip
        return paths, np.full(channels + 64, 400.0)
    lens = rng.integers(2, 7, flows)
    paths = [sorted(set(rng.integers(0, channels, k).tolist())) for k in lens]
    return paths, rng.uniform(50.0, 500.0, channels)


def solves(rng: np.random.Generator, repeat: int) -> None:
    print(f"\n{'flows':>8} {'levels':>7} {'entries':>8} {'with np.unique s':>17} {'with sorted_unique s':>21} {'x':>6}")
    for flows, channels, equal in ((8_000, 2_000, False), (100_000, 20_000, False), (30_000, 6_000, True),
                                   (100_000, 20_000, True)):  # fmt: skip
        paths, cap = problem(rng, flows, channels, equal)
        runs: dict[str, list[float]] = {"np": [], "sorted": []}
        rates: dict[str, np.ndarray] = {}
        for _ in range(repeat):
            for name, fn in (("np", np.unique), ("sorted", sorted_unique)):
                maxmin.sorted_unique = fn  # type: ignore[assignment]
                t = time.process_time()
                rates[name] = maxmin.maxmin_numpy(paths, cap)
                runs[name].append(time.process_time() - t)
        maxmin.sorted_unique = sorted_unique
        assert np.array_equal(rates["np"], rates["sorted"]), "rates differ"
        a, b = min(runs["np"]), min(runs["sorted"])
        entries = sum(map(len, paths))
        kind = "few" if equal else "many"
        print(f"{flows:>8} {kind:>7} {entries:>8} {a:>17.3f} {b:>21.3f} {a / b:>6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"numpy {np.__version__}")
    arrays(rng, args.repeat)
    solves(rng, args.repeat)


if __name__ == "__main__":
    main()
