"""The distinct values of an integer array, sorted, by one sort.

`np.unique` without `return_*` arguments hashes its input first under numpy 2 (2.4 here), which on the int arrays
of a max-min round or a driver's round (hundreds to tens of thousands of ids) costs several times one sort:
`bench/bench_sorted_unique.py` prints both side by side.
"""

from __future__ import annotations

import numpy as np


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """`np.unique(x)` for a 1-d integer array: its distinct values in ascending order."""
    if len(x) < 2:
        return np.sort(x)
    x = np.sort(x)
    return x[np.concatenate(([True], x[1:] != x[:-1]))]
