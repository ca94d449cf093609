"""Which of a worker's unfinished flows the plain driver's horizon must read (issue 38, item 2).

The horizon (`phantora.netsim.least_bounds.least_ends`) wants, per worker, the least pulled bound L of its unfinished
flows in a set (those the caller reacts to, or those it reacts to or a gate waits on). A flow g waiting on an
unfinished flow d has L(g) >= L(d) + step(g) >= L(d) (the recursion of `phantora.netsim.pulled_bounds`), so once
d is read and counted, or passed over because its bound reaches the least so far, g cannot lower that least either.
Here each unfinished flow with a short deps list (at most `BLOCK_DEPS`) and an unfinished dep on its own worker is
kept under one such dep, its blocker; the others are the worker's free flows. Every unfinished flow is free or under
exactly one unfinished blocker of its worker, so the free flows and the lists under them reach every one: the horizon
reads the free flows and goes down a list only where the flow above it neither counted nor was passed over for the
least it could lower (`least_ends`'s `below`). On the hierarchical all-reduce replay a worker's ring steps wait on
the step before on the same rail, so it reads the rings' current steps instead of every unfinished step.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import repeat

BLOCK_DEPS = 4  # a flow with more deps is always free (a blocker found again at each end would walk a long list)


class Blockers:
    """Per worker the free unfinished flows, and each blocker's flows under it (module docstring)."""

    def __init__(self, workers: int) -> None:
        self.free: list[set[int]] = [set() for _ in range(workers)]
        self.below: dict[int, list[int]] = {}

    def add(self, fid: int, w: int, deps: Sequence[int], unfinished: Collection[int]) -> None:
        """Flow `fid` joins worker `w`'s `unfinished` flows (its unfinished deps there are in it already): under the
        first of its `deps` in `unfinished`, free if none is or its list is long."""
        if len(deps) <= BLOCK_DEPS:
            for d in deps:
                if d in unfinished:
                    kids = self.below.get(d)
                    if kids is None:
                        self.below[d] = [fid]
                    else:
                        kids.append(fid)
                    return
        self.free[w].add(fid)

    def ended(self, ids: Sequence[int], w: int, unfinished: Collection[int], deps: Mapping[int, Sequence[int]]) -> None:
        """Flows `ids` of worker `w` ended and left `unfinished`: each flow under one of them goes under another of
        its unfinished deps there (`deps`: an unfinished flow's deps), or is free."""
        self.free[w].difference_update(ids)
        below = self.below
        for kids in filter(None, map(below.pop, ids, repeat(None))):  # (per ended flow: at C speed)
            for g in kids:
                if g in unfinished:  # (a flow ending with its blocker: gone already)
                    self.add(g, w, deps.get(g, ()), unfinished)

    def ended_anywhere(
        self, ids: Sequence[int], unfinished: Sequence[Collection[int]], deps: Mapping[int, Sequence[int]]
    ) -> None:
        """`ended` for flows of any worker (markers, in no worker's set)."""
        for w, mine in enumerate(unfinished):
            self.ended(ids, w, mine, deps)


__all__ = ["BLOCK_DEPS", "Blockers"]
