"""Mean and spread over seeds: of one metric (`spread`), and of a sweep's rows that differ only by their seed
(`seed_groups`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Value = int | float | None


def spread(values: Sequence[Value]) -> dict[str, float] | None:
    """n, mean, std (sample, n - 1; 0 for one value), min and max of the measured values; None if none is."""
    got = np.asarray([v for v in values if v is not None], dtype=float)
    if not got.size:
        return None
    std = float(got.std(ddof=1)) if got.size > 1 else 0.0
    return {"n": int(got.size), "mean": float(got.mean()), "std": std, "min": float(got.min()), "max": float(got.max())}


def seed_groups(
    rows: Sequence[dict[str, Any]], params: Sequence[str], metrics: Sequence[str], seed: str = "seed"
) -> list[dict[str, Any]]:
    """One row per configuration of `rows` (sweep rows: status, parameters, metrics) with every parameter but
    `seed` equal: those parameters, `seeds` (the seeds, in order), `runs`, `failed` (runs that did not end ok),
    and for each metric its mean over the ok runs (None if none measured it) with `<metric>_std`, `_min`, `_max`.
    """
    keys = [p for p in params if p != seed]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(repr(r.get(k)) for k in keys), []).append(r)
    out = []
    for members in groups.values():
        ok = [r for r in members if r.get("status") == "ok"]
        row: dict[str, Any] = {k: members[0].get(k) for k in keys}
        row.update(seeds=",".join(str(r.get(seed)) for r in members), runs=len(members), failed=len(members) - len(ok))
        for m in metrics:
            s = spread([r.get(m) for r in ok])
            row[m] = s["mean"] if s else None
            for stat in ("std", "min", "max"):
                row[f"{m}_{stat}"] = s[stat] if s else None
        out.append(row)
    return out
