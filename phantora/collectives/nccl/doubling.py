"""How a bus-bandwidth curve bends: the busbw gained each time the size doubles, and where a gain jumps.

A collective whose time is a fixed cost F plus its bytes at one rate (t = F + S / B) gains F / (F + 2 S / B) from
S to 2 S: less at every doubling, and never more than the doubling before. NCCL's one-node ring adds a fill and
a cost per pass of chunks (ring_kernel.py), which bend the curve the same way. A gain well above the previous
doubling's (a step up in a flattening curve) is something that changes at that size: more channels (NCCL's p2p
opens them with the size), or a cost that stops there, which a smooth model cannot follow. `steps` finds them.
"""

from __future__ import annotations

from collections.abc import Sequence

STEP_RISE = 0.05  # a gain at least 5 points above the previous doubling's is a step


def doubling_gains(rows: Sequence[tuple[int, float]], lo: int, hi: int) -> list[tuple[int, float]]:
    """(S, busbw(2 S) / busbw(S) - 1) for each size S of `rows` ((size, busbw) pairs) in [lo, hi] whose double
    is also in `rows`, in size order."""
    bus = dict(rows)
    return [(s, bus[2 * s] / bus[s] - 1) for s in sorted(bus) if lo <= s <= hi and 2 * s in bus and bus[s] > 0]


def steps(gains: Sequence[tuple[int, float]], rise: float = STEP_RISE) -> list[int]:
    """The sizes S whose doubling gains at least `rise` more than the doubling from S / 2 (consecutive only)."""
    return [s for (p, g0), (s, g) in zip(gains, gains[1:], strict=False) if s == 2 * p and g - g0 >= rise]
