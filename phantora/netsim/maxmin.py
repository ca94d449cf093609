"""Max-min fair rates by progressive filling, in pure Python (small problems) and numpy (large ones).

A problem is a list of flow paths (channel ids) and a capacity per channel. All unfrozen flows
share one fill level; each round the level rises to the smallest fair share ``rem[c] / cnt[c]``
over channels that still carry unfrozen flows, and every flow crossing a channel at exactly that
share is frozen at that level. A channel's remaining capacity then drops by ``k * level`` for the
``k`` flows it just froze.

Both solvers perform the same floating-point operations (one division per share, one
multiply-subtract per channel and round), none of which depends on the order of the flows, so
they return bitwise-identical rates. Solving a connected component on its own also gives bitwise
the same rates as solving it inside a larger problem: other components never change this
component's shares, and ties are exact equalities.
The flow engine relies on both facts for determinism across its incremental and full paths.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import chain

import numpy as np

NUMPY_THRESHOLD = 512  # flows; at or above this, `maxmin_rates` uses the vectorised solver (measured crossover)


def maxmin_python(
    paths: Sequence[Sequence[int]], cap: Sequence[float], weights: Sequence[Sequence[float]] | None = None
) -> list[float]:
    """Max-min fair rates of flows with these channel paths (each non-empty); cap is indexed by channel id.

    With `weights`, flow i puts ``weights[i][k]`` of its rate on channel ``paths[i][k]`` (a flow split over
    several paths); without, every weight is 1. A channel's fair share is its remaining capacity over the summed
    weights of its unfrozen flows; it counts as busy while it has an unfrozen flow (an integer count, so float
    leftovers of weight sums never make a share of a drained channel). Shares live in a heap with lazy deletion,
    so a round costs only the channels it touches. Unweighted, the weight sums are exact integers, so the rates
    are bitwise those of `maxmin_numpy`.
    """
    n = len(paths)
    local: dict[int, int] = {}
    members: list[list[int]] = []  # flows per local channel
    fch: list[list[int]] = []  # local channels per flow
    for i, path in enumerate(paths):
        mine = []
        for c in path:
            j = local.get(c)
            if j is None:
                j = local[c] = len(members)
                members.append([])
            members[j].append(i)
            mine.append(j)
        fch.append(mine)
    rem = [float(cap[c]) for c in local]
    cnt = [len(m) for m in members]
    if weights is None:
        wsum = [float(k) for k in cnt]
    else:
        wsum = [0.0] * len(members)
        for mine, ws in zip(fch, weights, strict=True):
            for j, w in zip(mine, ws, strict=True):
                wsum[j] += w
    heap = [(rem[j] / wsum[j], j) for j in range(len(members))]
    heapq.heapify(heap)
    rate = [0.0] * n
    frozen = [False] * n
    left = n
    while left:
        level = -1.0
        newly: list[int] = []
        while heap:
            share, j = heap[0]
            if not cnt[j] or share != rem[j] / wsum[j]:
                heapq.heappop(heap)  # stale entry
                continue
            if level >= 0.0 and share != level:
                break
            level = share
            heapq.heappop(heap)
            for i in members[j]:
                if not frozen[i]:
                    frozen[i] = True
                    newly.append(i)
        hit: dict[int, int] = {}  # local channel -> its flows frozen this round
        if weights is None:
            for i in newly:
                rate[i] = level
                for j in fch[i]:
                    hit[j] = hit.get(j, 0) + 1
            freed: dict[int, int] | dict[int, float] = hit  # their weights: one each
        else:
            freed_w: dict[int, float] = {}
            for i in sorted(newly):  # a fixed order of the float sums
                rate[i] = level
                for j, w in zip(fch[i], weights[i], strict=True):
                    hit[j] = hit.get(j, 0) + 1
                    freed_w[j] = freed_w.get(j, 0.0) + w
            freed = freed_w
        for j, k in hit.items():
            left_j = cnt[j] = cnt[j] - k
            if left_j:  # (a drained channel's capacity and weights matter no more)
                w = freed[j]
                r = rem[j] = max(rem[j] - w * level, 0.0)
                rest = wsum[j] = wsum[j] - w
                heapq.heappush(heap, (r / rest, j))
        left -= len(newly)
    return rate


def _ragged(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l)."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offs = np.repeat(np.cumsum(lens) - lens, lens)
    return np.arange(total, dtype=np.int64) - offs + np.repeat(starts, lens)


def maxmin_numpy(paths: Sequence[Sequence[int]], cap: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Vectorised `maxmin_python` (cap: an array indexed by channel id); O(channels + touched entries) a round.

    `groups` (a group id a flow) says the problem is several independent ones (no channel is shared across
    groups: the flow engine's connected components): each round then raises every group's own level to its own
    least share, so the rounds are the most any group needs, not the sum of all groups' distinct levels, and each
    group's floating-point operations are those it gets solved alone (the same rates bit for bit)."""
    n = len(paths)
    flens = np.fromiter(map(len, paths), dtype=np.int64, count=n)
    flat = np.fromiter(chain.from_iterable(paths), dtype=np.int64, count=int(flens.sum()))
    present = np.zeros(len(cap), dtype=bool)
    present[flat] = True
    chans = np.flatnonzero(present)
    nch = len(chans)
    remap = np.cumsum(present) - 1
    lch = remap[flat]
    fstart = np.cumsum(flens) - flens
    flow_of = np.repeat(np.arange(n, dtype=np.int64), flens)
    ch_flows = flow_of[np.argsort(lch.astype(np.int32), kind="stable")]
    cnt = np.bincount(lch, minlength=nch)
    cstart = np.cumsum(cnt) - cnt
    clens = cnt.copy()
    rem = cap[chans].astype(np.float64)
    rate = np.zeros(n, dtype=np.float64)
    frozen = np.zeros(n, dtype=bool)
    stamp = np.zeros(n, dtype=np.int64)
    share = np.empty(nch, dtype=np.float64)
    levels = _GroupLevels(groups, ch_flows[cstart]) if groups is not None else None
    left = n
    while left:
        share.fill(np.inf)
        np.divide(rem, cnt, out=share, where=cnt > 0)
        if levels is None:
            level = share.min()
            bott = np.flatnonzero(share == level)
        else:
            chlevel = levels.of_channels(share)
            bott = np.flatnonzero((share == chlevel) & (cnt > 0))
        cand = ch_flows[_ragged(cstart[bott], clens[bott])]
        cand = cand[~frozen[cand]]
        pos = np.arange(len(cand))
        stamp[cand] = pos
        newly = cand[stamp[cand] == pos]  # each flow once (a flow may cross several bottlenecks)
        frozen[newly] = True
        hit = np.bincount(lch[_ragged(fstart[newly], flens[newly])], minlength=nch)
        cnt -= hit
        if levels is None:
            rate[newly] = level
            np.maximum(rem - hit * level, 0.0, out=rem)
        else:
            rate[newly] = levels.of_flows(newly)
            touched = np.flatnonzero(hit)  # (a group done has an infinite level: leave its channels alone)
            rem[touched] = np.maximum(rem[touched] - hit[touched] * chlevel[touched], 0.0)
        left -= len(newly)
    return rate


