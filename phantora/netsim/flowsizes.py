"""Flow-size distributions of datacenter traffic: piecewise-linear CDFs, their mean, and seeded sampling.

Shipped CDFs (size in bytes, cumulative share), as the HPCC and DCQCN studies use them. The points are those
of the HPCC repository's `traffic_gen/WebSearch_distribution.txt` and `traffic_gen/FbHdp_distribution.txt`
(alibaba-edu/High-Precision-Congestion-Control):
- ``websearch``: the web-search workload of DCTCP (Alizadeh et al., SIGCOMM 2010), mean 1.71 MB;
- ``hadoop``: Facebook's Hadoop cluster (Roy et al., "Inside the Social Network's (Datacenter) Network",
  SIGCOMM 2015), mostly sub-KB flows, mean 0.12 MB.
A user's CDF file has one ``SIZE PERCENT`` pair a line (HPCC's format): sizes in bytes rising, percents
rising from 0 to 100; ``#`` starts a comment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from phantora.errors import InputError
from phantora.files import read_text

WEBSEARCH = (
    (0, 0),
    (10_000, 15),
    (20_000, 20),
    (30_000, 30),
    (50_000, 40),
    (80_000, 53),
    (200_000, 60),
    (1_000_000, 70),
    (2_000_000, 80),
    (5_000_000, 90),
    (10_000_000, 97),
    (30_000_000, 100),
)
HADOOP = (
    (0, 0),
    (100, 1),
    (200, 2),
    (300, 5),
    (350, 15),
    (400, 20),
    (500, 30),
    (600, 40),
    (700, 50),
    (1_000, 60),
    (2_000, 67),
    (7_000, 70),
    (30_000, 72),
    (50_000, 82),
    (80_000, 87),
    (120_000, 90),
    (300_000, 95),
    (1_000_000, 97.5),
    (2_000_000, 99),
    (10_000_000, 100),
)
SHIPPED = {"websearch": WEBSEARCH, "hadoop": HADOOP}


@dataclass(frozen=True)
class SizeCdf:
    """A piecewise-linear CDF of flow sizes: `sizes` (bytes, rising) and `probs` (0 .. 1, rising)."""

    name: str
    sizes: tuple[float, ...]
    probs: tuple[float, ...]

    def mean(self) -> float:
        """Mean size in bytes (each segment uniform: the trapezoid rule, exact for this CDF)."""
        s, p = np.asarray(self.sizes), np.asarray(self.probs)
        return float(np.sum((s[1:] + s[:-1]) / 2 * np.diff(p)))

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """P(size <= x)."""
        return np.interp(x, self.sizes, self.probs)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` sizes (int64 bytes, at least 1) by inverse transform of uniform draws."""
        u = rng.random(n)
        return np.maximum(1, np.rint(np.interp(u, self.probs, self.sizes))).astype(np.int64)


def _check(name: str, pts: list[tuple[float, float]], file: str | None, lines: list[int] | None) -> SizeCdf:
    def err(i: int, msg: str) -> InputError:
        return InputError(msg, file=file, line=lines[i] if lines else None, field="cdf")

    if len(pts) < 2:
        raise InputError("a CDF needs at least two points", file=file, field="cdf")
    if pts[0][1] != 0 or pts[-1][1] != 100:
        raise err(0 if pts[0][1] != 0 else len(pts) - 1, "percents must start at 0 and end at 100")
    for i in range(1, len(pts)):
        if pts[i][0] <= pts[i - 1][0] or pts[i][1] <= pts[i - 1][1]:
            raise err(i, "sizes and percents must both rise from line to line")
    if pts[0][0] < 0:
        raise err(0, "sizes must be >= 0")
    return SizeCdf(name, tuple(float(x) for x, _ in pts), tuple(p / 100 for _, p in pts))


def load_cdf(spec: str, base: str | None = None) -> SizeCdf:
    """A shipped CDF by name (websearch, hadoop) or a CDF file (relative paths: to the folder of `base`)."""
    if spec.lower() in SHIPPED:
        return _check(spec.lower(), [(float(x), float(p)) for x, p in SHIPPED[spec.lower()]], None, None)
    from pathlib import Path

    path = Path(spec)
    if not path.is_absolute() and base is not None:
        path = Path(base).parent / path
    text = read_text(path, "CDF file")
    pts, lines = [], []
    for no, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        try:
            if len(words) != 2:
                raise ValueError
            pts.append((float(words[0]), float(words[1])))
        except ValueError:
            raise InputError(f"expected 'SIZE PERCENT', got {raw.strip()!r}", file=str(path), line=no) from None
        lines.append(no)
    return _check(path.stem, pts, str(path), lines)
