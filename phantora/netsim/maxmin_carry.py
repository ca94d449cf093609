"""Max-min fair rates of a changing set of flows, each solve carried on from the last: only changed rounds run again.

Progressive filling (`phantora.netsim.maxmin`) raises one fill level through rounds: a round's level is the least
share (remaining capacity over unfrozen flows) over the channels, every unfrozen flow on a channel at that share
freezes at it, and each channel they cross loses ``k * level`` for its ``k`` flows frozen. `CarriedMaxMin` keeps,
from its last solve, every round (level, channels at it, flows frozen) and each channel's state after each round
that changed it. When flows leave or join, the channels they cross are *dirty* from the start (their state is
computed again, from their capacity); every other channel is *clean* while its state is the last solve's at the
same level. A round runs again only if it touches a dirty channel or a flow that froze at another level; a dirty
channel's state is computed as progressive filling computes it; a clean channel that meets a different change than
before turns dirty there, its state taken from its kept state below that level. The others are not read.

The result is the progressive filling of the new flows round by round: the same rounds at the same levels, and on
every channel the same floating-point operations in the same order (one multiply-subtract, one subtraction and one
division a round that changes it, as `maxmin_python`), so every rate is bit for bit `maxmin_python`'s. Unweighted
only (one path a flow). A solve whose level does not rise from one round to the next (float rounding can repeat or
lower a level) returns None: the caller solves from scratch and carries no state.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence

_INF = math.inf


class CarriedMaxMin:
    """The flows' paths (channel ids, each channel once a path) and their max-min rates, carried between solves;
    `cap` is read by channel id (a channel's capacity may change only while no flow crosses it)."""

    def __init__(self, cap: Sequence[float]) -> None:
        self._cap = cap
        self._path: dict[int, tuple[int, ...]] = {}
        self._on: dict[int, set[int]] = {}  # channel -> the flows crossing it
        self._rate: dict[int, float] = {}
        self._lv: dict[int, list[float]] = {}  # channel -> the levels of the rounds that changed it, rising
        self._st: dict[int, list[tuple[float, float, int]]] = {}  # its (remaining, weight, unfrozen) after each
        self._rounds: dict[float, tuple[list[int], list[int]]] = {}  # level -> (its channels, its frozen flows)
        self.reran = 0  # rounds run again by the last solve

    def __len__(self) -> int:
        return len(self._path)

    def rate(self, fid: int) -> float:
        return self._rate[fid]

    def update(self, left: Iterable[int], joined: Iterable[tuple[int, tuple[int, ...]]]) -> dict[int, float] | None:
        """Flows `left` leave, `joined` (id, path) join; solve again. The flows whose rate changed (every joined
        one included) and their rates; None if the levels did not rise or a joined path crosses a channel twice
        (the state is then unusable)."""
        path, on, rates, lvs, sts, rounds, cap = (
            self._path,
            self._on,
            self._rate,
            self._lv,
            self._st,
            self._rounds,
            self._cap,
        )
        keep_at: dict[int, int] = {}  # dirty channel -> its kept rounds (those below the level it is dirty from)
        gone: dict[int, int] = {}  # channel -> its flows that left
        rem: dict[int, float] = {}  # a dirty channel's state: remaining capacity, weight, unfrozen flows, share
        wsum: dict[int, float] = {}
        cnt: dict[int, int] = {}
        share: dict[int, float] = {}
        add_lv: dict[int, list[float]] = {}  # its rounds from that level on
        add_st: dict[int, list[tuple[float, float, int]]] = {}
        heap: list[tuple[float, int]] = []  # dirty channels' shares (stale entries skipped)
        todo: list[float] = []  # levels of kept rounds to run again
        queued: set[float] = set()
        frozen: dict[int, float] = {}  # flows frozen this solve at a level other than the last solve's, or new
        loose: set[int] = set()  # flows unfrozen past their last level, or new, not frozen yet
        push, pop = heapq.heappush, heapq.heappop

        def dirty(c: int, level: float) -> None:
            """Channel c computed from `level` on (not yet dirty): its state below it (kept, less the flows that
            left, all unfrozen there; or its start), its rounds from there run again."""
            lv = lvs.get(c)
            keep = 0 if lv is None or level == -_INF else bisect_left(lv, level)
            keep_at[c] = keep
            add_lv[c], add_st[c] = [], []
            if lv is not None:
                for x in lv[keep:]:
                    if x not in queued:
                        queued.add(x)
                        push(todo, x)
            if keep:
                r, w, k = sts[c][keep - 1]
                n = gone.get(c)
                if n:
                    w, k = w - n, k - n
            else:
                k = len(on.get(c, ()))
                r, w = cap[c], float(k)
            rem[c], wsum[c], cnt[c] = r, w, k
            if k:
                x = share[c] = r / w
                push(heap, (x, c))
            else:
                share[c] = _INF

        def change(c: int, k: int, level: float) -> None:
            """Dirty channel c's k unfrozen flows freeze at `level` (`maxmin_python`'s arithmetic)."""
            left_c = cnt[c] - k
            cnt[c] = left_c
            if left_c:
                r = rem[c] = max(rem[c] - k * level, 0.0)
                w = wsum[c] = wsum[c] - k
                x = share[c] = r / w
                push(heap, (x, c))
            else:
                share[c] = _INF
            add_lv[c].append(level)
            add_st[c].append((rem[c], wsum[c], left_c))

        touched: list[int] = []
        start: dict[int, float] = {}  # channel -> the least level of its flows that left
        for g in left:
            level = rates.pop(g)
            if level not in queued:
                queued.add(level)
                push(todo, level)
            for c in path.pop(g):
                members = on[c]
                members.discard(g)
                if not members:
                    del on[c]
                gone[c] = gone.get(c, 0) + 1
                if level < start.get(c, _INF):
                    start[c] = level
        for g, p in joined:
            if len(set(p)) != len(p):  # (a channel twice on one path: the solvers count it twice; not carried)
                return None
            path[g] = p
            loose.add(g)
            for c in p:
                members_c = on.get(c)
                if members_c is None:
                    on[c] = {g}
                else:
                    members_c.add(g)
                touched.append(c)
        for c in touched:
            if c not in keep_at:
                dirty(c, -_INF)
        # Below the least level of its flows that left, a channel's rounds are the last solve's and its state too,
        # less those flows (unfrozen there): it is dirty from that level (or from where it changes first).
        pending: dict[float, list[int]] = {}
        for c, level in start.items():
            if c not in keep_at:
                pending.setdefault(level, []).append(c)

        last = -_INF
        reran = 0
        while True:
            while heap and share[heap[0][1]] != heap[0][0]:
                pop(heap)
            level = todo[0] if todo else _INF
            if heap and heap[0][0] < level:
                level = heap[0][0]
            if level == _INF:
                break
            if level <= last:
                return None
            last = level
            reran += 1
            if todo and todo[0] == level:
                pop(todo)
            queued.add(level)
            for c in pending.pop(level, ()):
                if c not in keep_at:
                    dirty(c, level)
            old = rounds.get(level)
            if old is not None and not (heap and heap[0][0] == level) and _kept(old, keep_at, frozen, loose, path):
                # the last solve's round as it was (its channels and flows kept): only dirty channels compute
                k_new: dict[int, int] = {}
                for g in old[1]:
                    for c in path[g]:
                        if c in keep_at:
                            k_new[c] = k_new.get(c, 0) + 1
                for c, k in k_new.items():
                    change(c, k, level)
                continue
            if old is not None:
                del rounds[level]
            at: dict[int, None] = {}  # the channels at this level: kept ones of the last solve's round, dirty ones
            if old is not None:
                for c in old[0]:
                    if c not in keep_at:
                        at[c] = None
            while heap and heap[0][0] == level:
                x, c = pop(heap)
                if share[c] == x:
                    at[c] = None
            now: dict[int, None] = {}  # the flows freezing at this level
            for c in at:
                for g in on[c]:
                    if g in loose or (g not in frozen and rates[g] >= level):
                        now[g] = None
            # flows whose freezing moved: their channels are computed from here (their state below this level)
            if old is not None:
                for g in old[1]:
                    if g not in now and g not in frozen and g in path:
                        loose.add(g)
                        for c in path[g]:
                            if c not in keep_at:
                                dirty(c, level)
            for g in now:
                if g not in loose and rates[g] != level:  # a kept flow freezing below its last level
                    x = rates[g]
                    if x not in queued:
                        queued.add(x)
                        push(todo, x)
                    for c in path[g]:
                        if c not in keep_at:
                            dirty(c, level)
            k_new = {}
            for g in now:
                for c in path[g]:
                    k_new[c] = k_new.get(c, 0) + 1
            k_old: dict[int, int] = {}
            if old is not None:
                for g in old[1]:
                    for c in path.get(g, ()):  # (a flow that left: its channels are dirty)
                        k_old[c] = k_old.get(c, 0) + 1
            for c, k in k_old.items():
                if c not in keep_at and k_new.get(c, 0) != k:
                    dirty(c, level)
            for c, k in k_new.items():
                if c in keep_at:
                    change(c, k, level)
                elif k_old.get(c, 0) != k:
                    dirty(c, level)
                    change(c, k, level)
            for g in now:
                if g in loose:
                    loose.discard(g)
                    frozen[g] = level
                elif rates[g] != level:
                    frozen[g] = level
            if now:
                rounds[level] = (list(at), list(now))
        self.reran = reran
        if loose:
            return None
        for c, keep in keep_at.items():
            lv = lvs.get(c)
            if c not in on:
                if lv is not None:
                    del lvs[c], sts[c]
            elif lv is None:
                lvs[c], sts[c] = add_lv[c], add_st[c]
            else:
                st = sts[c]
                del lv[keep:], st[keep:]
                n = gone.get(c)
                if n:
                    st[:] = [(r, w - n, k - n) for r, w, k in st]
                lv += add_lv[c]
                st += add_st[c]
        changed: dict[int, float] = {}
        for g, r in frozen.items():
            if rates.get(g) != r:
                changed[g] = rates[g] = r
        return changed


def _kept(
    old: tuple[list[int], list[int]],
    dirty: dict[int, int],
    frozen: dict[int, float],
    loose: set[int],
    path: dict[int, tuple[int, ...]],
) -> bool:
    """Whether a kept round runs as in the last solve: its channels at its level all clean, its flows all kept."""
    for c in old[0]:
        if c in dirty:
            return False
    for g in old[1]:
        if g in frozen or g in loose or g not in path:
            return False
    return True
