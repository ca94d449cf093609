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
from typing import Any

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

    def _pulled(
        self, fid: int, floors: list[int], memo: dict[int, int], part: set[int], wide: dict[int, int], need: int
    ) -> int:
        """A lower bound of flow `fid`'s end: its bound, raised to its worker's floor (no flow of a worker ends
        before its next event, nor at or before the gathered time) and from each unfinished dep's (pulled in turn)
        + its step; all of that, exactly, whenever it is below `need`. A dep that lifts it to `need` ends its walk
        (the other deps cannot lower it), so a flow that cannot bind the horizon is shown so down one chain, not
        through all its ancestors. Once per round (`memo`: the flows whose value stopped at a need are in `part`,
        walked on if a later need is higher); a wide deps list's latest, shared by many flows, once per round
        (`wide`, by the list's identity, one per batch and worker). Every value is written back into the bounds: a
        lower bound, whether the walk stopped early or not."""
        lbs, deps_of, step, owner = self._lb, self._deps_of, self._step, self._owner
        assert deps_of is not None
        got = memo.get(fid)
        if got is not None and (got >= need or fid not in part):
            return got
        stack: list[list[Any]] = [[fid, need, None, 0, 0]]  # [flow, need, its deps (None: not yet read), next, lb]
        ret = -1  # the value of the frame just closed, for its parent
        while stack:
            fr = stack[-1]
            if len(fr) == 3:  # a wide deps list's latest: each dep's whole pull in turn, on this stack (no recursion)
                deps, i, best = fr
                if ret > best:
                    best = ret
                ret = -1
                n = len(deps)
                while i < n:
                    d = deps[i]
                    i += 1
                    if d not in lbs:
                        continue
                    m = memo.get(d)
                    if m is not None and d not in part:
                        if m > best:
                            best = m
                        continue
                    fr[1], fr[2] = i, best
                    stack.append([d, INF_NS, None, 0, 0])
                    break
                else:
                    wide[id(deps)] = best
                    stack.pop()  # its flow opens again and finds it
                continue
            x, t, deps, i, v = fr
            s = step[x]
            if deps is None:  # opened: its own bound and floor, a wide list's latest at once
                v = lbs[x]
                w = owner[x]
                if w != DRIVER and floors[w] > v:
                    v = floors[w]
                deps = deps_of.get(x, ())
                if len(deps) >= SHARED_DEPS_MIN:
                    latest = wide.get(id(deps))
                    if latest is None:
                        stack.append([deps, 0, -1])
                        ret = -1
                        continue
                    if latest >= 0 and latest + s > v:
                        v = latest + s
                    deps = ()
                fr[2] = deps
            elif ret >= 0 and ret + s > v:  # a dep's walk came back
                v = ret + s
            ret = -1
            n = len(deps)
            while i < n and v < t:
                d = deps[i]
                i += 1
                if d not in lbs:
                    continue  # (done: its end is in this flow's bound)
                m = memo.get(d)
                if m is not None and (m + s >= t or d not in part):
                    if m + s > v:
                        v = m + s
                    continue
                fr[3], fr[4] = i, v
                stack.append([d, t - s, None, 0, 0])
                break
            else:
                lbs[x] = memo[x] = v
                if i < n:
                    part.add(x)
                else:
                    part.discard(x)
                stack.pop()
                ret = v
        return ret

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
        part: set[int] = set()
        wide: dict[int, int] = {}
        r = INF_NS
        for f in self._watch:
            if f in lbs:
                r = min(r, self._pulled(f, floors, memo, part, wide, r))
        for t, fid, _ in self._buffer:
            if fid in self._watch:
                r = min(r, t)
        hz = [min(until, r)] * n
        top = hz[0]
        # (a bound as last pulled is below its pulled one; one at or past every worker's limit cannot lower one)
        for lb, f in sorted([(x, f) for f in self._ext if (x := lbs[f]) < top]):
            if lb >= top:
                break  # neither this flow nor a later one can lower a worker's limit
            need = -1  # the most this flow's end can lower a worker's limit from, less the gate's lookahead
            for w, zero in targets[f]:
                ahead = 0 if zero else latency - 1
                for v in range(n) if w == DRIVER else (w,):
                    if lb + ahead < hz[v]:
                        need = max(need, hz[v] - ahead)
            if need < 0:
                continue
            t = self._pulled(f, floors, memo, part, wide, need)  # (exact if it lowers any)
            for w, zero in targets[f]:
                ahead = 0 if zero else latency - 1
                for v in range(n) if w == DRIVER else (w,):
                    hz[v] = min(hz[v], t + ahead)
            top = max(hz)
        self._hz = hz
        self._react_ns = r
        self.bound_wall_s += time.perf_counter() - t0
        return min(hz)
