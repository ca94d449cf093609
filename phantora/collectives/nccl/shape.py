"""What NCCL's choice does to a collective's flows: the protocol's bytes on the wire, the model's latency as a
delay, and the kernel's throughput as a per-flow rate cap.

- Wire bytes: LL sends 16-byte lines of 8 data bytes and 8 flag bytes (x2); LL128 sends 128-byte lines of 120 data
  bytes (x16/15); Simple sends the data.
- Latency: NCCL's latency for the choice, plus the pipeline fill its model leaves out (`pipeline.py`) and a ring's
  network hops its count leaves out (`ring_chain.py`), less the propagation the network already charges on the
  path (on each of PAT's rounds, which run one after another), delays the collective's first flows (those with no
  dependencies).
- Throughput: every connection (sender, receiver, channel) carries its wire bytes at most at the rate that ends
  them in NCCL's bandwidth time, `nbytes / algbw` (a ring's or tree's channels of NCCL 2.22+'s unequal parts all
  at the busiest channel's rate: `busiest_channel_scale`), and so does every queue of messages sent one at a time (a
  connection's steps in order; a one-node Simple tree's channel kernel, both halves); a round-by-round algorithm
  (PAT) spreads a sender's whole share over that time. Inside a node of send/recv, each peer connection is capped
  at its share of the GPU's NVLink. Across nodes a ring's or tree's connection takes at least the busiest proxy's
  turns (`Choice.proxy_floor_us`, proxy.py): the proxy overlaps the transfer and bounds its rate. The network can
  only make a flow slower than its cap.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping

from phantora.collectives.back_pressure import is_cts
from phantora.collectives.nccl.idle_chain import critical_chains_ns, nic_charge_ns, relay_leads_ns
from phantora.collectives.nccl.tuning import Choice
from phantora.collectives.relay_steps import relay_fill
from phantora.netsim.base import Flow, flow_of
from phantora.topology.model import Topology

WIRE_FACTOR = {"LL": 2.0, "LL128": 128.0 / 120.0, "Simple": 1.0}
SEQUENTIAL = ("pat",)  # rounds one after another: a sender's rate covers all of its rounds
UNCAPPED = ("ce",)  # the copy engines: NCCL gives no rate of theirs, so the links bound their copies
LATENCY_SAMPLE = 64  # flows whose paths bound the propagation subtracted from the latency


def wire_bytes(payload: int, protocol: str) -> int:
    """Bytes `payload` takes on the wire under `protocol` (whole lines)."""
    if protocol == "LL":
        return math.ceil(payload / 8) * 16
    if protocol == "LL128":
        return math.ceil(payload / 120) * 128
    return payload


def propagation_ns(flows: list[Flow], topo: Topology, nic_ns: int = 0, nic_on_nvlink: bool = True) -> int:
    """The longest path propagation among (a sample of) the flows' paths, with the engine's NIC latency `nic_ns`
    on those that pay it (`nic_charge_ns`)."""
    worst = 0
    seen: set[tuple[int, int]] = set()
    for f in flows[:LATENCY_SAMPLE]:
        if f.src == f.dst or (f.src, f.dst) in seen:
            continue
        seen.add((f.src, f.dst))
        route = topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
        worst = max(worst, topo.path_latency_ns(route) + nic_charge_ns(f, topo, nic_ns, nic_on_nvlink))
    return worst


def _rounds(flows: list[Flow], choice: Choice) -> int:
    """The network crossings on the collective's critical path that NCCL's latency already counts: one, or a
    round-by-round algorithm's rounds (PAT: each round waits for the last, each sender sends once a round)."""
    if choice.algorithm not in SEQUENTIAL:
        return 1
    sends: dict[int, int] = defaultdict(int)
    for f in flows:
        sends[f.src] += 1
    return max(sends.values(), default=1)


