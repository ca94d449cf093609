"""The hybrid's joins (issue 38): flows held on one wide deps list wait on one join of it, not each on every dep.

A decomposition worker (`HybridWorker`, real ns-3 under it) is handed, as the driver hands them, 16 gated markers
(no bytes: fluid, each done its delay after its gate opens) and one NVLink flow per GPU pair of the tiny rail fabric
(3 hosts x 2 GPUs), each gated and waiting on all 16 markers (a wide list, as the second all-reduce's heads wait on
the first's tails). The markers' gates open at 1,000 ns, so marker i ends at 1,000 + 10 i and the last at 1,150: an
NVLink flow starts at the later of that and its own gate's ns, and ends a lone NVLink flow's time after (each pair has
its own path): 1 MiB at 3.6 Tb/s x 1000 / 1096 (the payload share beside the 48-byte headers of the data and of an
ACK a packet) = 2,554 ns rounded up, + 2 x 25 ns of propagation.
"""

from __future__ import annotations

from typing import Any

import pytest

from phantora.errors import PhantoraError
from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.factory import hybrid_worker
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.loader import load_topology
from tests.test_decompose import gpu, tiny

MARKERS = 16
GATES_OPEN = 1_000
LAST_MARKER = GATES_OPEN + 10 * (MARKERS - 1)  # 1,150 ns
NVLINK_NS = -(-(8 << 20) * 1096 // 3_600_000) + 2 * 25  # 2,604 ns


def _worker() -> Any:
    topo = tiny()
    return topo, hybrid_worker(topo, apply_overrides(PacketConfig(cc="dcqcn"), ["nvlink=fluid", "nic_latency=1us"]))


def _run(w: Any, until: int) -> list[Completion]:
    got: list[Completion] = []
    while step := w.advance_to_completion(until):
        got += step
    return got


def test_flows_sharing_a_wide_list_start_at_its_last_end_or_their_gate() -> None:
    topo, w = _worker()
    try:
        pairs = [(gpu(topo, h, r), gpu(topo, h, 1 - r)) for h in range(3) for r in range(2)]
        markers = [Flow(100 + i, pairs[0][0], pairs[0][0], 0, delay_ns=10 * i) for i in range(MARKERS)]
        deps = tuple(m.id for m in markers)
        heads = [Flow(200 + k, s, d, 1 << 20, deps) for k, (s, d) in enumerate(pairs)]
        flows = [*markers, *heads]
        w.post(flows, [0] * len(flows), {f.id for f in flows})
        # one join: each marker has one waiter (the join), the join one per head, each gate its flow
        waiting = sum(len(v) for v in w._waiters.values())
        assert waiting == MARKERS + len(heads) + len(flows), waiting
        assert w.in_flight() == len(flows)  # (the join is no flow)
        # the head's gates: before the last marker's end, at it, after it (and the rest with the markers')
        head_gate = {200: 500, 201: LAST_MARKER, 202: 1_600}
        w.post([], [], (), [(m.id, GATES_OPEN) for m in markers] + [(200, 500)])
        done = _run(w, LAST_MARKER)
        w.post([], [], (), [(201, LAST_MARKER)] + [(h.id, LAST_MARKER) for h in heads[3:]])
        done += _run(w, 1_600)
        w.post([], [], (), [(202, 1_600)])
        done += _run(w, INF_NS)
        ends = {c.flow_id: c for c in done}
        assert [ends[m.id].end_ns for m in markers] == [GATES_OPEN + 10 * i for i in range(MARKERS)]
        for h in heads:
            start = max(LAST_MARKER, head_gate.get(h.id, LAST_MARKER))
            assert ends[h.id].start_ns == start, (h.id, ends[h.id])
            assert ends[h.id].end_ns == start + NVLINK_NS, (h.id, ends[h.id])
        assert w.in_flight() == 0 and not w._held and not w._joins
    finally:
        w.close()


def test_a_join_is_transparent_to_the_reaction_of_its_deps() -> None:
    """On testbed16 (no ns-3: the flow engine on both sides), two NVLink flows of 3.6 MB each wait on 16 fabric
    flows (a wide list across sides: one join). A fabric flow's reaction is what waits behind the join: INF_NS while
    nothing waits on the NVLink flows (they hand nothing over), then, with a fabric flow after one of them, that
    NVLink flow's least time, 3.6e6 x 8 / 3.6e12 s - 2 ns + 2 x 25 ns = 8,048 ns; and all end as one flow engine's."""
    topo = load_topology("testbed16")
    sim = FluidNvlinkSimulator(FlowSimulator(topo), FlowSimulator(topo), payload_bytes=1000, header_bytes=48)
    fabric = [Flow(i, i % 8 + 8 * (i // 8), (i + 8) % 16, 1 << 20) for i in range(16)]
    deps = tuple(f.id for f in fabric)
    nvlink = [Flow(100, 8, 9, 3_600_000, deps), Flow(101, 10, 11, 3_600_000, deps)]
    sim.submit([*fabric, *nvlink], 0)
    assert sum(len(v) for v in sim._waiters.values()) == 16 + 2  # one join: 16 deps wait on it, it on 2 flows
    assert all(sim.reacts_to(f.id) for f in fabric) and sim.reaction_ns(3) == INF_NS
    sim.submit([Flow(102, 9, 1, 1 << 20, deps=(100,))], 0)
    assert [sim.reaction_ns(f.id) for f in fabric] == [8_048] * 16
    flows = [*fabric, *nvlink, Flow(102, 9, 1, 1 << 20, deps=(100,))]
    one = FlowSimulator(topo)
    one.submit(flows, 0)
    want = sorted((c.flow_id, c.start_ns, c.end_ns) for c in one.drain())
    assert sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain()) == want
    assert sim.in_flight() == 0 and not sim._joins


def test_flows_stuck_behind_a_join_are_counted_without_it() -> None:
    """Gates that never open: the 16 markers and the 3 NVLink flows held on their list (one join) can never start,
    and the error counts those 19 flows, not the join."""
    topo, w = _worker()
    try:
        markers = [Flow(100 + i, gpu(topo, 0, 0), gpu(topo, 0, 0), 0) for i in range(MARKERS)]
        deps = tuple(m.id for m in markers)
        heads = [Flow(200 + h, gpu(topo, h, 0), gpu(topo, h, 1), 1 << 20, deps) for h in range(3)]
        flows = [*markers, *heads]
        w.post(flows, [0] * len(flows), {m.id for m in markers})
        with pytest.raises(PhantoraError, match="^19 flows can never start"):
            w.drain()
    finally:
        w.close()
