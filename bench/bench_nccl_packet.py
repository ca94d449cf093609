"""Packet-mode audit of the NCCL model: each call of `phantora nccl-tests` through ns-3 and the flow network side by
side, on 2 and 4 hosts, with NCCL's choice forced as users force it (NCCL_ALGO, NCCL_PROTO, channels, buffer and
p2p chunk sizes).

    .venv/bin/python bench/bench_nccl_packet.py                 # every case (about 13 min at load 20-28)
    .venv/bin/python bench/bench_nccl_packet.py --topo 2host    # one fabric
    .venv/bin/python bench/bench_nccl_packet.py --granularity chunked   # flows in NCCL's steps

For each call it prints NCCL's choice (the same dict in both engines), the bytes the data flows carry against the
closed form (the algorithm's payload times the protocol's wire factor: LL 2, LL128 128/120, Simple 1), the bytes
ns-3 delivered (its payload counter, before and after the call: the data flows' and the clear-to-sends', `CTS B`,
the 64 B credits a receiver sends its sender across hosts, NCCL's control traffic, not the payload), the call's time
on the flow network, on the flow network at the packets' goodput (links carry payload at 1000/(1000+48) of line
rate, as ns-3's packets do: `flow_goodput`), the same with the ACK stream (a link carrying the call's data both ways
also carries the 48-byte ACK of each packet coming the other way: `phantora.netsim.ack_stream.with_ack_stream`) and
through ns-3, against a closed form, and the ns-3 wall time of the call. ns-3 is checked against the flow network at
goodput with the ACK stream (--tolerance).
The closed-form time (`closed_form_us`) is NCCL's latency with the pipeline fill and a ring's uncounted network hops
(`model_lat_us + fill_us + chain_us`), then the transfer: the largest of NCCL's bandwidth time, the proxies' turns
(a floor on each network connection, overlapping its transfer: `model_time_us - model_lat_us + proxy_us`, proxy_us
being what the turns exceed NCCL's time by), the busiest link's wire bytes over its rate (each flow on its ECMP
route) and, on a Simple ring, tree or NVLS-Tree, the slowest flow at its own rate cap (a channel's limit across
hosts): a call costs max(turns, transfer), not their sum.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.collectives import AlgoOptions
from phantora.collectives.back_pressure import is_credit, is_cts
from phantora.collectives.nccl.net_channel import NET_CHANNEL_ALGOS
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.nccl.shape import WIRE_FACTOR
from phantora.collectives.nccl.tables import NCCL_ALGO_NAMES
from phantora.collectives.spec import GRANULARITIES
from phantora.netsim.ack_stream import with_ack_stream
from phantora.netsim.base import NetworkSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.report import nccl_tests as nt
from phantora.topology.model import Topology

LINE = {"LL": 16, "LL128": 128, "Simple": 1}  # wire bytes a flow may round up by, per flow
KiB, MiB = 1024, 1024**2


@dataclass(frozen=True)
class Case:
    """One call: a test, a size (nccl-tests' size column) and the NCCL_* variables set."""

    test: str
    size: int
    env: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env) or "-"


@dataclass
class Row:
    """What one call gave on each engine, with its closed forms."""

    topo: str
    case: Case
    choice: dict[str, Any]
    flows: int
    wire: int  # the data flows' bytes (credits and clear-to-sends aside)
    closed: int
    slack: int
    delivered: int
    cts: int  # the clear-to-sends' bytes across hosts (back_pressure.is_cts)
    flow_us: float
    goodput_us: float
    acks_us: float  # the flow network at goodput with the ACK stream: ns-3's reference
    ns3_us: float
    model_us: float
    wall_s: float
    notes: list[str] = field(default_factory=list)


def topologies() -> dict[str, Topology]:
    """2 hosts (testbed16: 2 x 8 H100, leaf-spine), 4 hosts of 8 H100 the same way, and 4 hosts of one GPU (PAT)."""
    from phantora.topology import leaf_spine, load_topology

    four = leaf_spine(4, 8, 4, gpus_per_host=8, uplink_rate="800Gbps", gpu="h100", nvlink_latency="25ns",
                      name="leafspine-4x8-h100")  # fmt: skip
    single = leaf_spine(2, 2, 2, gpus_per_host=1, uplink_rate="400Gbps", gpu="h100", name="leafspine-4x1-h100")
    return {"2host": load_topology("testbed16"), "4host": four, "4x1": single}