def _delay_ns(
    flows: list[Flow],
    choice: Choice,
    nbytes: int,
    topo: Topology,
    chunked: bool,
    wire: list[int],
    caps: list[int],
    nic: tuple[int, bool] = (0, True),
    tails: Mapping[int, Flow] | None = None,
) -> int:
    """The delay of the collective's first flows: NCCL's latency (with a ring's uncounted network hops, `chain_us`)
    and the fill, less what the network charges. The proxies' turns are no delay: they overlap the transfer and
    bound its rate (`shape`'s caps on the network connections, `Choice.proxy_floor_us`).

    Coarse: the fill is a delay, and the path's propagation (once, or once per round of PAT) is netted out.
    Chunked (flows in NCCL's steps and chunks): the dependencies charge a fill of their own (their longest
    chain's transfer time beyond one connection's, `nbytes / algbw`) and cross the hops one after another. The
    model's fill, what coarse adds to NCCL's latency without its tree correction (the correction, a fit of
    measured trees, and the choice's fill), is charged once: the delay is NCCL's latency without the
    correction, plus what the model's fill exceeds the chunks' by, less the propagation on the longest chain
    (on an idle network). `nic`: the engine's NIC latency and whether NVLink flows pay it (`AlgoOptions.nic_latency_ns`)
    is netted out with the propagation, once per flow on the path or chain that pays it: NCCL's latency, measured
    on real NICs, holds their work-request latency. What the delay cannot absorb (it stays >= 0) the network adds."""
    if not chunked:
        prop = propagation_ns(flows, topo, *nic) * _rounds(flows, choice)
        return max(0, round((choice.lat_us + choice.chain_us + choice.fill_us) * 1000) - prop)
    idle, xfer = critical_chains_ns(flows, topo, wire, caps, *nic, tails=tails)
    t_bw_ns = nbytes / choice.algbw if choice.algbw > 0 else 0.0
    own_ns = max(0.0, xfer - max(t_bw_ns, proxy_floor_ns(choice)))
    model_ns = (choice.fit_us + choice.fill_us) * 1000
    base_ns = (choice.lat_us + choice.chain_us - choice.fit_us) * 1000
    return max(0, round(base_ns + max(0.0, model_ns - own_ns) - (idle - xfer)))


def shape(
    flows: list[Flow],
    choice: Choice,
    nbytes: int,
    topo: Topology,
    chunked: bool = False,
    pipelined: bool = False,
    whole: Mapping[int, int] | None = None,
    channel_queues: bool = False,
    nic: tuple[int, bool] = (0, True),
) -> list[Flow]:
    """`flows` (one collective's, as decomposed for `choice.algorithm`) as NCCL's choice puts them on the wire.
    `chunked`: the flows are NCCL's steps and chunks (every algorithm), see `_delay_ns`; `pipelined`: a chunked
    tree or chain, whose edges send their chunks one after another (see `_nvlink_uncapped`). `whole`: each queue
    pair's `Flow.conn` -> its connection's, when a connection's messages take its queue pairs in turn
    (NCCL_IB_QPS_PER_CONNECTION > 1 without NCCL_IB_SPLIT_DATA_ON_QPS): a message then has the whole connection's
    rate; None: each queue pair carries its own part of every message, side by side (`DagBuilder.whole`).
    `channel_queues`: each sender queue (`Flow.queue`) is its GPU's whole kernel on a channel (a one-node Simple
    tree, `DagBuilder.sender_queue`), so it moves at the channel's rate whatever it carries (`channel_totals`).
    `nic`: the engine's NIC latency (ns) and whether flows inside an NVSwitch pay it, netted out (`_delay_ns`)."""
    if not flows:
        return flows
    cts = [is_cts(f) for f in flows]
    if any(cts):  # a clear-to-send is an RDMA write of its own bytes, no step's: no protocol lines, no cap
        data = [f for f, c in zip(flows, cts, strict=True) if not c]
        steps, limits = _wire_and_caps(data, choice, nbytes, topo, chunked, pipelined, whole, channel_queues)
        got = iter(zip(steps, limits, strict=True))
        both = [(f.size, 0) if c else next(got) for f, c in zip(flows, cts, strict=True)]
        wire, caps = [w for w, _ in both], [cap for _, cap in both]
    else:
        wire, caps = _wire_and_caps(flows, choice, nbytes, topo, chunked, pipelined, whole, channel_queues)
    tails = relay_fill(flows) if chunked else {}  # a PXN relay's fill (its first NVLink steps), within the delay
    delay = _delay_ns(flows, choice, nbytes, topo, chunked, wire, caps, nic, tails)
    lead = relay_leads_ns(flows, topo, wire, caps, *nic, tails=tails) if chunked else {}
    return [
        flow_of(
            f.id,
            f.src,
            f.dst,
            w,
            f.deps,
            f.delay_ns + (0 if f.deps else max(0, delay - lead.get(f.id, 0)) if lead else delay),
            f.tag,
            f.priority,
            f.key,
            f.loss_budget,
            cap,
            f.conn,
            f.queue,
            f.via_nic,
        )  # fmt: skip
        for f, w, cap in zip(flows, wire, caps, strict=True)
    ]


