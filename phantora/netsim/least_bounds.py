"""The least pulled bound of one worker's unfinished flows, for the plain driver's horizon (issue 38, item 2).

The plain decomposition driver (`phantora.netsim.decompose`) needs each round, per worker, m: the least L
(`phantora.netsim.pulled_bounds` (*)) of its unfinished flows that the caller reacts to or that a gate or marker
waits on, and mr: the least L of those the caller reacts to; it reads only max(m, floor) and max(mr, floor).
`least_ends` reads the flows as the scan before it did (a flow whose own bound C is at least what it could lower is
passed over), but a flow with unfinished deps and a deps list of at most `QUICK_DEPS` first has its C raised to one
step of (*) from its deps as they are held,

    q(f) = max over f's deps d of (end(d) if d ended, else C(d)) + step(f),

and is passed over if that reaches what it could lower, before the caller is asked whether it reacts to it and
before it is pulled. Most of the flows a round read are such: a flow waiting on a chain whose C trails, since each
round the least rises past what was last written into it; one step from its dep's C settles it.

Why m and mr are the full scan's. (1) C(f) <= L(f) always: every value written into C (a pull's, or q) is at most L,
each term of q being a term of (*) or a lower bound of one (end(d) exact, C(d) <= L(d)). (2) A flow is passed over
only if a lower bound of its L (C, or q) is at least the least so far of every set it belongs to, so it cannot lower
that least; a pull with a need returns L exactly if it is below the need, else a value at least the need (`pull`).
So every value that lowers m or mr is the exact L of a flow of its set, and no flow passed over has an L below the
final least: after every flow is read, m and mr are the exact least L of their sets, in any order of reading.
(3) Stopping once mr <= floor leaves m <= mr <= floor: max(m, floor) and max(mr, floor) are floor whatever is left.
(4) The values written back into C differ from the scan's, but only within C0 <= C' <= L (C0 what (*) takes from the
flow itself), which leaves the one solution of (*) unchanged: max(C'(j), T(j)) lies between max(C0(j), T(j)) = L(j)
and max(L(j), T(j)) = L(j), T(j) its deps' term. Every later reader reads L through `pull` (the horizon,
`earliest_end`) or C only as a lower bound of L (a new flow's C at submit, the check that no flow ends before its
bound). So the horizons, the least reacting ends, the rounds and every completion are those of the full scan.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, MutableMapping

from phantora.netsim.base import INF_NS
from phantora.netsim.pulled_bounds import Wide, pull
from phantora.netsim.reach_steps import Reach

QUICK_DEPS = 4  # a waiting flow with at most this many deps has its C raised from them first (more: pulled)


def least_ends(
    ids: Collection[int],
    floor: int,
    react: Callable[[int], bool] | None,
    ext: Collection[int],
    lbs: MutableMapping[int, int],
    ends: Mapping[int, int],
    up: MutableMapping[int, tuple[int, ...]],
    step: Mapping[int, int],
    memo: dict[int, int],
    wide: Wide,
    below: Mapping[int, list[int]] | None = None,
    reach: Reach | None = None,
    start: tuple[int, int] = (INF_NS, INF_NS),
) -> tuple[int, int, int]:
    """(m, mr, reads) of one worker's unfinished flows `ids` (module docstring): the least L of those `react` says
    the caller reacts to (every flow when None) or in `ext`, the least L of those it reacts to (INF_NS: none), and
    how many flows were read past the first test. Both exact unless both are at most `floor`. The other arguments
    are `pull`'s (`lbs` holds C, raised here). With `below` (`phantora.netsim.blockers`), `ids` are the worker's
    free flows and `below` each blocker's flows under it: a list is read only under a flow read that the caller does
    not react to (one it reacts to counts, or is passed over for a least its dependents cannot lower either). With
    `reach` (`phantora.netsim.reach_steps`, held since the flows counted last grew), a flow f whose C(f) + R(f)
    reaches mr, the least so far of both sets, has no flow under it that can lower either least: not read under it;
    and one not in `reach.counted` is counted in neither set (no `react` asked): it is passed over then.

    With `start` = (s, sr), s <= sr (the caller's least so far of other terms: another worker's, the buffer's), the
    reading begins with m = s and mr = sr: it returns (min(s, m), min(sr, mr)) of the exact (m, mr) (both exact where
    below s and sr unless at most `floor`), since a flow at s or later cannot lower m below s (nor mr below sr) and is
    passed over as above; so min(s, max(., floor)) and min(sr, max(., floor)) of the two are those of the exact
    least, and what cannot lower them is not read. With sr <= floor at the start nothing is read. The flows are read
    depth first (a list under a flow before the free flows not read yet): by (2) any order gives the same least."""
    m, mr = start
    if mr <= floor:  # (both at most floor: max(., floor) is floor whatever is read, as (3) in the module docstring)
        return m, mr, 0
    reads = 0
    order = list(ids)  # (read depth first: a list under a flow before the flows beside it, so that a counted flow,
    take = order.pop  # its least found early, passes over more of what is read after it; any order gives the least)
    rget = None if reach is None else reach.steps.get
    counted: Collection[int] = () if reach is None else reach.counted
    while order:
        f = take()
        c = lbs[f]
        if c >= mr and (c >= m or f not in ext):
            continue
        reads += 1
        passed, x = False, 0  # passed: counted in neither set (only what is under it may be), x its reach
        if rget is not None and f not in counted:
            got = rget(f)
            if got is None or c + got >= mr:
                continue
            passed, x = True, got
        deps = up.get(f)
        if deps is not None and len(deps) <= QUICK_DEPS:  # (C raised one step)
            t = -1
            for d in deps:
                e = ends.get(d)
                if e is None:
                    e = lbs[d]
                if e > t:
                    t = e
            q = t + step[f]
            if q > c:
                lbs[f] = c = q
                if c + x >= mr if passed else c >= mr and (c >= m or f not in ext):
                    continue
        if passed:
            kids = None if below is None else below.get(f)
            if kids:
                order.extend(kids)
            continue
        r = react is None or react(f)
        if not r:  # (its dependents' least L is not bounded by a least it counts in: they are read)
            kids = None if below is None else below.get(f)
            if kids and (rget is None or c + rget(f, INF_NS) < mr):
                order.extend(kids)
            if f not in ext:  # (in neither set)
                continue
        need = mr if r else m
        if c >= need:
            continue
        if deps is not None:
            c = pull(f, lbs, ends, up, step, memo, wide, need)
        if r:
            if c < mr:
                mr = c
                if c < m:
                    m = c
                if mr <= floor:
                    break
        elif c < m:
            m = c
    return m, mr, reads


__all__ = ["QUICK_DEPS", "least_ends"]