def cases(name: str) -> list[Case]:
    """The calls run on fabric `name`."""
    if name == "4x1":  # one GPU per node: PAT's ground
        return [
            Case("all_gather_perf", 64 * KiB),
            Case("all_gather_perf", 64 * KiB, (("NCCL_ALGO", "PAT"),)),
            Case("reduce_scatter_perf", 64 * KiB, (("NCCL_ALGO", "PAT"),)),
            Case("all_gather_perf", 16 * MiB, (("NCCL_ALGO", "Ring"),)),
        ]
    out = [Case(f"{t}_perf", s) for t in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast",
                                          "sendrecv") for s in (64 * KiB, 16 * MiB)]  # fmt: skip
    for proto in ("LL", "LL128", "Simple"):
        out.append(Case("all_reduce_perf", 1 * MiB, (("NCCL_PROTO", proto),)))
    for algo in ("Ring", "Tree", "NVLSTree"):
        out.append(Case("all_reduce_perf", 4 * MiB, (("NCCL_ALGO", algo),)))
    out += [
        Case("all_gather_perf", 1 * MiB, (("NCCL_PROTO", "LL"),)),
        Case("all_reduce_perf", 16 * MiB, (("NCCL_MAX_CTAS", "4"),)),  # bounds NVLS's CTAs too (MAX_NCHANNELS does not)
        Case("all_reduce_perf", 64 * KiB, (("NCCL_MIN_NCHANNELS", "32"),)),
        Case("all_reduce_perf", 16 * MiB, (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple"))),
        Case(
            "all_reduce_perf", 16 * MiB, (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple"), ("NCCL_BUFFSIZE", str(MiB)))
        ),
        Case("alltoall_perf", 1 * MiB),
        Case("alltoall_perf", 1 * MiB, (("NCCL_P2P_NET_CHUNKSIZE", str(16 * KiB)),)),
        Case("sendrecv_perf", 128 * KiB),
        Case("sendrecv_perf", 128 * KiB, (("NCCL_P2P_NET_CHUNKSIZE", str(16 * KiB)),)),
    ]
    return out


def payload_closed_form(kind: str, algo: str, n: int, hosts: int, nbytes: int) -> int:
    """The bytes an algorithm moves in total over every connection (before the protocol): NCCL's ring and tree
    all-reduce 2(n-1)S; all-gather, reduce-scatter (ring or PAT), broadcast (chain) and all-to-all (n-1)S (S the
    whole buffer); send/recv (n pairs) nS; NVLS-Tree on h hosts of m: h(m+1)S inside the nodes, 2(h-1)S between."""
    if kind == "all_reduce":
        if algo == "NVLSTree":
            m = n // hosts
            return hosts * m * -(-nbytes * (m + 1) // m) + 2 * (hosts - 1) * nbytes
        if algo == "NVLS":
            return n * -(-nbytes * (n + 1) // n)
        return 2 * (n - 1) * nbytes
    if kind == "send_recv":
        return n * nbytes
    return (n - 1) * nbytes


def wire_bytes(flows: list[Any]) -> tuple[int, int, int]:
    """(the data flows' bytes, their number, the clear-to-sends' bytes): a credit carries no payload (zero bytes
    inside a host, a 64 B clear-to-send across hosts), so the closed form of the payload counts the data flows alone
    and ns-3 delivers both."""
    data = [f for f in flows if not is_credit(f)]
    return sum(f.size for f in data), len(data), sum(f.size for f in flows if is_cts(f))


def _delivered(sim: NetworkSimulator) -> int:
    """ns-3's payload counter: every byte delivered so far."""
    return int(str(sim.stats()["payload_bytes_delivered"]))


def run_case(topo_name: str, topo: Topology, sims: dict[str, NetworkSimulator], ids: dict[str, int], case: Case,
             granularity: str) -> Row:  # fmt: skip
    """One call of `case` on each engine."""
    spec = nt.find_test(case.test)
    ranks = tuple(range(topo.num_ranks))
    _, _, nbytes = nt.counts(spec, case.size, 4, len(ranks))
    opts = AlgoOptions(nccl_env=nccl_env(dict(case.env)), granularity=granularity)
    times: dict[str, float] = {}
    its = {}
    wall = 0.0
    delivered = 0
    for name, sim in sims.items():
        it = nt.build_iteration(spec, ranks, nbytes, "fp32", 0, topo, opts, ids[name], f"audit/{ids[name]}")
        ids[name] = it.next_id
        its[name] = it
        before = _delivered(sim) if name == "ns3" else 0
        t0 = time.perf_counter()
        times[name] = nt.run_iteration(sim, it) / 1e3
        if name == "ns3":
            wall = time.perf_counter() - t0
            delivered = _delivered(sim) - before
    flow_it = its["flow"]
    acked = make_engine(EngineSpec(network="flow", flow_goodput=True),
                        with_ack_stream(topo, flow_it.flows, PacketConfig()))  # fmt: skip
    try:
        acks_us = nt.run_iteration(acked, flow_it) / 1e3
    finally:
        acked.close()
    choice = flow_it.choice or {}
    notes = []
    if any(it.choice != flow_it.choice for it in its.values()):
        notes.append(f"choice differs: ns3 {its['ns3'].choice}")
    proto = str(choice.get("protocol", "Simple"))
    algo = str(choice.get("algorithm", ""))
    hosts = len({topo.nodes[topo.node_of_rank(r)].host for r in ranks})
    payload = payload_closed_form(spec.kind, algo, len(ranks), hosts, nbytes)
    wire, data, cts = wire_bytes(flow_it.flows)
    # a Simple ring, tree or NVLS-Tree: each network flow at most a channel's limit across hosts (net_channel.py)
    capped = algo in {NCCL_ALGO_NAMES[a] for a in NET_CHANNEL_ALGOS} and proto == "Simple"
    rate = rate_bound_us(flow_it.flows) if capped else 0.0
    model = closed_form_us(choice, link_bound_us(topo, flow_it.flows), rate, crosses_nodes(topo, flow_it.flows))
    return Row(topo_name, case, choice, len(flow_it.flows), wire, round(payload * WIRE_FACTOR[proto]),
               data * LINE[proto], delivered, cts, times["flow"], times["goodput"], acks_us, times["ns3"],
               model, wall, notes)  # fmt: skip


def closed_form_us(choice: Mapping[str, Any], link_us: float, rate_us: float = 0.0, crosses: bool = True) -> float:
    """The call's time (us) from NCCL's choice and the network: its latency, the pipeline fill and a ring's uncounted
    network hops (`model_lat_us + fill_us + chain_us`), then the transfer, in which every connection takes at least
    NCCL's bandwidth time and a connection across nodes (`crosses`: the call has one) at least the busiest proxy's
    turns, which overlap its transfer (`model_time_us - model_lat_us + proxy_us`: `proxy_us` is what the turns
    exceed NCCL's time by), and the network's own transfer: the busiest link (`link_us`) or the slowest flow at its
    rate cap (`rate_us`). So max(turns, transfer), not their sum."""
    lat = sum(float(choice.get(k, 0.0)) for k in ("model_lat_us", "fill_us", "chain_us"))
    nccl = float(choice.get("model_time_us", 0.0)) - float(choice.get("model_lat_us", 0.0))
    turns = nccl + float(choice.get("proxy_us", 0.0)) if crosses else 0.0
    return lat + max(nccl, turns, link_us, rate_us)


def crosses_nodes(topo: Topology, flows: list[Any]) -> bool:
    """Whether a flow with bytes crosses the network (its endpoints share no NVSwitch)."""
    return any(f.size and f.src != f.dst and topo.shared_nvswitch(f.src, f.dst) is None for f in flows)


def link_bound_us(topo: Topology, flows: list[Any]) -> float:
    """The busiest link direction's wire bytes over its rate (us), each flow on its own ECMP route: what the call
    takes at the least if every flow ran at once (flows that wait for others only add to it)."""
    load: dict[int, int] = {}
    for f in flows:
        if f.src == f.dst or f.size == 0:
            continue
        for ch in topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic):
            load[ch] = load.get(ch, 0) + f.size
    return max((b * 8e6 / topo.links[ch >> 1].bandwidth_bps for ch, b in load.items()), default=0.0)


def rate_bound_us(flows: list[Any]) -> float:
    """The slowest flow alone at its own rate cap (us): a Simple ring, tree or NVLS-Tree flow capped below its links
    by a channel's limit across hosts (net_channel.py) takes at least its bytes over that cap."""
    return max((f.size * 8e6 / f.rate_bps for f in flows if f.size and getattr(f, "rate_bps", None)), default=0.0)


def check(row: Row, tolerance: float) -> list[str]:
    """What is wrong with a row: the data flows' bytes off the closed form of the payload, ns-3's bytes off the
    flows' (data and clear-to-sends), engines apart."""
    bad = list(row.notes)
    if not row.closed <= row.wire <= row.closed + row.slack:
        bad.append(f"wire {row.wire} not in [{row.closed}, {row.closed + row.slack}]")
    if row.delivered != row.wire + row.cts:
        bad.append(f"ns-3 delivered {row.delivered} != flows' {row.wire} + CTS {row.cts}")
    if row.acks_us > 0 and abs(row.ns3_us / row.acks_us - 1) > tolerance:
        bad.append(f"ns-3 {row.ns3_us:.2f} us vs flow at goodput with ACKs {row.acks_us:.2f} us")
    return bad


def print_row(row: Row, tolerance: float) -> None:
    """One markdown table line."""
    c = row.choice
    choice = f"{c.get('algorithm')}/{c.get('protocol')}/{c.get('channels')}"
    diff = (row.ns3_us / row.goodput_us - 1) * 100 if row.goodput_us else 0.0
    diff_acks = (row.ns3_us / row.acks_us - 1) * 100 if row.acks_us else 0.0
    vs_model = (row.flow_us / row.model_us - 1) * 100 if row.model_us else 0.0
    bad = check(row, tolerance)
    print(
        f"| {row.topo} | {row.case.test.removesuffix('_perf')} | {row.case.size} | {row.case.label} | {choice} | "
        f"{row.flows} | {row.wire} | {row.closed} | {row.delivered} | {row.flow_us:.2f} | {row.goodput_us:.2f} | "
        f"{row.acks_us:.2f} | {row.ns3_us:.2f} | "
        f"{diff:+.2f}% | {diff_acks:+.2f}% | {row.model_us:.2f} | {vs_model:+.1f}% | {row.wall_s:.1f} | {row.cts} | "
        f"{'; '.join(bad) or 'ok'} |",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topo", nargs="*", default=["2host", "4host", "4x1"], choices=["2host", "4host", "4x1"])
    p.add_argument("--granularity", choices=GRANULARITIES, default="coarse")
    p.add_argument("--tolerance", type=float, default=0.02, help="ns-3 against goodput with ACKs (default 2%%)")
    p.add_argument("--only", nargs="+", default=None, help="run the cases whose test contains one of these strings")
    args = p.parse_args()
    print("| fabric | test | size | NCCL_* | algo/proto/ch | flows | wire B | closed form B | ns-3 B | flow us | "
          "goodput us | +ACKs us | ns-3 us | ns-3/goodput | ns-3/+ACKs | closed form us | flow/closed | ns-3 wall s | "
          "CTS B | check |")  # fmt: skip
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    start = time.perf_counter()
    topos = topologies()
    failed = 0
    for name in args.topo:
        topo = topos[name]
        sims = {
            "flow": make_engine(EngineSpec(network="flow"), topo),
            "goodput": make_engine(EngineSpec(network="flow", flow_goodput=True), topo),
            "ns3": make_engine(EngineSpec(network="ns3"), topo),
        }
        ids = dict.fromkeys(sims, 0)
        try:
            for case in cases(name):
                if args.only and not any(word in case.test for word in args.only):
                    continue
                row = run_case(name, topo, sims, ids, case, args.granularity)
                print_row(row, args.tolerance)
                failed += bool(check(row, args.tolerance))
        finally:
            for sim in sims.values():
                sim.close()
    print(f"\n{failed} rows failed; {time.perf_counter() - start:.0f} s wall")


if __name__ == "__main__":
    main()