def _wire_and_caps(
    flows: list[Flow],
    choice: Choice,
    nbytes: int,
    topo: Topology,
    chunked: bool,
    pipelined: bool,
    whole: Mapping[int, int] | None,
    channel_queues: bool,
) -> tuple[list[int], list[int]]:
    """The steps' wire bytes under the protocol and their rate caps (see `shape`)."""
    proto = choice.protocol
    wire = [wire_bytes(f.size, proto) for f in flows]
    if choice.algorithm == "p2p":
        pair: dict[tuple[int, int], int] = defaultdict(int)  # a peer's transfer, over all of its channels
        for f in flows:
            pair[f.src, f.dst] += f.size
        share = connection_wire(flows, wire, whole) if chunked else wire  # what each flow's connection carries
        rates = {(a, b): r for a, b, r in choice.pair_bw}
        caps = [
            _peer_cap(
                f, w, pair[f.src, f.dst], rates.get((f.src, f.dst), choice.peer_bw), topo, (f.src, f.dst) in rates
            )
            for f, w in zip(flows, share, strict=True)
        ]
        caps = _net_caps(flows, wire, caps, choice, topo, share)
    else:
        t_bw_ns = nbytes / choice.algbw if choice.algbw > 0 else 0.0
        conn = (lambda f: f.key) if whole is None else (lambda f: whole.get(f.conn, f.key))
        key = (lambda f: f.src) if choice.algorithm in SEQUENTIAL else (lambda f: f.queue or (f.src, f.dst, conn(f)))
        total: dict[object, int] = defaultdict(int)
        for f, w in zip(flows, wire, strict=True):
            total[key(f)] += w
        if channel_queues:
            total = channel_totals(flows, total, key)
        scale = busiest_channel_scale(flows, wire) if choice.algorithm in SPLIT_ALGORITHMS else None
        span = _proxy_spans(flows, t_bw_ns, choice, topo)
        caps = [
            math.ceil(total[key(f)] * (scale[i] if scale else 1.0) * 8e9 / t) if t > 0 else 0
            for i, (f, t) in enumerate(zip(flows, span, strict=True))
        ]
        if chunked and pipelined:
            caps = _nvlink_uncapped(flows, caps, topo)
        caps = _channel_caps(flows, wire, caps, choice, topo, chunked, whole is not None)
    if choice.algorithm in UNCAPPED:
        caps = [0] * len(flows)
    return wire, caps


def _proxy_spans(flows: list[Flow], t_bw_ns: float, choice: Choice, topo: Topology) -> list[float]:
    """The time (ns) each flow's queue or connection spreads its bytes over: NCCL's bandwidth time, and across
    nodes at least the busiest proxy's turns (`Choice.proxy_floor_us`). The proxy thread serves the network
    connections' steps while the kernel and the wire move earlier ones (up to NCCL_STEPS in flight), so the
    call costs max(turns, transfer): as a rate bound on those connections, the network's own transfer (which
    may be slower than NCCL's model, or shared with other traffic) is compared with the turns, not the model's."""
    floor = proxy_floor_ns(choice)
    if floor <= t_bw_ns:
        return [t_bw_ns] * len(flows)
    return [t_bw_ns if f.size == 0 or _inside_node(f, topo) else floor for f in flows]


def proxy_floor_ns(choice: Choice) -> int:
    """`Choice.proxy_floor_us` in whole ns, rounded as the delay is (`_delay_ns`): the delay plus the floor is the
    rounded sum of the latency and the turns, so sizes with the same turns end at the same ns."""
    if choice.proxy_floor_us <= 0:
        return 0
    lat = choice.lat_us + choice.chain_us + choice.fill_us
    return round((lat + choice.proxy_floor_us) * 1000) - round(lat * 1000)


