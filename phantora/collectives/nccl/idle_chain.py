"""The longest chain of dependent flows of one collective on an idle network: how long its flows' dependencies and
queues alone make it take, without any other flow's sharing of a link (the chunked flows' own pipeline fill).

A flow starts once its dependencies have ended; a flow of a queue (`Flow.queue`: a connection's steps, a kernel's
sends) also waits for the end of the transmission of the queue's flow before it. A queue sends in release order,
as the flow engine and ns-3 do: the flows are taken in the order they become ready (ties in decomposition order),
not in the order they were decomposed.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping

from phantora.collectives.back_pressure import is_credit, is_cts
from phantora.collectives.relay_steps import relay_fill
from phantora.netsim.base import Flow
from phantora.topology.model import Topology


def critical_chains_ns(
    flows: list[Flow],
    topo: Topology,
    wire: list[int],
    caps: list[int],
    nic_ns: int = 0,
    nic_on_nvlink: bool = True,
    tails: Mapping[int, Flow] | None = None,
) -> tuple[float, float]:
    """The longest chains of dependent flows on an idle network: the longest of their propagation plus transfer
    time at their caps (a flow without one: at its path's slowest link), and the longest of their transfer time
    alone (ns). A credit (`back_pressure.is_credit`: inside a host a zero-byte flow at a sender released its latency
    after a receiver consumed a step, across hosts a clear-to-send from the receiver) counts its whole time as
    propagation: NCCL's latency is measured with its credits going round, so it is netted out like the steps'
    propagation, the clear-to-send's own bytes with it. A PXN relay's fill (the first NVLink step of each relayed
    part and its tail, `relay_steps.relay_fill`) takes no time here: it runs within NCCL's latency
    (`relay_leads_ns`). A clear-to-send holds its queue (its queue pair's) for its bytes; those of the receives
    posted at the start (no dependencies) share their endpoint's link with the other queue pairs' posted at once
    there, as max-min shares it (`_posted_shares`), each released its proxy's turns into the call (`_posted_at`:
    those turns are the receiving proxy's, within NCCL's measured latency, so netted too). Queues take their flows in
    release order on the first reckoning (the second keeps that order). `nic_ns`: the engine's NIC latency, which a
    flow that pays it (`nic_charge_ns`) waits from its release before it can take its queue (a queue's earlier flow may
    still hold it then); NCCL's latency holds the NIC's, so it counts as propagation. `tails`: `relay_fill(flows)`, if
    the caller has it."""
    paths: dict[tuple[int, int, int, bool], tuple[int, int]] = {}  # (propagation ns, slowest link bps)
    hop: list[float] = []
    own: list[float] = []
    busy: list[float] = []  # how long a flow holds its queue
    nic = [nic_charge_ns(f, topo, nic_ns, nic_on_nvlink) for f in flows]
    shares = _posted_shares(flows)
    fill = dict(relay_fill(flows) if tails is None else tails)
    fill.update({t.id: t for t in fill.values()})  # and their tails
    for f, size, cap in zip(flows, wire, caps, strict=True):
        key = (f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
        path = paths.get(key)
        if path is None:
            route = topo.route(*key) if f.src != f.dst else []
            slowest = min((topo.links[c >> 1].bandwidth_bps for c in route), default=0)
            path = paths[key] = (topo.path_latency_ns(route) if route else 0, slowest)
        rate = cap or path[1]
        took = size * 8e9 / rate if rate else 0.0
        if f.id in fill:  # a relayed part's first NVLink step and its tail: within NCCL's latency (`relay_leads_ns`)
            hop.append(0.0)
            own.append(0.0)
            busy.append(took)
            continue
        if is_credit(f):  # its latency (a flag's delay, or a clear-to-send's path and bytes) is the credit's
            took *= shares.get(f.src, 1) if not f.deps else 1
            hop.append(f.delay_ns if f.src == f.dst else path[0] + took)
            own.append(0.0)
            busy.append(took)
            continue
        hop.append(path[0])
        own.append(took)
        busy.append(took)
    index = {f.id: i for i, f in enumerate(flows)}
    deps = [[index[d] for d in f.deps if d in index] for f in flows]
    after: list[list[int]] = [[] for _ in flows]
    missing = [len(d) for d in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            after[d].append(i)
    both, xfer = [0.0] * len(flows), [0.0] * len(flows)
    sent: dict[int, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))  # queue -> its last transmission's end
    ready = [(_posted_at(flows[i]), i) for i, n in enumerate(missing) if n == 0]
    heapq.heapify(ready)
    pop, push, xfer_of, both_of = heapq.heappop, heapq.heappush, xfer.__getitem__, both.__getitem__
    while ready:
        release, i = pop(ready)
        start_both, start_xfer = release + nic[i], max(map(xfer_of, deps[i]), default=0.0)
        queue = flows[i].queue
        if queue:
            prev = sent[queue]
            start_both, start_xfer = max(start_both, prev[0]), max(start_xfer, prev[1])
            sent[queue] = (start_both + busy[i], start_xfer + own[i])
        both[i] = start_both + hop[i] + own[i]
        xfer[i] = start_xfer + own[i]
        for j in after[i]:
            missing[j] -= 1
            if missing[j] == 0:
                push(ready, (max(map(both_of, deps[j])), j))
    return max(both, default=0.0), max(xfer, default=0.0)


def relay_leads_ns(
    flows: list[Flow],
    topo: Topology,
    wire: list[int],
    caps: list[int],
    nic_ns: int = 0,
    nic_on_nvlink: bool = True,
    tails: Mapping[int, Flow] | None = None,
) -> dict[int, int]:
    """The first NVLink step of each PXN-relayed part (`relay_steps.relay_fill`) -> the ns it takes on an idle
    network until the relay's proxy sees it: its NIC latency (`nic_charge_ns`), its path's propagation, its wire
    bytes at its cap (or its path's slowest link) and the tail's store. The sender's kernel writes that step into
    the relay's buffer while NCCL's measured latency runs (the proxies posting their ops, the receivers'
    clear-to-sends), so it starts that much before the call's first delay ends (`shape`) and the relay's network
    leg starts with the call's other network steps, as NCCL's latency says. `tails`: `relay_fill(flows)`, if the
    caller has it."""
    tails = relay_fill(flows) if tails is None else tails
    out: dict[int, int] = {}
    for f, size, cap in zip(flows, wire, caps, strict=True) if tails else ():
        if f.id in tails:
            route = topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
            rate = cap or topo.path_bottleneck_bps(route)
            took = round(topo.path_latency_ns(route) + size * 8e9 / rate) + tails[f.id].delay_ns
            out[f.id] = took + nic_charge_ns(f, topo, nic_ns, nic_on_nvlink)
    return out


def nic_charge_ns(f: Flow, topo: Topology, nic_ns: int, on_nvlink: bool) -> int:
    """The NIC latency the engine charges `f`: `nic_ns` for a flow of bytes between two endpoints, inside one
    NVSwitch only when the packet engine carries NVLink too (`on_nvlink`); else 0."""
    if not nic_ns or f.size <= 0 or f.src == f.dst:
        return 0
    return nic_ns if on_nvlink or topo.nvswitch_of(f.src, f.dst, via_nic=f.via_nic) is None else 0


def _posted_shares(flows: list[Flow]) -> dict[int, int]:
    """Endpoint -> the queues whose clear-to-sends it sends at the start (`is_cts` without dependencies: a
    connection's first window, `back_pressure.Credits.posted`). Each such queue sends its CTS k in the proxies'
    turn k, so that many share the endpoint's link at once: with equal queues, max-min ends each at that many x
    its own time after its release."""
    queues: dict[int, set[int]] = defaultdict(set)
    for f in flows:
        if not f.deps and is_cts(f):
            queues[f.src].add(f.queue or -f.id)
    return {src: len(q) for src, q in queues.items()}


def _posted_at(f: Flow) -> float:
    """When a flow without dependencies is released, from the call's first delay: a clear-to-send of a receive
    posted at the start, its proxy's turns later (`back_pressure.posted_ns`, its `delay_ns`); any other at 0."""
    return float(f.delay_ns) if is_cts(f) and not f.deps else 0.0
