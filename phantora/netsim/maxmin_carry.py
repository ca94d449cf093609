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

*Slack channels carry no states.* A channel whose flows' rates sum to well under its capacity is never at a level:
its share before its i-th round is (capacity - the rates frozen on it) / (its flows left), which exceeds the next
level by at least (capacity - the sum of its rates) / (its flows left) in real numbers. A channel of `BARE_MIN`
flows or more, not at a level in the last solve, whose rates summed to at most `ELIGIBLE` of its capacity there, is
therefore solved without its states (*bare*): a round changes nothing on it and it is never at a level, so its
rounds need not run again. The solve is kept only if its rates still sum to at most `PROOF` of its capacity after
it; otherwise it is solved again with that channel's states (rebuilt from its flows' last rates, the same
operations in the same order). `PROOF` leaves 1e-6 of the capacity: a channel's float state after i rounds is within
about (2i + 1) 2^-53 of its capacity of the real one, and the running sums of rates within `RESYNC` 2^-52 of it
(recomputed exactly every `RESYNC` changes), so the float share stays above every level it meets for any
channel of fewer than 10^8 rounds. Which rates come out does not depend on which channels were bare.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence

_INF = math.inf
BARE_MIN = 8  # flows on a channel from which it may be carried without its states
ELIGIBLE = 0.95  # ... while its flows' rates summed to at most this share of its capacity in the last solve
PROOF = 1.0 - 1e-6  # ... and the solve holds if they sum to at most this share after it
RESYNC = 4096  # running sums of a channel's rates recomputed exactly after this many changes


