"""`rank_last`: each rank's last flows of a collective's DAG, found with numpy over the DAG's edges."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

from phantora.netsim.base import Flow

_SRC, _DST, _DEPS = attrgetter("src"), attrgetter("dst"), attrgetter("deps")


def rank_last(
    flows: Sequence[Flow], nodes: Sequence[int], ranks: Sequence[int], members: int, base: int
) -> dict[int, list[int]]:
    """Rank -> the flows it sends or receives that no flow with it at an end depends on directly, in flow order (the
    source's position before the destination's). Every other flow of the rank is an ancestor of one of them, so the
    rank is done exactly when all of them are. `nodes[p]`, `ranks[p]`: group position p's endpoint and rank (the
    first `members` positions take part; the rest only relay); `flows[i]` has id ``base + i`` and depends only on
    flows of `flows`.

    A flow g is covered at its end p when some flow f with p at an end depends on g; an edge covers g's source end
    if that is one of f's ends, and its destination end likewise."""
    last: dict[int, list[int]] = {r: [] for r in ranks[:members]}
    n = len(flows)
    if not n:
        return last
    import numpy as np  # here, not at import: netsim's start-up imports no numpy (tests/test_netsim_runner.py)

    pos_of = {node: pos for pos, node in enumerate(nodes)}
    sp = np.fromiter(map(pos_of.__getitem__, map(_SRC, flows)), np.int64, n)
    dp = np.fromiter(map(pos_of.__getitem__, map(_DST, flows)), np.int64, n)
    counts = np.fromiter(map(len, map(_DEPS, flows)), np.int64, n)
    dep = np.fromiter(chain.from_iterable(map(_DEPS, flows)), np.int64, int(counts.sum())) - base
    if len(dep) and (dep.min() < 0 or dep.max() >= n):
        raise ValueError(f"a flow depends on one outside its DAG (ids {base}..{base + n - 1})")
    by = np.repeat(np.arange(n), counts)  # the flow each edge comes from
    fs, fd, gs, gd = sp[by], dp[by], sp[dep], dp[dep]
    src_covered = np.zeros(n, bool)
    src_covered[dep[(gs == fs) | (gs == fd)]] = True
    dst_covered = np.zeros(n, bool)
    dst_covered[dep[(gd == fs) | (gd == fd)]] = True
    # entries (flow, end): the source's, then the destination's where it is another position
    src_ok = ~src_covered & (sp < members)
    dst_ok = ~dst_covered & (dp < members) & (dp != sp)
    which = np.concatenate((np.flatnonzero(src_ok) * 2, np.flatnonzero(dst_ok) * 2 + 1))
    which.sort()
    flow = which >> 1
    pos = np.where(which & 1, dp[flow], sp[flow])
    if not len(pos):
        return last
    rank_at = np.asarray(ranks[:members], np.int64)[pos]
    order = np.argsort(rank_at, kind="stable")  # by rank, flow order kept within each
    ids = (flow[order] + base).tolist()
    rank_at = rank_at[order]
    starts = [0, *(np.flatnonzero(np.diff(rank_at)) + 1).tolist()]
    for r, a, b in zip(rank_at[starts].tolist(), starts, [*starts[1:], len(ids)], strict=True):
        last[r] = ids[a:b]
    return last
