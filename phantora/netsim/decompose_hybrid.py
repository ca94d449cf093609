"""`HybridDecomposedSimulator`: workers=N with the whole fluid NVLink hybrid in each worker (issue 38, route (a)).

`DecomposedSimulator` under `FluidNvlinkSimulator` runs the fluid NVLink side, its releases and the hybrid's
holds in the driver, serially, while the workers run only ns-3. Here each worker runs the hybrid itself
(`phantora.netsim.hybrid_worker`): the fabric flows of its rail pieces and the NVLink flows of the hosts it owns
(NVSwitches round-robin on the workers, as pieces are). A dependency between two flows of one worker, on either
side, is resolved in that worker as in one engine; the driver keeps only the cross-worker ones, as gates, and
routes their completions.

Lookahead. A fabric flow released at p sends from p + L (the NIC latency), so a gate on it lets every worker run to
E + L - 1; an NVLink flow (or a marker, which completes here and may open gates) starts at p itself, with no
lookahead: a gate on it lets every worker run to E only (every event at E run, as one engine has run them when a
completion at E releases the flow, whose start then comes after them). An NVLink flow's earliest end, for the
bound, is its post ns + delay + its size at the fastest line rate leaving its source (never faster: the fluid rate
never exceeds a channel's capacity) - 2 ns (rounding) + the least latency of a channel leaving its source.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Collection, Sequence
from itertools import compress, repeat

from phantora.netsim.base import INF_NS, Completion, Flow, watch_by_completions
from phantora.netsim.chain_bounds import Chain
from phantora.netsim.decompose import DRIVER, DecomposedSimulator, Spawner
from phantora.netsim.gate_bounds import GateBounds
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology

NOTE_MAX = 1 << 16  # rises left unnoted in the chains at most (`_note_rises`)


class HybridDecomposedSimulator(DecomposedSimulator):
    """A `NetworkSimulator` (and `FabricObserver`) over N workers, each the fluid NVLink hybrid of its flows."""

    worker_side = "hybrid"
    raises_wide = False  # `_pulled` reads the ends and bounds of the deps of a chain's head, wide lists' too
    raises_dependents = False  # ... and of the flow before a chain's first unfinished one (`Chain.value`)
    tracks_unfinished = False  # its horizon reads the gating flows' arrays, its raises the chains, not the step dicts
    pulls_bounds = False  # its own pulls along chains (`_pulled`)
    opens_outer = False  # its horizon reads its own books: a flow behind the fluid side's gates is held by the hybrid

    def __init__(self, topology: Topology, config: PacketConfig, spawn: Spawner) -> None:
        super().__init__(topology, config, spawn)
        n = len(self._out)
        nvswitches = [node.id for node in topology.nodes if node.kind == "nvswitch"]
        self._nv_worker = {v: i % n for i, v in enumerate(nvswitches)}
        self._out_bw: dict[int, int] = {}  # node -> the fastest channel leaving it (bps)
        self._out_lat: dict[int, int] = {}  # node -> the least latency of a channel leaving it (ns)
        for c in range(topology.num_channels):
            a, _ = topology.channel_ends(c)
            self._out_bw[a] = max(self._out_bw.get(a, 0), topology.channel_bandwidth(c))
            self._out_lat[a] = min(self._out_lat.get(a, INF_NS), topology.channel_latency(c))
        self._zero = set()
        self._deps_of = {}
        self._chain_of: dict[int, tuple[Chain, int]] = {}  # flow -> (its chain, its position there)
        self._targets = {}
        self._watch: Collection[int] = ()
        self.reacts = self._watch.__contains__
        self._place = self._placed
        self._pairs: dict[tuple[int, int], tuple[int, bool, int, int]] = {}  # `_pair_place`, per endpoint pair
        # every gating flow's chain bound, in arrays carried across rounds (built with a large batch's books, else at
        # the next horizon)
        self._gates: GateBounds | None = None
        # flows whose bound the workers raised (`_bounds`) not yet noted in their chains' rises (`Chain.raised`): noted
        # when a chain bound is next read from the chains (`_note_rises`), not a Python call a rise
        self._unnoted: list[int] = []

    def _placed(self, f: Flow) -> tuple[int, int]:
        """(its worker, or DRIVER for a marker; the least time from its post to its end, delay left out)."""
        if f.size == 0 or f.src == f.dst:
            return DRIVER, 0
        got = None if f.via_nic else self._pairs.get((f.src, f.dst))
        if got is None:
            got = (-1, False, 0, -1) if f.via_nic else self._pair_place(f)
        w, nvlink, fixed, bps = got
        if bps < 0:  # (a fabric pair whose routes differ, or a flow keyed through the NICs: each flow routed)
            piece, propagation, bottleneck = self._routes.of(f)
            return self._piece_worker[piece], self.latency + propagation + f.size * 8_000_000_000 // bottleneck
        if nvlink:
            self._zero.add(f.id)  # type: ignore[union-attr]
            return w, max(0, f.size * 8_000_000_000 // bps - 2) + fixed
        return w, fixed + f.size * 8_000_000_000 // bps

    def _pair_place(self, f: Flow) -> tuple[int, bool, int, int]:
        """What `_placed` reads of a flow's endpoint pair, once per pair: (its worker, on NVLink, the fixed part of
        its least time, the rate its size crosses at), kept for the pair when it holds for every flow of it (an
        NVLink pair, or a fabric pair `PieceRoutes` summarises). A fabric pair whose routes differ keeps (-1,
        False, 0, -1), routed per flow; `f`'s own route, computed here, is returned for `f` (routed once)."""
        pair = (f.src, f.dst)
        nv = self.topology.shared_nvswitch(f.src, f.dst)
        if nv is not None:
            got = self._pairs[pair] = (self._nv_worker[nv], True, self._out_lat[f.src], self._out_bw[f.src])
            return got
        piece, propagation, bottleneck = self._routes.of(f)  # (InputError naming a flow that leaves its piece)
        got = (self._piece_worker[piece], False, self.latency + propagation, bottleneck)
        self._pairs[pair] = got if self._routes.summary(f.src, f.dst) is not None else (-1, False, 0, -1)
        return got

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """Towards `until`; return after the first ns at which a flow in `watch` completes (rounds stop there)."""
        self._watch = watch
        self.reacts = watch.__contains__
        try:
            return watch_by_completions(self, until, watch)
        finally:
            self._watch = ()
            self.reacts = self._watch.__contains__

    def _book(self, order: Sequence[Flow], at: int, xfer: dict[int, int], *, handed: bool) -> None:
        """The driver's books (`DecomposedSimulator._book`), then each flow of the batch into a chain (`Chain`):
        appended to its one dep's chain when that dep is unfinished and its chain's last flow, else the head of a
        chain of its own."""
        super()._book(order, at, xfer, handed=handed)
        lbs, step, owner, deps_of, chain_of = self._lb, self._step, self._owner, self._deps_of, self._chain_of
        assert deps_of is not None
        for f in order:
            fid = f.id
            lb = lbs.get(fid)
            if lb is None:
                continue  # (a marker done at once)
            s = step[fid]
            w = owner[fid]
            if len(f.deps) == 1:
                got = chain_of.get(f.deps[0])
                if got is not None and f.deps[0] in lbs and got[1] == len(got[0].nodes) - 1:
                    ch, pos = got[0], got[1] + 1
                    ch.add(fid, s, w)
                    chain_of[fid] = (ch, pos)
                    if lb - ch.sums[pos] > ch.static:
                        ch.raised.append(pos)
                    continue
            chain_of[fid] = (Chain(fid, s, lb - s, w, deps_of.get(fid, ())), 0)
        self._gates = None  # (new gating flows, targets or chain links: the arrays are built again)
        if handed:  # (a large batch: the arrays now, while the workers place their flows)
            self._gate_bounds()

    def _gate_bounds(self) -> GateBounds:
        """The gating flows' chain bounds, built from the books if a batch came since."""
        if self._gates is None:
            self._note_rises()
            ext, targets = self._ext, self._targets
            assert targets is not None
            gating = [f for f in targets if f in ext]
            self._gates = GateBounds(
                gating, targets, self._chain_of, self._owner, self._lb, self._ends, len(self._out), self.latency
            )
        return self._gates

    def _raise(self, fid: int, ns: int) -> None:
        """lb(fid) >= ns, kept as a rise of its chain (`Chain.raised`), not carried down its dependents: the driver
        holds the whole DAG, and a rise carried down every chain behind it costs the chain's length per completion.
        `_pulled` reads the rises of the chains up to the flows a round's horizon reads, when it reads them."""
        lbs = self._lb
        if ns > lbs.get(fid, INF_NS):
            lbs[fid] = ns
            if self._gates is not None:
                self._gates.rose([fid], [ns])
            got = self._chain_of.get(fid)
            if got is not None:
                raised = got[0].raised
                if got[1] not in raised:  # (a few positions: the frontier's and the gating flows' written back)
                    raised.append(got[1])

    def _ended(self, ids: list[int], ends: list[int]) -> None:
        """Flows done: the gating flows' chains move on (`GateBounds.ended`)."""
        if self._gates is not None:
            self._gates.ended(ids, ends)

    def _bounds(self, flat: list[int]) -> None:
        """A worker's completion bounds of its started flows ([id, ns, ...], those that rose), as rises (`_raise`), a
        reply's at once: those above a flow's bound set, passed to the arrays (`GateBounds.rose`), and noted for the
        chains' rises later (`_note_rises`)."""
        lbs = self._lb
        ids, ns = flat[0::2], flat[1::2]
        up = list(map(operator.gt, ns, map(lbs.get, ids, repeat(INF_NS))))  # (per bound: at C speed)
        if not all(up):
            ids, ns = list(compress(ids, up)), list(compress(ns, up))
        if len(set(ids)) < len(ids):  # (a flow twice in one reply: its rises one at a time, the highest kept)
            for fid, t in zip(ids, ns, strict=True):
                self._raise(fid, t)
            return
        lbs.update(zip(ids, ns, strict=True))
        if self._gates is not None:
            self._gates.rose(ids, ns)
        self._unnoted += ids
        if len(self._unnoted) > NOTE_MAX:
            self._note_rises()

    def _note_rises(self) -> None:
        """The rises `_bounds` left unnoted into their chains (`Chain.raised`: the positions whose bound rose), for a
        flow still unfinished (a done flow's position is behind its chain's first unfinished one)."""
        lbs, chain_of = self._lb, self._chain_of
        for fid in dict.fromkeys(self._unnoted):
            got = chain_of.get(fid) if fid in lbs else None
            if got is not None and got[1] not in got[0].raised:
                got[0].raised.append(got[1])
        self._unnoted = []

    def _pulled(self, fid: int, floors: list[int], memo: dict[int, int], wide: dict[int, int], need: int) -> int:
        """A lower bound of flow `fid`'s end: the most, over each unfinished flow x of its chain up to it, of x's
        bound raised to x's worker's floor (no flow of a worker ends before its next event, nor at or before the
        gathered time) + the steps after x (`Chain.value`), and, while its chain's head is unfinished, its
        unfinished deps' (pulled in turn) + every step of the chain up to it. All of that, exactly, whenever it is
        below `need`; at least `need` otherwise (the head's deps are not read when the chain alone reaches it).
        Exact values are kept for the round (`memo`), a deps list's latest by the list's identity (`wide`: one tuple
        shared by a batch's flows that wait on the same list); the head's deps are pulled on an explicit stack (a
        DAG of hundreds of collectives, each after the last, needs no recursion)."""
        got = memo.get(fid)
        if got is not None:
            return got
        if self._unnoted:
            self._note_rises()
        lbs, ends, chain_of = self._lb, self._ends, self._chain_of
        ch, pos = chain_of[fid]
        v = ch.value(pos, lbs, ends, floors)
        if ch.k0 or not ch.deps:
            memo[fid] = v
            return v
        if v >= need:
            return v
        stack = [fid]
        while stack:
            x = stack[-1]
            ch, pos = chain_of[x]
            deps = ch.deps
            key = id(deps)
            t = wide.get(key)
            if t is None:
                t = -1
                waits = False
                for d in deps:
                    if d not in lbs:
                        e = ends.get(d, -1)  # (done)
                        if e > t:
                            t = e
                        continue
                    m = memo.get(d)
                    if m is None:
                        dch, dpos = chain_of[d]
                        if dch.k0 or not dch.deps:
                            m = memo[d] = dch.value(dpos, lbs, ends, floors)
                        else:
                            stack.append(d)
                            waits = True
                            continue
                    if m > t:
                        t = m
                if waits:
                    continue
                wide[key] = t
            v = ch.value(pos, lbs, ends, floors)
            if t >= 0 and t + ch.sums[pos] > v:
                v = t + ch.sums[pos]
            memo[x] = v
            stack.pop()
        return memo[fid]

    def _horizon(self, until: int) -> int:
        """How far each worker may run (`_hz`; the least of them is returned: every completion up to it is gathered
        after the round). A worker's limit: `until` (the caller may submit an NVLink flow there), the earliest end of
        a flow the caller watches, and for each gate into it (a marker's: into every worker) the earliest end of a
        flow it waits on, + L - 1 for a fabric flow's gate. A flow's earliest end is its bound pulled from its deps'
        (`_pulled`). The gating flows' bounds along their chains come from `GateBounds`, all at once; only a flow
        whose chain's head still waits on deps is pulled here, in the order of those bounds, while its bound can
        lower a limit. So the worker that runs a flow another worker's NVLink flow waits on runs on past it (what
        waits on it is elsewhere) and the next round starts from its real end."""
        t0 = time.perf_counter()
        lbs, wtime, latency, targets = self._lb, self._wtime, self.latency, self._targets
        assert targets is not None
        n = len(self._out)
        floors = [
            max(wtime, now) + 1 if not out.empty() or nxt is None else max(wtime + 1, now + 1, nxt)
            for out, nxt, now in zip(self._out, self._next, self._wnow, strict=True)
        ]
        memo: dict[int, int] = {}
        wide: dict[int, int] = {}
        r = INF_NS
        for f in self._watch:
            if f in lbs:
                r = min(r, self._pulled(f, floors, memo, wide, r))
        for t, fid in self._buffer.pairs() if self._watch else ():  # (a drain watches nothing)
            if fid in self._watch:
                r = min(r, t)
        hz = [min(until, r)] * n
        for lb, f in self._gate_bounds().limits(floors, hz):
            # a flow whose chain's head waits on deps, its chain bound below a limit it gates: pulled from its deps
            need = -1  # the most this flow's end can lower a worker's limit from, less the gate's lookahead
            for w, zero in targets[f]:
                ahead = 0 if zero else latency - 1
                for v in range(n) if w == DRIVER else (w,):
                    if lb + ahead < hz[v]:
                        need = max(need, hz[v] - ahead)
            if need < 0:
                continue
            t = self._pulled(f, floors, memo, wide, need)  # (exact if it lowers any)
            if t > lbs[f]:
                self._raise(f, t)  # (a lower bound: the next round's chain bound reads it)
            for w, zero in targets[f]:
                ahead = 0 if zero else latency - 1
                for v in range(n) if w == DRIVER else (w,):
                    hz[v] = min(hz[v], t + ahead)
        self._hz = hz
        self._react_ns = r
        self.bound_wall_s += time.perf_counter() - t0
        return min(hz)