class CarriedMaxMin:
    """The flows' paths (channel ids, each channel once a path) and their max-min rates, carried between solves;
    `cap` is read by channel id (a channel's capacity may change only while no flow crosses it)."""

    def __init__(self, cap: Sequence[float]) -> None:
        self._cap = cap
        self._path: dict[int, tuple[int, ...]] = {}
        self._on: dict[int, set[int]] = {}  # channel -> the flows crossing it
        self._rate: dict[int, float] = {}
        self._lv: dict[int, list[float]] = {}  # channel -> the levels of the rounds that changed it, rising
        # its (remaining, weight, unfrozen, flows frozen) after each
        self._st: dict[int, list[tuple[float, float, int, int]]] = {}
        self._rounds: dict[float, tuple[list[int], list[int]]] = {}  # level -> (its channels, its frozen flows)
        self._at: dict[int, float] = {}  # channel -> the level of the round it is at (in that round's channels)
        self._use: dict[int, float] = {}  # channel -> the sum of its flows' rates (running)
        self._ops: dict[int, int] = {}  # channel -> changes to that sum since it was summed exactly
        self._bare: set[int] = set()  # channels carried without their states (slack in the last solve)
        self.reran = 0  # rounds run again by the last solve
        self.visited = 0  # flows the rounds it ran again in full read (their frozen flows, new and last), in all
        self.redone = 0  # solves run again with a bare channel's states (it was not slack after it), in all

    def __len__(self) -> int:
        return len(self._path)

    def rate(self, fid: int) -> float:
        return self._rate[fid]

    @property
    def bare(self) -> int:
        """Channels carried without their states now (slack in the last solve)."""
        return len(self._bare)

    def update(self, left: Iterable[int], joined: Iterable[tuple[int, tuple[int, ...]]]) -> dict[int, float] | None:
        """Flows `left` leave, `joined` (id, path) join; solve again. The flows whose rate changed (every joined
        one included) and their rates; None if the levels did not rise or a joined path crosses a channel twice
        (the state is then unusable)."""
        path, on, rates, use = self._path, self._on, self._rate, self._use
        was: dict[int, float] = {}  # flows that left -> their rate
        gone: dict[int, list[int]] = {}  # channel -> its flows that left
        start: dict[int, float] = {}  # channel -> the least level of its flows that left
        for g in left:
            level = was[g] = rates.pop(g)
            for c in path.pop(g):
                members = on[c]
                members.discard(g)
                if not members:
                    del on[c]
                gone.setdefault(c, []).append(g)
                if level < start.get(c, _INF):
                    start[c] = level
                use[c] -= level
        touched: list[int] = []
        fresh: set[int] = set()  # channels no flow crossed before
        new: set[int] = set()
        for g, p in joined:
            if len(set(p)) != len(p):  # (a channel twice on one path: the solvers count it twice; not carried)
                return None
            path[g] = p
            new.add(g)
            for c in p:
                members_c = on.get(c)
                if members_c is None:
                    on[c] = {g}
                    if c not in self._lv and c not in self._bare and c not in gone:
                        fresh.add(c)
                        use[c], self._ops[c] = 0.0, 0
                else:
                    members_c.add(g)
                touched.append(c)
        eager: set[int] = set()
        while True:
            got = self._solve(was, gone, start, touched, fresh, new, eager)
            if not isinstance(got, set):
                return got
            eager |= got  # bare channels that were not slack: again, with their states
            self.redone += 1

    def _solve(
        self,
        was: dict[int, float],
        gone: dict[int, list[int]],
        start: dict[int, float],
        touched: list[int],
        fresh: set[int],
        new: set[int],
        eager: set[int],
    ) -> dict[int, float] | set[int] | None:
        """One solve of the flows now on (`update`'s): the changed rates, committed; or the bare channels it found
        not slack (nothing committed); or None."""
        path, on, rates, lvs, sts, rounds, cap = (
            self._path,
            self._on,
            self._rate,
            self._lv,
            self._st,
            self._rounds,
            self._cap,
        )
        at_of, use, bare = self._at, self._use, self._bare
        keep_at: dict[int, int] = {}  # dirty channel -> its kept rounds (those below the level it is dirty from)
        slack: set[int] = set()  # channels solved bare this time
        rem: dict[int, float] = {}  # a dirty channel's state: remaining capacity, weight, unfrozen flows, share
        wsum: dict[int, float] = {}
        cnt: dict[int, int] = {}
        share: dict[int, float] = {}
        add_lv: dict[int, list[float]] = {}  # its rounds from that level on
        add_st: dict[int, list[tuple[float, float, int, int]]] = {}
        heap: list[tuple[float, int]] = []  # dirty channels' shares (stale entries skipped)
        todo: list[float] = []  # levels of kept rounds to run again
        queued: set[float] = set()
        upset: set[float] = set()  # levels of kept rounds that cannot run as they were (a channel or flow changed)
        due: dict[float, list[tuple[int, int]]] = {}  # level -> dirty channels with a kept round there, its flows
        frozen: dict[int, float] = {}  # flows frozen this solve at a level other than the last solve's, or new
        loose: set[int] = set(new)  # flows unfrozen past their last level, or new, not frozen yet
        made: dict[float, tuple[list[int], list[int]]] = {}  # rounds run again (committed at the end)
        push, pop = heapq.heappush, heapq.heappop

        def dirty(c: int, level: float) -> None:
            """Channel c computed from `level` on (not yet dirty): its state below it (kept, less the flows that
            left, all unfrozen there; or its start), its rounds from there run again. A slack channel instead goes
            bare (no state)."""
            if c in slack:
                return
            if (
                c not in eager
                and c not in fresh
                and c not in at_of
                and len(on.get(c, ())) >= BARE_MIN
                and use[c] <= cap[c] * ELIGIBLE
            ):
                slack.add(c)
                return
            if c in bare:
                self._rebuild(c, was, gone, new)
            b = at_of.get(c)
            if b is not None:
                upset.add(b)
            lv = lvs.get(c)
            keep = 0 if lv is None or level == -_INF else bisect_left(lv, level)
            keep_at[c] = keep
            add_lv[c], add_st[c] = [], []
            if lv is not None:
                st = sts[c]
                for i in range(keep, len(lv)):
                    x = lv[i]
                    if x not in queued:
                        queued.add(x)
                        push(todo, x)
                    d = due.get(x)
                    if d is None:
                        due[x] = [(c, st[i][3])]
                    else:
                        d.append((c, st[i][3]))
            n = len(gone.get(c, ()))
            if keep:
                r, w, k, _ = sts[c][keep - 1]
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
            add_st[c].append((rem[c], wsum[c], left_c, k))

        for g in was:
            level = was[g]
            upset.add(level)
            if level not in queued:
                queued.add(level)
                push(todo, level)
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
        visited = 0
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
            kept = due.pop(level, ())
            if old is not None and not (heap and heap[0][0] == level) and level not in upset:
                # the last solve's round as it was (its channels and flows kept): only dirty channels compute
                for c, k in kept:
                    change(c, k, level)
                continue
            at: dict[int, None] = {}  # the channels at this level: kept ones of the last solve's round, dirty ones
            if old is not None:
                made[level] = ([], [])
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
            visited += len(now) if old is None else len(now) + len(old[1])
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
                    upset.add(x)
                    if x not in queued:
                        queued.add(x)
                        push(todo, x)
                    for c in path[g]:
                        if c not in keep_at:
                            dirty(c, level)
            k_new: dict[int, int] = {}
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
                    if c in keep_at:
                        change(c, k, level)
            for g in now:
                if g in loose:
                    loose.discard(g)
                    frozen[g] = level
                elif rates[g] != level:
                    frozen[g] = level
            if now:
                made[level] = (list(at), list(now))
        self.reran = reran
        self.visited += visited
        if loose:  # (a flow whose channels all went bare: they were not slack)
            stuck = {c for g in loose for c in path[g] if c in slack}
            return stuck or None
        if slack:  # the bare channels must still be slack with the new rates, else solved with their states
            more: dict[int, float] = {}
            for g, r in frozen.items():
                d = r - rates.get(g, 0.0)
                if d:
                    for c in path[g]:
                        if c in slack:
                            more[c] = more.get(c, 0.0) + d
            tight = {c for c in slack if use[c] + more.get(c, 0.0) > cap[c] * PROOF}
            if tight:
                return tight
        self._commit(keep_at, slack, add_lv, add_st, made, gone)
        changed: dict[int, float] = {}
        ops = self._ops
        for g, r in frozen.items():
            d = r - rates.get(g, 0.0)
            if d:
                changed[g] = rates[g] = r
                for c in path[g]:
                    use[c] += d
                    n = ops[c] = ops[c] + 1
                    if n >= RESYNC:
                        use[c] = math.fsum(rates[f] for f in on[c] if f in rates)
                        ops[c] = 0
        return changed

    def _commit(
        self,
        keep_at: dict[int, int],
        slack: set[int],
        add_lv: dict[int, list[float]],
        add_st: dict[int, list[tuple[float, float, int, int]]],
        made: dict[float, tuple[list[int], list[int]]],
        gone: dict[int, list[int]],
    ) -> None:
        """The solve's rounds and channel states kept for the next one."""
        on, lvs, sts, rounds, at_of, bare = self._on, self._lv, self._st, self._rounds, self._at, self._bare
        for level in made:
            for c in rounds.pop(level)[0] if level in rounds else ():
                if at_of.get(c) == level:
                    del at_of[c]
        for level, rnd in made.items():
            if rnd[1]:
                rounds[level] = rnd
                for c in rnd[0]:
                    at_of[c] = level
        for c in slack:
            lvs.pop(c, None)
            sts.pop(c, None)
            if c in on:
                bare.add(c)
            else:
                self._drop(c)
        for c, keep in keep_at.items():
            bare.discard(c)
            lv = lvs.get(c)
            if c not in on:
                if lv is not None:
                    del lvs[c], sts[c]
                self._drop(c)
            elif lv is None:
                lvs[c], sts[c] = add_lv[c], add_st[c]
            else:
                st = sts[c]
                del lv[keep:], st[keep:]
                n = len(gone.get(c, ()))
                if n:
                    st[:] = [(r, w - n, k - n, f) for r, w, k, f in st]
                lv += add_lv[c]
                st += add_st[c]

    def _drop(self, c: int) -> None:
        """Channel c has no flows left: nothing of it is kept."""
        self._use.pop(c, None)
        self._ops.pop(c, None)
        self._bare.discard(c)

    def _rebuild(self, c: int, was: dict[int, float], gone: dict[int, list[int]], new: set[int]) -> None:
        """A bare channel's states as the last solve left them, from its flows' last rates (those that left
        included, those that joined not): progressive filling's operations on it, round by round."""
        frozen_at: dict[float, int] = {}
        for g in self._on.get(c, ()):
            if g not in new:
                x = self._rate[g]
                frozen_at[x] = frozen_at.get(x, 0) + 1
        for g in gone.get(c, ()):
            x = was[g]
            frozen_at[x] = frozen_at.get(x, 0) + 1
        k_left = sum(frozen_at.values())
        r, w = self._cap[c], float(k_left)
        lv: list[float] = []
        st: list[tuple[float, float, int, int]] = []
        for x in sorted(frozen_at):
            k = frozen_at[x]
            k_left -= k
            if k_left:
                r = max(r - k * x, 0.0)
                w = w - k
            lv.append(x)
            st.append((r, w, k_left, k))
        self._lv[c], self._st[c] = lv, st
        self._bare.discard(c)
