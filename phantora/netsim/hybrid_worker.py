"""`HybridWorker`: a decomposition worker that runs the whole fluid-NVLink hybrid for its flows (issue 38, route (a)).

A plain decomposition worker runs only ns-3 for its rail pieces, and the fluid NVLink side runs in the driver
(`phantora.netsim.hybrid` over `phantora.netsim.decompose`). This one is the same hybrid as one engine
(`FluidNvlinkSimulator` over `NicLatencySimulator` over ns-3), fed only its own flows: its pieces' fabric flows and
the NVLink flows of the hosts it owns (`phantora.netsim.decompose_hybrid`). A flow arrives with its deps on this
worker's flows (either side); its deps elsewhere are a *gate* the driver opens at the ns they were all done. A gated
flow is held here until its gate opens (a pseudo dep, `gate_key`), so what waits on it (a ring's later steps) waits
as in one engine. Opening a gate at p releases the flow as a completion at p would: a packet flow is posted
at p (its first packet at p + L, the NIC latency: the driver let this worker run to p + L - 1 at most), a fluid flow
enters the fluid engine at p (the driver let this worker run to p at most: a fluid flow has no lookahead).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.hybrid import FLUID, FluidNvlinkSimulator
from phantora.netsim.nic_latency import NicLatencySimulator, gate_key

if TYPE_CHECKING:
    import numpy as np


class _Poster:
    """The packet side as `_release` submits to it: posted at the release ns, which may trail its now() by up to
    L - 1 (a gate opened for a round the worker ran ahead in; `NicLatencySimulator.post` checks it)."""

    def __init__(self, packet: NicLatencySimulator) -> None:
        self.packet = packet

    def submit(self, flows: Sequence[Flow], at: int) -> None:
        self.packet.post(flows, [at] * len(flows))


class HybridWorker(FluidNvlinkSimulator):
    """The fluid-NVLink hybrid over the NIC-latency packet side, driven by a decomposition driver's rounds."""

    def __init__(
        self, packet: NicLatencySimulator, fluid: FlowSimulator, *, payload_bytes: int, header_bytes: int
    ) -> None:
        super().__init__(packet, fluid, payload_bytes=payload_bytes, header_bytes=header_bytes)
        self._nic = packet
        self._poster = _Poster(packet)
        # Its flows come from the driver, which checked the whole DAG (`check_packet_batch`: ids, endpoints, fields,
        # deps, no cycle) and each flow's route in its worker's piece (`PieceRoutes`); a gate's pseudo dep is held
        # here. So no layer below checks a batch again: each check was a pass over the worker's part of the DAG in
        # its first round (on the critical path), and ns-3's another at each insertion.
        self.prechecked = True
        packet.trust_posts()
        # Each round ends with the completion bounds, which one engine never asks for: cppyy compiles the call's
        # wrapper at its first use (about 50 ms, 0.1 G instructions), so that is done here, at set-up (the workers
        # start while the driver plans), not in the first round, on the critical path. Nothing has started: no bound.
        packet.completion_bounds()

    def _engine(self, side: int) -> FlowSimulator | _Poster:  # type: ignore[override]
        return self.fluid if side == FLUID else self._poster

    def _hand_packet(self, groups: dict[int, list[Flow]]) -> None:
        """One post for all (a flow may wait on one of a later submit ns)."""
        flows = [f for group in groups.values() for f in group]
        self._nic.post(flows, [t for t, group in groups.items() for _ in group])

    def post(
        self,
        flows: Sequence[Flow],
        at: Sequence[int],
        gated: Collection[int] = (),
        gates: Sequence[tuple[int, int]] = (),
    ) -> None:
        """A round's input from the driver: `flows`, each eligible from its `at` ns, with deps on this worker's
        flows only; a flow in `gated` also waits for its gate; `gates` (flow id, ns) open gates, in any order."""
        if flows:
            self._place(flows, 0, {f.id: a for f, a in zip(flows, at, strict=True)}, set(gated))
        by_ns: dict[int, list[Completion]] = {}
        for fid, p in gates:
            g = gate_key(fid)
            by_ns.setdefault(p, []).append(Completion(g, p, p, 0, 0, 0))
        for p, opened in sorted(by_ns.items()):
            self._release(opened, p)

    def advance_to_completion(self, until: int) -> list[Completion]:
        """Run towards `until` (INF_NS: until nothing can happen), returning right after the first ns at which any
        flow completes (every event of that ns run, releases done)."""
        while True:
            if until >= INF_NS and self._idle():
                return []
            got = self._step(until)
            if got:
                return got
            if until < INF_NS and self.packet.now() >= until and self.fluid.now() >= until:
                return []

    def completion_bounds(self) -> dict[int, int]:
        """The packet side's (`NicLatencySimulator.completion_bounds`); the driver bounds fluid flows itself."""
        return self._nic.completion_bounds()

    def completion_bound_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """`completion_bounds` as int64 columns (ids, ns)."""
        return self._nic.completion_bound_columns()
