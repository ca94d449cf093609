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

import time
from collections.abc import Collection

from phantora.netsim.base import INF_NS, Completion, Flow, watch_by_completions
from phantora.netsim.decompose import DRIVER, DecomposedSimulator, Spawner
from phantora.netsim.hybrid import SHARED_DEPS_MIN
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology


class HybridDecomposedSimulator(DecomposedSimulator):
    """A `NetworkSimulator` (and `FabricObserver`) over N workers, each the fluid NVLink hybrid of its flows."""

    worker_side = "hybrid"
    raises_wide = False  # `_pulled` reads the wide lists' unfinished deps (whose bounds pass the ended ones' ends)

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
        self._targets = {}
        self._watch: Collection[int] = ()
        self.reacts = self._watch.__contains__
        self._place = self._placed

    def _placed(self, f: Flow) -> tuple[int, int]:
        """(its worker, or DRIVER for a marker; the least time from its post to its end, delay left out)."""
        if f.size == 0 or f.src == f.dst:
            return DRIVER, 0
        nv = self.topology.shared_nvswitch(f.src, f.dst)
        if nv is None:
            piece, propagation, bottleneck = self._routes.of(f)
            return self._piece_worker[piece], self.latency + propagation + f.size * 8_000_000_000 // bottleneck
        self._zero.add(f.id)  # type: ignore[union-attr]
        least = max(0, f.size * 8_000_000_000 // self._out_bw[f.src] - 2)
        return self._nv_worker[nv], least + self._out_lat[f.src]

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """Towards `until`; return after the first ns at which a flow in `watch` completes (rounds stop there)."""
        self._watch = watch
        self.reacts = watch.__contains__
        try:
            return watch_by_completions(self, until, watch)
        finally:
            self._watch = ()
            self.reacts = self._watch.__contains__

    def _raise(self, fid: int, ns: int) -> None:
        """lb(fid) >= ns, not carried down its dependents here: the driver holds the whole DAG, and a rise carried
        down every chain behind it costs the chain's length per completion. `_pulled` carries rises up to the
        flows a round's horizon reads, when it reads them (a bound not carried is still a lower bound)."""
        if ns > self._lb.get(fid, INF_NS):
            self._lb[fid] = ns

    def _pulled(self, fid: int, floors: list[int], memo: dict[int, int], wide: dict[tuple[int, ...], int]) -> int:
        """lb(fid), raised from its unfinished deps' (pulled in turn, once per round: `memo`; the latest of a wide
        deps list, shared by many flows, once per round: `wide`) + its step, and to its worker's floor (no flow of
        a worker ends before its next event, nor at or before the gathered time)."""
        lbs, deps_of, step, owner = self._lb, self._deps_of, self._step, self._owner
        assert deps_of is not None
        stack = [fid]
        while stack:
            x = stack[-1]
            if x in memo:
                stack.pop()
                continue
            deps = deps_of.get(x, ())
            many = len(deps) >= SHARED_DEPS_MIN
            latest = wide.get(deps, -1) if many else -1
            if latest < 0:
                todo = [d for d in deps if d in lbs and d not in memo]
                if todo:
                    stack.extend(todo)
                    continue
                for d in deps:
                    t = memo.get(d)
                    if t is not None and t > latest:
                        latest = t
                if many:
                    wide[deps] = latest
            stack.pop()
            v = lbs[x]
            w = owner[x]
            if w != DRIVER and floors[w] > v:
                v = floors[w]
            if latest >= 0 and latest + step[x] > v:
                v = latest + step[x]
            lbs[x] = memo[x] = v
        return memo[fid]

    def _horizon(self, until: int) -> int:
        """How far each worker may run (`_hz`; the least of them is returned: every completion up to it is gathered
        after the round). A worker's limit: `until` (the caller may submit an NVLink flow there), the earliest end of
        a flow the caller watches, and for each gate into it (a marker's: into every worker) the earliest end of a
        flow it waits on, + L - 1 for a fabric flow's gate. A flow's earliest end is its bound pulled from its deps'
        (`_pulled`); the gating flows are read in the order of their bounds as last pulled, and no further once
        that passes every worker's limit. So the worker that runs a flow another worker's NVLink flow waits on runs
        on past it (what waits on it is elsewhere) and the next round starts from its real end."""
        t0 = time.perf_counter()
        lbs, wtime, latency, targets = self._lb, self._wtime, self.latency, self._targets
        assert targets is not None
        n = len(self._out)
        floors = [
            max(wtime, now) + 1 if not out.empty() or nxt is None else max(wtime + 1, now + 1, nxt)
            for out, nxt, now in zip(self._out, self._next, self._wnow, strict=True)
        ]
        memo: dict[int, int] = {}
        wide: dict[tuple[int, ...], int] = {}
        r = INF_NS
        for f in self._watch:
            if f in lbs:
                r = min(r, self._pulled(f, floors, memo, wide))
        for t, fid, _ in self._buffer:
            if fid in self._watch:
                r = min(r, t)
        hz = [min(until, r)] * n
        top = hz[0]
        for lb, f in sorted((lbs[f], f) for f in self._ext):  # (a bound as last pulled is below its pulled one)
            if lb >= top:
                break  # neither this flow nor a later one can lower a worker's limit
            t = -1
            for w, zero in targets[f]:
                ahead = 0 if zero else latency - 1
                for v in range(n) if w == DRIVER else (w,):
                    if lb + ahead < hz[v]:
                        if t < 0:
                            t = self._pulled(f, floors, memo, wide)
                        hz[v] = min(hz[v], t + ahead)
            top = max(hz)
        self._hz = hz
        self._react_ns = r
        self.bound_wall_s += time.perf_counter() - t0
        return min(hz)
