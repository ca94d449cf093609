"""How far below each flow the plain driver's horizon can next count a flow (issue 38, item 2).

The horizon (`phantora.netsim.least_bounds.least_ends`) wants, per worker, the least pulled bound L of the unfinished
flows it counts: those the caller reacts to, or that a gate or marker of the driver waits on. It reads the free
flows and goes down the flows under one (`phantora.netsim.blockers`) where the flow read is counted in neither set,
since a flow below may be. On an all-to-all's chunked steps that walk reads most steps of every pair each round,
though only the last flows of each pair are counted.

R(f), the reach of f, is the least sum of steps (`step`: a flow's delay + least transfer time) along a path of
dependents from f down to a counted flow, the counted flow's step included and the walk stopped at the first
counted flow (no path: none, infinite):

    R(f) = min over f's dependents g of step(g) + (0 if g is counted else R(g)).

A counted flow g below f has L(g) >= L(f) + the steps between (each flow's L is at least a dep's L + its own step,
`phantora.netsim.pulled_bounds`) >= C(f) + R(f), C(f) the bound held for f (C <= L). So once C(f) + R(f) reaches the
least so far, nothing under f can lower it, and the horizon need not read the flows under f: the same least, read from
fewer flows. R stays a lower bound while the counted flows, the dependents and the steps only shrink or vanish: flows
end, a caller's reactions and the driver's waits drop as their flows end; a step never changes. New flows placed, or
new reactions (the caller's `react_epoch` moves), end that: R is not kept then (`DecomposedSimulator._reach`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from phantora.netsim.base import INF_NS, Flow
from phantora.netsim.hybrid import SHARED_DEPS_MIN  # a list this long is one tuple shared by a batch's flows


@dataclass(frozen=True)
class Reach:
    """R of a batch's flows (`steps`: flow id -> R; a flow missing has no counted flow below it) and the flows counted
    when it was taken (`counted`): a flow not in it is counted by the horizon in neither set while R is kept."""

    steps: dict[int, int]
    counted: set[int]


def least_reach(
    order: Sequence[Flow],
    up: Mapping[int, tuple[int, ...]],
    step: Mapping[int, int],
    counts: Callable[[int], bool],
) -> Reach:
    """R of every flow of `order` (a batch in topological order, every flow after its deps) that some counted flow is
    below (module docstring), and the flows of `order` counted. `up` holds the deps of a flow with unfinished deps
    (the driver's books: only those deps matter), `step` each flow's step, `counts` whether the horizon counts a
    flow. A long deps list (one tuple shared by a batch's flows) passes on only a new least."""
    reach: dict[int, int] = {}
    counted: set[int] = set()
    wide: dict[int, int] = {}  # id of a long deps list -> the least value passed to its deps so far
    get = reach.get
    for f in reversed(order):  # (per flow and dependency edge: kept lean)
        fid = f.id
        deps = up.get(fid)
        if counts(fid):
            counted.add(fid)
            if not deps:
                continue
            v = step[fid]
        else:
            if not deps:
                continue
            v = step[fid]
            r = get(fid)
            if r is None:
                continue  # (nothing counted below it: nothing through it either)
            v += r
        if len(deps) >= SHARED_DEPS_MIN:
            k = id(deps)
            if v >= wide.get(k, INF_NS):
                continue
            wide[k] = v
        for d in deps:
            r = get(d)
            if r is None or v < r:
                reach[d] = v
    return Reach(reach, counted)


__all__ = ["Reach", "least_reach"]