class _GroupLevels:
    """Each group's fill level in a round of `maxmin_numpy`: the least share over its channels."""

    def __init__(self, groups: np.ndarray, first_flow: np.ndarray) -> None:
        ids, self._flow_group = np.unique(np.asarray(groups, dtype=np.int64), return_inverse=True)
        self._ch_group = self._flow_group[first_flow]  # a channel's flows are all of one group
        self._order = np.argsort(self._ch_group, kind="stable")
        counts = np.bincount(self._ch_group, minlength=len(ids))
        self._starts = np.cumsum(counts) - counts
        self._level = np.empty(len(ids), dtype=np.float64)

    def of_channels(self, share: np.ndarray) -> np.ndarray:
        """This round's level of each channel's group (infinite for a group with no unfrozen flow)."""
        self._level = np.minimum.reduceat(share[self._order], self._starts)
        return self._level[self._ch_group]

    def of_flows(self, flows: np.ndarray) -> np.ndarray:
        """This round's level of these flows' groups."""
        return self._level[self._flow_group[flows]]


def maxmin_rates(
    paths: Sequence[Sequence[int]],
    cap: Sequence[float],
    cap_array: np.ndarray | None = None,
    weights: Sequence[Sequence[float]] | None = None,
    groups: np.ndarray | None = None,
) -> list[float]:
    """Max-min fair rates, choosing the solver by problem size (the answers are identical); `weights` as
    `maxmin_python` (weighted problems are solved there), `groups` as `maxmin_numpy`."""
    if len(paths) == 1:  # the same value progressive filling gives
        if weights is None:
            return [min(float(cap[c]) for c in paths[0])]
        return [min(float(cap[c]) / w for c, w in zip(paths[0], weights[0], strict=True))]
    if weights is None and len(paths) >= NUMPY_THRESHOLD:
        arr = cap_array if cap_array is not None else np.asarray(cap, dtype=np.float64)
        return maxmin_numpy(paths, arr, groups).tolist()
    return maxmin_python(paths, cap, weights)
