"""Completion bounds pulled up a DAG where they are read, not pushed down it at every rise (issue 38, item 2).

The plain decomposition driver (`phantora.netsim.decompose`) keeps, for each unfinished flow j, a lower bound of its
end. Pushed (the eager walk): lb(j) is raised to x whenever x is learnt (its static bound at submit, a worker's
completion bound of j) and, at every rise of an unfinished dep d, to lb(d) + step(j), and at d's end to
end(d) + step(j); every rise of lb(j) goes on down j's dependents. Since lb only grows and a flow ends no earlier
than its bound (the driver checks it), what the walk holds at any time is the one solution of

    L(j) = max(C(j), max over j's deps d of (end(d) if d ended, else L(d)) + step(j))            (*)

where C(j) is the most of what was learnt of j itself (its static bound at submit, at least its post ns + step(j),
and the workers' bounds of j; what its bound at submit took from its deps (*) takes from them too, at least as high):
every value the walk ever wrote into lb(j) is one of those terms at some earlier time, each term only grows, and
after a walk every term's current value is written (the walk goes down every edge whose term rose). (*) is a
recursion over a DAG, so it has exactly one solution.

Pulled: C(j) is kept (a rise of j's own bound is one max, no walk), and L(j) is computed by (*) only for the flows
a round reads (the horizon's, and `earliest_end`'s), walking up their unfinished deps, memoised until anything
changes. Both give L, so the horizons, the rounds and every completion are the same. A value pulled is written
back into C(j) (L only grows: still a lower bound of every later L(j)), and a flow whose deps have all ended keeps
no deps list (its (*) is C(j) from then on).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from phantora.netsim.base import INF_NS
from phantora.netsim.hybrid import SHARED_DEPS_MIN  # a list this long is one tuple shared by a batch's flows

# id of a long deps list -> (the list, kept alive so that no other list takes its id; its term)
Wide = dict[int, tuple[tuple[int, ...], int]]


def pull(
    fid: int,
    lbs: MutableMapping[int, int],
    ends: Mapping[int, int],
    up: MutableMapping[int, tuple[int, ...]],
    step: Mapping[int, int],
    memo: dict[int, int],
    wide: Wide,
    need: int = INF_NS,
) -> int:
    """L(fid) by (*) (module docstring) if it is below `need`; else a lower bound of it, at least `need` (the walk
    stops at the first term that reaches it: a caller after the least L of some flows passes the least so far).
    `lbs` holds C (each flow's own bound, raised here to what is pulled), `ends` the ended flows' ends, `up` the deps
    of an unfinished flow that had unfinished deps when submitted (dropped here once all have ended), `step` each
    unfinished flow's least time after its last dep. `memo` keeps L of each flow pulled and `wide` the term of a
    long deps list, by the list's identity (one tuple shared by a batch's flows waiting on the same list): both
    valid until a bound rises or a flow ends. An explicit stack: a DAG of hundreds of collectives, each after the
    last, needs no recursion."""
    got = memo.get(fid)
    if got is not None:
        return got
    # frames [flow, its need, its deps, next dep, its term so far]; `ret`: what the last frame popped returned
    stack: list[list[Any]] = [[fid, need, None, 0, -1]]
    ret = 0
    while stack:
        fr = stack[-1]
        x, nd, deps, i, t = fr
        if deps is None:  # (first visit)
            got = memo.get(x)
            c = lbs[x]
            if got is not None or c >= nd or x not in up:
                ret = c if got is None else got
                if got is None and x not in up:
                    memo[x] = c
                stack.pop()
                continue
            deps = fr[2] = up[x]
            kept = wide.get(id(deps)) if len(deps) >= SHARED_DEPS_MIN else None
            if kept is not None:
                i, t = len(deps), kept[1]
        elif ret > t:  # (back from the dep at i: exact if below its need, else past this flow's need too)
            t = ret
        s = step[x]
        n = len(deps)
        while i < n and t + s < nd:
            d = deps[i]
            e = ends.get(d)
            if e is None:
                m = memo.get(d)
                if m is None:
                    if d in up and lbs[d] + s < nd:
                        break  # (pulled first: its frame goes on the stack)
                    m = lbs[d]
                    if d not in up:
                        memo[d] = m
                e = m
            if e > t:
                t = e
            i += 1
        if i < n and t + s < nd:
            fr[3], fr[4] = i, t
            stack.append([deps[i], nd - s, None, 0, -1])
            continue
        v = max(t + s, lbs[x])
        lbs[x] = v
        if v < nd:  # (every dep read, each exactly: L(x))
            memo[x] = v
            if n >= SHARED_DEPS_MIN:
                wide[id(deps)] = (deps, t)
            elif all(d in ends for d in deps):
                del up[x]
        ret = v
        stack.pop()
    return ret


__all__ = ["Wide", "pull"]
