"""Max-min fair rates by progressive filling, in pure Python (small problems) and numpy (large ones).

A problem is a list of flow paths (channel ids) and a capacity per channel. All unfrozen flows
share one fill level; each round the level rises to the smallest fair share ``rem[c] / cnt[c]``
over channels that still carry unfrozen flows, and every flow crossing a channel at exactly that
share is frozen at that level. A channel's remaining capacity then drops by ``k * level`` for the
``k`` flows it just froze.

Both solvers perform the same floating-point operations (one division per share, one
multiply-subtract per channel and round), none of which depends on the order of the flows, so
they return bitwise-identical rates. Weighted (a flow split over several paths), a channel's weight
sums are the one order-dependent sum: both add them in flow order, then path order, so they agree
bit for bit there too. Solving a connected component on its own also gives bitwise
the same rates as solving it inside a larger problem: other components never change this
component's shares, and ties are exact equalities.
The flow engine relies on both facts for determinism across its incremental and full paths.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import chain

import numpy as np

from phantora.netsim.sorted_unique import sorted_unique

NUMPY_THRESHOLD = 96  # flows; at or above this, `maxmin_rates` uses the vectorised solver (measured crossover)
# entries (flow x channel); at or above this, `maxmin_numpy`'s rounds read only the channels at their level and the
# entries of the flows they freeze, not every entry (measured: slower at 10.9k entries, 1.75-2.0x at 31k: the
# solves of 32- and 64-rank all-to-alls, docs/collectives.md)
SPARSE_ENTRIES = 16_384


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


def maxmin_numpy(
    paths: Sequence[Sequence[int]],
    cap: np.ndarray,
    groups: np.ndarray | None = None,
    weights: Sequence[Sequence[float]] | None = None,
) -> np.ndarray:
    """Vectorised `maxmin_python` (cap: an array indexed by channel id), weighted or not, bit for bit its rates.

    The problem is a flat list of (flow, channel, weight) entries in flow order, then path order. A round finds the
    channels at the least share, the unfrozen flows on them (a reduction per flow over its entries), and takes the
    frozen flows' entries off their channels: `np.bincount` sums each channel's freed weights in entry order, which
    is the order `maxmin_python` adds them in, so weighted rates are bit for bit its own too. O(entries) a round;
    from SPARSE_ENTRIES entries a round reads only what it changes (`_sparse_rounds`, the same operations).

    `groups` (a group id a flow) says the problem is several independent ones (no channel is shared across
    groups: the flow engine's connected components): each round then raises every group's own level to its own
    least share, so the rounds are the most any group needs, not the sum of all groups' distinct levels, and each
    group's floating-point operations are those it gets solved alone (the same rates bit for bit)."""
    n = len(paths)
    flens = np.fromiter(map(len, paths), dtype=np.int64, count=n)
    flat = np.fromiter(chain.from_iterable(paths), dtype=np.int64, count=int(flens.sum()))
    present = np.zeros(len(cap), dtype=bool)
    present[flat] = True
    chans = present.nonzero()[0]
    nch = len(chans)
    lch = (np.cumsum(present) - 1)[flat]  # each entry's local channel
    flow_of = np.repeat(np.arange(n, dtype=np.int64), flens)
    cnt = np.bincount(lch, minlength=nch)  # unfrozen flows a channel (an integer: a drained channel is exactly 0)
    if weights is None:
        w = None
        wsum = cnt.astype(np.float64)
    else:
        w = np.fromiter(chain.from_iterable(weights), dtype=np.float64, count=len(flat))
        wsum = np.bincount(lch, weights=w, minlength=nch).astype(np.float64, copy=False)
    rem = cap[chans].astype(np.float64)
    share = rem / wsum
    rate = np.zeros(n, dtype=np.float64)
    levels = _GroupLevels(groups, flow_of[np.unique(lch, return_index=True)[1]]) if groups is not None else None
    if len(flat) >= SPARSE_ENTRIES:
        _sparse_rounds(flow_of, lch, flens, cnt, w, wsum, rem, share, rate, levels)
        return rate
    frozen = np.zeros(n, dtype=bool)
    left = n
    while left:
        if levels is None:
            level = share.min()
            bott = share == level
            chlevel = None
        else:
            chlevel = levels.of_channels(share)
            bott = (share == chlevel) & (cnt > 0)
        newly_mask = np.zeros(n, dtype=bool)
        newly_mask[flow_of[bott[lch]]] = True  # the flows on a channel at its level
        newly_mask &= ~frozen
        newly = newly_mask.nonzero()[0]
        frozen[newly] = True
        rate[newly] = level if levels is None else levels.of_flows(newly)
        mine = newly_mask[flow_of]  # the entries of the flows frozen now
        hit_ch = lch[mine]
        hit = np.bincount(hit_ch, minlength=nch)
        cnt -= hit
        touched = hit.nonzero()[0]
        freed = hit[touched] if w is None else np.bincount(hit_ch, weights=w[mine], minlength=nch)[touched]
        _take_off(touched, freed, level if chlevel is None else chlevel[touched], cnt, rem, wsum, share)
        left -= len(newly)
    return rate


def _take_off(
    touched: np.ndarray,
    freed: np.ndarray,
    lvl: float | np.ndarray,
    cnt: np.ndarray,
    rem: np.ndarray,
    wsum: np.ndarray,
    share: np.ndarray,
) -> None:
    """Take the flows frozen at `lvl` off the channels they cross (`freed`: their weight on each `touched` channel,
    whose unfrozen count `cnt` is already lowered), and set those channels' shares again."""
    r = rem[touched] = np.maximum(rem[touched] - freed * lvl, 0.0)
    rest = wsum[touched] = wsum[touched] - freed
    out = np.full(len(touched), np.inf)  # (a drained channel matters no more)
    share[touched] = np.divide(r, rest, out=out, where=cnt[touched] > 0)


def _sparse_rounds(
    flow_of: np.ndarray,
    lch: np.ndarray,
    flens: np.ndarray,
    cnt: np.ndarray,
    w: np.ndarray | None,
    wsum: np.ndarray,
    rem: np.ndarray,
    share: np.ndarray,
    rate: np.ndarray,
    levels: _GroupLevels | None,
) -> None:
    """`maxmin_numpy`'s rounds (filling `rate`) with the same operations on the same values, each round reading the
    shares, the entries of the channels at its level and those of the flows it freezes: with many distinct levels
    (an all-to-all's pairs each under its own rate cap: a few flows a round) the other entries are not read again."""
    n = len(flens)
    frozen = np.zeros(n, dtype=bool)
    on_channel = flow_of[np.argsort(lch, kind="stable")]  # each channel's flows, in entry order
    ch_first = np.concatenate(([0], np.cumsum(cnt)))
    f_first = np.concatenate(([0], np.cumsum(flens)))  # each flow's entries
    left = n
    while left:
        if levels is None:
            level = share.min()
            bott = (share == level).nonzero()[0]
            chlevel = None
        else:
            chlevel = levels.of_channels(share)
            bott = ((share == chlevel) & (cnt > 0)).nonzero()[0]
        crossing = on_channel[_spans(ch_first[bott], ch_first[bott + 1])]  # the flows on a channel at its level
        newly = sorted_unique(crossing[~frozen[crossing]])
        frozen[newly] = True
        rate[newly] = level if levels is None else levels.of_flows(newly)
        mine = _spans(f_first[newly], f_first[newly + 1])  # the entries of the flows frozen now, in entry order
        touched, at, hit = np.unique(lch[mine], return_inverse=True, return_counts=True)
        cnt[touched] -= hit
        freed = hit if w is None else np.bincount(at, weights=w[mine], minlength=len(touched))
        _take_off(touched, freed, level if chlevel is None else chlevel[touched], cnt, rem, wsum, share)
        left -= len(newly)


def _spans(first: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """The indices first[k] .. stop[k] - 1 of every k, in that order."""
    lens = stop - first
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(first - (np.cumsum(lens) - lens), lens) + np.arange(total, dtype=np.int64)


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
    """Max-min fair rates, choosing the solver by problem size (the answers are identical, weighted or not);
    `weights` as `maxmin_python`, `groups` as `maxmin_numpy`."""
    if len(paths) == 1:  # the same value progressive filling gives
        if weights is None:
            return [min(float(cap[c]) for c in paths[0])]
        return [min(float(cap[c]) / w for c, w in zip(paths[0], weights[0], strict=True))]
    if len(paths) >= NUMPY_THRESHOLD:
        arr = cap_array if cap_array is not None else np.asarray(cap, dtype=np.float64)
        return maxmin_numpy(paths, arr, groups, weights).tolist()
    return maxmin_python(paths, cap, weights)