SPLIT_ALGORITHMS = ("ring", "tree")  # NCCL's algorithms whose channels carry channel_shares' parts


def _channel(f: Flow) -> int | None:
    """The channel of a flow's key (None: a flow without one)."""
    return None if f.key is None else f.key >> CHANNEL_SHIFT & 0xFF


def channel_totals(flows: list[Flow], total: Mapping[object, int], key: Callable[[Flow], object]) -> dict[object, int]:
    """`total` (wire bytes per rate key) with every sender queue's raised to its channel's busiest queue's: the
    queue is the GPU's kernel on the channel, whose rate is the channel's whether it sends both of a tree's halves
    or one. runTreeSplit (all_reduce.h, v2.30.7-1) runs a channel's root with all its threads and a middle GPU's two
    halves side by side, so the root (the broadcast half only) and the leaf (the reduce half only) send at the rate
    a middle GPU's queue has for both: at a queue's own bytes over NCCL's time they would take two chunk times a
    chunk and stretch the pipeline's fill by two of its first (whole) chunk."""
    top: dict[int | None, int] = defaultdict(int)
    for f in flows:
        if f.queue:
            top[_channel(f)] = max(top[_channel(f)], total[key(f)])
    out = dict(total)
    for f in flows:
        if f.queue:
            out[key(f)] = top[_channel(f)]
    return out


def busiest_channel_scale(flows: list[Flow], wire: list[int]) -> list[float]:
    """Per flow, the busiest channel's wire bytes over its own channel's (1 where the channels are even). NCCL 2.22+
    deals the channels unequal parts (`channel_shares.py`) and each channel is one CTA of the same kernel, so every
    channel moves at the busiest one's rate: the busiest ends in NCCL's time, the others sooner (a channel capped
    at its own bytes over that time would crawl through its pipeline's fill)."""
    per: dict[int, int] = defaultdict(int)
    channel = [_channel(f) for f in flows]
    for c, w in zip(channel, wire, strict=True):
        if c is not None:
            per[c] += w
    top = max(per.values(), default=0)
    return [top / per[c] if c is not None and per[c] > 0 else 1.0 for c in channel]


def connection_wire(flows: list[Flow], wire: list[int], whole: Mapping[int, int] | None = None) -> list[int]:
    """Each flow's connection's wire bytes over all its messages (chunked p2p: a transfer's part is its channel's
    steps, one after another on the connection, `Flow.conn`; a queue pair of a connection is a connection of its
    own, side by side with the others, unless `whole` maps it to its connection: see `shape`); a flow without a
    connection: its own bytes."""
    conns = [whole.get(f.conn, f.conn) if whole is not None else f.conn for f in flows]
    total: dict[int, int] = defaultdict(int)
    for c, w in zip(conns, wire, strict=True):
        total[c] += w
    return [total[c] if c else w for c, w in zip(conns, wire, strict=True)]


def _net_caps(
    flows: list[Flow],
    wire: list[int],
    caps: list[int],
    choice: Choice,
    topo: Topology,
    share: list[int] | None = None,
) -> list[int]:
    """Across nodes: the flows that cross the network into a GPU share its channels' rate from its remote peers,
    `choice.net_bw`, in proportion to their wire bytes (its channels run all its remote peers at once); `share`:
    each flow's part of the rate in bytes (its connection's, when the flows are its steps in turn). A crossing flow
    keeps a lower cap of its own (a NET pair's share of its GPUs' x16 links with P2P off: nccl/node_p2p.py)."""
    if choice.net_bw <= 0:
        return caps
    share = share or wire
    net = [f.size > 0 and not _inside_node(f, topo) for f in flows]
    into: dict[int, int] = defaultdict(int)
    for f, w, crosses in zip(flows, wire, net, strict=True):
        if crosses:
            into[f.dst] += w
    out = []
    for f, w, cap, crosses in zip(flows, share, caps, net, strict=True):
        got = math.ceil(choice.net_bw * 8e9 * w / into[f.dst]) if crosses else cap
        out.append(min(got, cap) if crosses and cap else got)  # a NET pair's PCIe share too (nccl/node_p2p.py)
    return out


