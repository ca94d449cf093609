"""`GateBounds`: every gating flow's chain bound (`Chain.value`) at once, in arrays carried across rounds.

Route (a)'s driver (`HybridDecomposedSimulator`) stops each worker at the earliest end of a flow on another worker
that one of its flows waits on (a gating flow), + the gate's lookahead. A gating flow's bound pulled along its chain
of single dependencies is

    sums[pos] + max(after, max over the unfinished positions p <= pos of max(raised lb[p], floor[worker(p)]) - sums[p])

(`phantora.netsim.chain_bounds`: a position's bound counts once raised above the chain's static bound, which `after`
covers; a worker's floor at its first flow from there, the one with the least step sum). Walking the gating flows in
Python each round was most of the driver's time between rounds (issue 38, item 2: thousands of ring flows whose bounds
follow their worker's floor, pulled again every round to tie with the first). Here the chains that hold gating flows
lie end to end in flat arrays (step sums, each flow's worker, raised bound and end) with each chain's first unfinished
position and `after`; a round's completions and rises update them (`ended`, `rose`), and `bounds` evaluates the
formula for every gating flow with a few array operations. A gating flow whose chain's head is unfinished and waits
on deps is bounded by those deps' latest end or bound too, + the step sums up to it: the deps' bounds come from the
same arrays when each dep lies in them and its own chain's head does not wait; otherwise `limits` hands the flow
back, to be pulled from its deps (`_pulled`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import chain as chained

import numpy as np

from phantora.netsim.chain_bounds import Chain
from phantora.netsim.sorted_unique import sorted_unique

NEG = -(1 << 62)  # below every bound: no term
_SPAN = 1 << 40  # raised terms within this span get one running max, reset per chain by a chain-sized step
DENSE = 4  # the chains' flows are found by a table indexed by id when their ids span at most this many a flow


class GateBounds:
    """The chain bounds of a set of gating flows and the worker limits they give, kept current by `ended` and
    `rose` (the chains' state is read at construction: `lbs` and `ends` as the driver keeps them)."""

    def __init__(
        self,
        gating: Sequence[int],
        targets: dict[int, set[tuple[int, bool]]],
        chain_of: dict[int, tuple[Chain, int]],
        owner: dict[int, int],
        lbs: dict[int, int],
        ends: dict[int, int],
        workers: int,
        latency: int,
    ) -> None:
        ids: dict[int, int] = {}  # id(chain) -> its index
        objs: list[Chain] = []
        g_chain, g_pos = [], []
        for f in gating:
            ch, pos = chain_of[f]
            c = ids.get(id(ch))
            if c is None:
                c = ids[id(ch)] = len(objs)
                objs.append(ch)
            g_chain.append(c)
            g_pos.append(pos)
        nodes = list(chained.from_iterable(ch.nodes for ch in objs))
        n = len(nodes)
        lens = np.fromiter(map(len, (ch.nodes for ch in objs)), np.int64, len(objs))
        self.off = np.zeros(len(objs), np.int64)  # each chain's first flat position
        np.cumsum(lens[:-1], out=self.off[1:])
        flows = np.asarray(nodes, np.int64)
        self._order = np.argsort(flows, kind="stable")  # flat positions by flow id, for `_where`
        self._sorted = flows[self._order]
        # ids close together (a planner's ranges): each id's flat position in a table, -1 at both ends and between
        # (`_where` reads it with one clipped take instead of a binary search an id)
        self._lo, self._table = 0, None
        if n and int(self._sorted[-1]) - int(self._sorted[0]) < DENSE * n:
            self._lo = int(self._sorted[0]) - 1
            self._table = np.full(int(self._sorted[-1]) - self._lo + 2, -1, np.int64)
            self._table[flows - self._lo] = np.arange(n, dtype=np.int64)
        self.sums = np.append(np.fromiter(chained.from_iterable(ch.sums for ch in objs), np.int64, n), 0)
        self.chain = np.repeat(np.arange(len(objs), dtype=np.int64), lens)
        worker = np.fromiter(map(owner.__getitem__, nodes), np.int64, n)
        # per worker, from each flat position the first flow of that worker at or after it (n: none); one of a later
        # chain lies past every gating flow of this one (a marker's worker is the driver: no floor)
        self.next_of: list[np.ndarray] = []
        for w in range(workers):
            nxt = np.where(worker == w, np.arange(n, dtype=np.int64), n)
            self.next_of.append(np.append(np.minimum.accumulate(nxt[::-1])[::-1], n))
        self.lb = np.fromiter((lbs.get(f, NEG) for f in nodes), np.int64, n)
        self.end = np.fromiter((ends.get(f, 0) for f in nodes), np.int64, n)
        self.static = np.fromiter((ch.static for ch in objs), np.int64, len(objs))
        self.k0 = np.fromiter((_first_unfinished(ch.nodes, lbs) for ch in objs), np.int64, len(objs))
        self.after = self.static.copy()
        self.head_deps = np.fromiter((bool(ch.deps) for ch in objs), bool, len(objs))
        raised = [o + p for o, ch in zip(self.off.tolist(), objs, strict=True) for p in ch.raised]
        self.raised = sorted_unique(np.asarray(raised, np.int64))  # flat positions whose bound rose (sorted)
        self.workers = workers
        self._ended: list[int] = []
        self._stamps: list[int] = []
        self._rose: list[int] = []
        self._rises: list[int] = []
        # one row per gating flow and worker it gates (a marker's gate: every worker): the flow, the worker, the
        # lookahead (0 for an NVLink flow's gate or a marker's, L - 1 for a fabric flow's)
        rows, vs, aheads = [], [], []
        for i, f in enumerate(gating):
            for w, zero in sorted(targets[f]):
                for v in range(workers) if w < 0 else (w,):
                    rows.append(i)
                    vs.append(v)
                    aheads.append(0 if zero else latency - 1)
        # the deps lists of chains whose heads wait on deps (one list object shared by a batch's flows), each of
        # whose deps lies in these chains: their flat positions end to end (dep_starts: each list's first)
        self.list_of = np.full(len(objs), -1, np.int64)  # chain -> its list, -1: none (or not followed: `_pulled`)
        index = dict(zip(nodes, range(n), strict=True))
        lists: dict[int, int] = {}
        flat: list[list[int]] = []
        for c, ch in enumerate(objs):
            if not ch.deps or self.k0[c] > 0:
                continue
            k = lists.get(id(ch.deps))
            if k is None:
                got = [index.get(d, -1) for d in ch.deps]
                k = lists[id(ch.deps)] = len(flat) if -1 not in got else -1
                if k >= 0:
                    flat.append(got)
            self.list_of[c] = k
        self.dep_flat = np.asarray([x for got in flat for x in got], np.int64)
        self.dep_chain = self.chain[self.dep_flat]
        # what the rounds read of the deps and never changes, gathered once: their chains' first flat positions,
        # their step sums, whether their chains' heads wait on deps
        self.dep_off = self.off[self.dep_chain]
        self.dep_sums = self.sums[self.dep_flat]
        self.dep_head = self.head_deps[self.dep_chain]
        self.dep_starts = np.cumsum([0] + [len(got) for got in flat[:-1]], dtype=np.int64)
        self._run: np.ndarray | None = None
        self.gating = list(gating)
        self.g_chain = np.asarray(g_chain, np.int64)
        self.g_flat = self.off[self.g_chain] + np.asarray(g_pos, np.int64)
        self.rows = np.asarray(rows, np.int64)
        self.row_v = np.asarray(vs, np.int64)
        self.row_ahead = np.asarray(aheads, np.int64)
        self._gathered_once()
        self._moved(np.arange(len(objs), dtype=np.int64))

    def _gathered_once(self) -> None:
        """What the rounds read of the gating flows and changes only when some of them are dropped (`_moved`):
        their chains' first flat positions, their step sums, whether their chains' heads wait on deps, their
        chains' deps lists; each worker's rows."""
        gc = self.g_chain
        self.g_off = self.off[gc]
        self.g_sums = self.sums[self.g_flat]
        self.g_head = self.head_deps[gc]
        self.g_list = self.list_of[gc]
        self.row_of = [self.row_v == v for v in range(self.workers)]

    def ended(self, ids: list[int], ends: list[int]) -> None:
        """Flows done at `ends` (any flows: those outside the chains are left out)."""
        self._ended += ids
        self._stamps += ends

    def rose(self, fids: list[int], ns: list[int]) -> None:
        """Flows `fids`' bounds rose to `ns` (any flows: those outside the chains are left out)."""
        self._rose += fids
        self._rises += ns

    def _where(self, flows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(the flat positions of those of `flows` in the chains, which of `flows` they are)."""
        ids = _array(flows)
        if self._table is not None:  # (an id outside the table's span clipped to an end: -1, as between)
            at = np.take(self._table, ids - self._lo, mode="clip")
            hit = np.flatnonzero(at >= 0)
            return at[hit], hit
        k = np.minimum(np.searchsorted(self._sorted, ids), len(self._sorted) - 1)
        hit = np.flatnonzero(self._sorted[k] == ids)
        return self._order[k[hit]], hit

    def _catch_up(self) -> None:
        """Apply the completions and rises since the last call: each chain's first unfinished flow (flows of a chain
        end in its order) and `after`, the raised bounds; gating flows done are dropped."""
        if self._ended and len(self._sorted):
            idx, hit = self._where(self._ended)
            self.end[idx] = _array(self._stamps)[hit]
            idx = np.sort(idx)
            cs = self.chain[idx]
            last = np.ones(len(idx), bool)  # the last flow done of each chain (sorted: chains lie in order)
            last[:-1] = cs[1:] != cs[:-1]
            cs, top = cs[last], idx[last] - self.off[cs[last]] + 1
            grew = top > self.k0[cs]
            self.k0[cs[grew]] = top[grew]
            self._moved(cs[grew])
        self._ended, self._stamps = [], []
        if self._rose and len(self._sorted):
            idx, hit = self._where(self._rose)
            np.maximum.at(self.lb, idx, _array(self._rises)[hit])  # (bounds only rise)
            self.raised = sorted_unique(np.concatenate((self.raised, idx)))
        self._rose, self._rises = [], []

    def _moved(self, cs: np.ndarray) -> None:
        """Chains `cs` have a new first unfinished flow: their `after` (the end of the flow before it, less its step
        sum, at least the chain's static bound: `Chain.value`); raised flows and gating flows now done dropped."""
        cs = cs[self.k0[cs] > 0]
        if not len(cs):
            return
        at = self.off[cs] + self.k0[cs] - 1
        self.after[cs] = np.maximum(self.static[cs], self.end[at] - self.sums[at])
        rp = self.raised
        if len(rp):
            rc = self.chain[rp]
            self.raised = rp[rp >= self.off[rc] + self.k0[rc]]
        live = self.g_flat >= self.g_off + self.k0[self.g_chain]
        if not live.all():
            keep = np.cumsum(live) - 1  # old gating index -> new
            rows = live[self.rows]
            self.rows = keep[self.rows[rows]]
            self.row_v, self.row_ahead = self.row_v[rows], self.row_ahead[rows]
            self.gating = np.asarray(self.gating, object)[live].tolist()
            self.g_chain, self.g_flat = self.g_chain[live], self.g_flat[live]
            self._gathered_once()

    def _chain_values(
        self, floors: list[int], flat: np.ndarray, chains: np.ndarray, start: np.ndarray, sums: np.ndarray
    ) -> np.ndarray:
        """The chain bound at each of the unfinished flat positions `flat` (of chains `chains`, whose first
        unfinished flows are at `start`; `sums`: the step sums at `flat`), head deps left out."""
        best = self.after[chains]
        for w in range(self.workers):  # the first flow of worker w from there, if at or before the position
            q = self.next_of[w][start]
            best = np.maximum(best, np.where(q <= flat, floors[w] - self.sums[q], NEG))
        if self._run is not None:
            rp, run = self.raised, self._run
            j = np.searchsorted(rp, flat, side="right") - 1
            jj = np.maximum(j, 0)
            ok = (j >= 0) & (rp[jj] >= start)  # (a raised flow of the same chain, from its first unfinished on)
            best = np.maximum(best, np.where(ok, run[jj], NEG))
        return best + sums

    def bounds(self, floors: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(each unfinished gating flow's bound, whether it is exact: its chain's head done, without deps, or with
        deps whose bounds are exact), in the order of `gating`, for the workers' `floors`. A chain whose head waits
        on deps is bounded by their latest end or bound too, + the step sums up to the flow (`_pulled`)."""
        self._catch_up()
        self._run = None
        rp = self.raised
        if len(rp):  # each raised flow's bound less its step sum, the most up to it along its chain
            rv = self.lb[rp] - self.sums[rp]
            rc = self.chain[rp]
            low = int(rv.min())
            if int(rv.max()) - low < _SPAN:
                self._run = np.maximum.accumulate(rv - low + rc * _SPAN) - rc * _SPAN + low
            else:  # (bounds far apart: the running max per chain, in Python)
                run = rv.copy()
                for k in range(1, len(rp)):
                    if rc[k] == rc[k - 1] and run[k - 1] > run[k]:
                        run[k] = run[k - 1]
                self._run = run
        gc, gf = self.g_chain, self.g_flat
        k0 = self.k0[gc]
        value = self._chain_values(floors, gf, gc, self.g_off + k0, self.g_sums)
        exact = (k0 > 0) | ~self.g_head
        if len(self.dep_flat) and not exact.all():
            dc, df = self.dep_chain, self.dep_flat
            dk0 = self.k0[dc]
            start = self.dep_off + dk0
            done = df < start
            got = np.where(done, self.end[df], self._chain_values(floors, df, dc, start, self.dep_sums))
            sure = done | (dk0 > 0) | ~self.dep_head  # (a dep whose own head waits: not followed here)
            latest = np.maximum.reduceat(got, self.dep_starts)  # per deps list
            known = np.logical_and.reduceat(sure, self.dep_starts)
            lists = self.g_list
            use = ~exact & (lists >= 0)
            use[use] = known[lists[use]]
            t = latest[lists[use]]
            value[use] = np.maximum(value[use], np.where(t >= 0, t + self.g_sums[use], NEG))
            exact = exact | use
        return value, exact

    def limits(self, floors: list[int], hz: list[int]) -> list[tuple[int, int]]:
        """Lower each worker's limit `hz` (in place) to the exact bounds + lookahead of the gating flows into it;
        return (bound, flow) of the others (their chain's head waits on deps not followed here) that are below a
        limit they gate, least first."""
        if not self.gating:
            self._catch_up()
            return []
        value, exact = self.bounds(floors)
        rows, row_v = self.rows, self.row_v
        at = value[rows] + self.row_ahead
        exact = exact[rows]
        for v in range(self.workers):
            m = exact & self.row_of[v]
            if m.any():
                hz[v] = min(hz[v], int(at[m].min()))
        m = ~exact & (at < np.asarray(hz, np.int64)[row_v])
        if not m.any():
            return []
        idx = sorted_unique(rows[m]).tolist()
        gating = self.gating
        return sorted(zip(value[idx].tolist(), [gating[i] for i in idx], strict=True))


def _array(ints: list[int]) -> np.ndarray:
    """A round's ids or ns as int64s, read only: packed by `struct` and read in place (about half the instructions
    of `fromiter`, a quarter fewer than `asarray`'s; an int beyond int64 raises struct.error)."""
    return np.frombuffer(struct.pack(f"{len(ints)}q", *ints), np.int64)


def _first_unfinished(nodes: list[int], lbs: dict[int, int]) -> int:
    k = 0
    while k < len(nodes) and nodes[k] not in lbs:
        k += 1
    return k
