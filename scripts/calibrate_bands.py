"""Held-out error of `phantora calibrate --errors FILE` by measured time: small kernels and long ones.

    .venv/bin/phantora calibrate compute.csv memcpy.csv --gpu l40s --holdout 0.3 --seed 0 --errors /tmp/e.csv
    .venv/bin/python scripts/calibrate_bands.py /tmp/e.csv

No-op rows are left out, as in calibrate's "overall" row. docs/validation.md quotes these figures.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

BANDS: tuple[tuple[str, int, int], ...] = (  # (label, measured ns above, measured ns up to)
    ("measured <= 8 us", 0, 8_000),
    ("measured > 100 us", 100_000, 2**63),
)


def band_lines(path: Path) -> list[str]:
    """One line per band: rows, median and p90 relative error, the share within 10%."""
    try:
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["class"] != "noop"]
        pairs = [(int(r["measured_ns"]), float(r["rel_error"])) for r in rows]
    except (OSError, KeyError, ValueError) as e:
        raise SystemExit(f"calibrate_bands: {path}: not a `phantora calibrate --errors` file ({e})") from None
    out = []
    for label, low, high in BANDS:
        errs = np.asarray([e for m, e in pairs if low < m <= high], dtype=np.float64)
        if not errs.size:
            out.append(f"{label}: 0 rows")
            continue
        out.append(
            f"{label}: {errs.size} rows, median {100 * np.median(errs):.1f}%, "
            f"p90 {100 * np.percentile(errs, 90):.1f}%, within 10%: {100 * np.mean(errs <= 0.10):.0f}%"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the bands of one errors file."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("errors", type=Path, help="the CSV `phantora calibrate --errors` wrote")
    args = ap.parse_args(argv)
    print("\n".join(band_lines(args.errors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