CHANNEL_BITS = (1 << 56) - 1  # a flow key's nodes and channel, less its queue pair (dag.DagBuilder._message)
CHANNEL_SHIFT = 48  # a flow key's channel bits (dag.ecmp_key)


def _channel_caps(
    flows: list[Flow], wire: list[int], caps: list[int], choice: Choice, topo: Topology, chunked: bool, in_turn: bool
) -> list[int]:
    """Across nodes: each channel moves at most `choice.chan_net_bw` (net_channel.py) out of its GPU and as much
    in. Coarse flows of a GPU run at once (its channels' hops, a tree's parent and children, a connection's queue
    pairs): they share its channels' total by wire bytes, each way. Chunked flows of a connection run one after
    another: each takes one channel's, shared by the connection's queue pairs (NCCL_IB_QPS_PER_CONNECTION) when
    each carries a part of every message, whole when they take the messages in turn (`in_turn`). A flow keeps its
    own cap where that is lower."""
    if choice.chan_net_bw <= 0:
        return caps
    keys = [None if f.size == 0 or _inside_node(f, topo) else f.id if f.key is None else f.key for f in flows]
    qps: dict[tuple[int, int, int], set[int]] = defaultdict(set)
    out_ch: dict[int, set[int]] = defaultdict(set)
    in_ch: dict[int, set[int]] = defaultdict(set)
    out_bytes: dict[int, int] = defaultdict(int)
    in_bytes: dict[int, int] = defaultdict(int)
    for f, w, key in zip(flows, wire, keys, strict=True):
        if key is not None:
            qps[f.src, f.dst, key & CHANNEL_BITS].add(key >> 56)
            out_ch[f.src].add(key >> CHANNEL_SHIFT & 0xFF)
            in_ch[f.dst].add(key >> CHANNEL_SHIFT & 0xFF)
            out_bytes[f.src] += w
            in_bytes[f.dst] += w
    rate = choice.chan_net_bw * 8e9
    out = []
    for f, w, cap, key in zip(flows, wire, caps, keys, strict=True):
        if key is None:
            out.append(cap)
            continue
        if chunked:
            limit = math.ceil(rate if in_turn else rate / len(qps[f.src, f.dst, key & CHANNEL_BITS]))
        else:
            share = min(len(out_ch[f.src]) / out_bytes[f.src], len(in_ch[f.dst]) / in_bytes[f.dst])
            limit = math.ceil(rate * w * share)
        out.append(min(cap, limit) if cap else limit)
    return out


def _nvlink_uncapped(flows: list[Flow], caps: list[int], topo: Topology) -> list[int]:
    """A chunked tree's or chain's hops inside a node, when it spans nodes: no cap. NCCL's rate is the network's
    share per channel, which sets the pace of a pipeline whose every chunk must cross the network; a chunk's hop
    over NVLink moves at its share of the NVLink (the links bound it), so the pipeline fills at the network hops'
    pace, not at one network hop's time per stage. (Each edge sends its chunks one after another, so no edge
    outruns the pipeline; inside one node NCCL's rate is the NVLink's, and every cap stays.)"""
    inside = [_inside_node(f, topo) for f in flows]
    if all(inside):
        return caps
    return [0 if local else cap for cap, local in zip(caps, inside, strict=True)]


def _inside_node(f: Flow, topo: Topology) -> bool:
    """Whether `f` stays on its GPU or crosses an NVSwitch its endpoints share (never the network)."""
    return f.src == f.dst or topo.nvswitch_of(f.src, f.dst, via_nic=f.via_nic) is not None


def _peer_cap(f: Flow, wire: int, pair_bytes: int, peer_bw: float, topo: Topology, pcie: bool = False) -> int:
    """One channel of a p2p transfer inside a node: its part of the peer's `peer_bw` GB/s (its share of the GPU's
    NVLink, or of a PCIe host's links: `Choice.pair_bw`, `pcie`, whether or not an NVSwitch joins the pair; the
    channels of one transfer share it in proportion to their bytes), in wire bits/s; across nodes: no cap."""
    if peer_bw <= 0 or f.size == 0 or not (pcie or topo.nvswitch_of(f.src, f.dst, via_nic=f.via_nic) is not None):
        return 0
    return math.ceil(peer_bw * 8e9 * wire / pair_bytes)
