"""A readable description of a topology for `phantora topo`: counts, rates, oversubscription,
bisection bandwidth and example routes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import networkx as nx

from phantora.topology._util import format_rate
from phantora.topology.model import ENDPOINT_KINDS, Topology

TIER_NAMES = {0: "none", 1: "leaf", 2: "spine", 3: "core"}


def leaf_oversubscription(topo: Topology) -> list[float]:
    """Downlink:uplink capacity of every tier-1 switch that has uplinks (endpoint links : higher-tier links)."""
    down: Counter[int] = Counter()
    up: Counter[int] = Counter()
    for link in topo.links:
        for me, other in ((link.a, link.b), (link.b, link.a)):
            node, peer = topo.nodes[me], topo.nodes[other]
            if node.kind != "switch" or node.tier != 1:
                continue
            if peer.kind in ENDPOINT_KINDS:
                down[me] += link.bandwidth_bps
            elif peer.kind == "switch" and peer.tier > node.tier:
                up[me] += link.bandwidth_bps
    return [down[s] / up[s] for s in sorted(up) if down[s]]


def rank_bisection_bps(topo: Topology) -> int:
    """Max flow (bits/s) from the first half of the ranks to the second half.

    Endpoints do not forward: a first-half endpoint only sends, a second-half one only receives.
    """
    eps = topo.endpoints
    half = len(eps) // 2
    if half == 0:
        return 0
    side = {e: 0 for e in eps[:half]} | {e: 1 for e in eps[half : 2 * half]}
    graph = nx.DiGraph()
    for link in topo.links:
        for u, v in ((link.a, link.b), (link.b, link.a)):
            if topo.nodes[u].kind in ENDPOINT_KINDS and side.get(u) != 0:
                continue  # only source-side endpoints send
            if topo.nodes[v].kind in ENDPOINT_KINDS and side.get(v) != 1:
                continue  # only sink-side endpoints receive
            cap = graph[u][v]["capacity"] + link.bandwidth_bps if graph.has_edge(u, v) else link.bandwidth_bps
            graph.add_edge(u, v, capacity=cap)
    for e, s in side.items():
        if s == 0:
            graph.add_edge("src", e)  # no capacity attribute: unbounded
        else:
            graph.add_edge(e, "dst")
    if "src" not in graph or "dst" not in graph:
        return 0
    return int(nx.maximum_flow_value(graph, "src", "dst"))


def nic_bps(topo: Topology, endpoint: int) -> int:
    """Bandwidth of an endpoint's links to switches (its NICs)."""
    return sum(
        topo.links[ch >> 1].bandwidth_bps for v, ch in topo.neighbours(endpoint) if topo.nodes[v].kind == "switch"
    )


def route_info(topo: Topology, src_rank: int, dst_rank: int, flow_key: int = 0) -> dict[str, Any]:
    """The path a flow takes between two ranks, with its hops, latency and bottleneck."""
    src, dst = topo.node_of_rank(src_rank), topo.node_of_rank(dst_rank)
    path = topo.route(src, dst, flow_key)
    names = [topo.nodes[src].name] + [topo.nodes[topo.channel_ends(ch)[1]].name for ch in path]
    return {
        "from_rank": src_rank,
        "to_rank": dst_rank,
        "flow_key": flow_key,
        "path": names,
        "channels": path,
        "hops": len(path),
        "latency_ns": topo.path_latency_ns(path) if path else 0,
        "bottleneck_bps": topo.path_bottleneck_bps(path) if path else 0,
    }


def describe(topo: Topology, bisection: bool = True) -> dict[str, Any]:
    """Everything `phantora topo` prints, as a JSON-ready dict."""
    kinds = Counter(n.kind for n in topo.nodes)
    tiers = Counter(n.tier for n in topo.nodes if n.kind == "switch")
    classes: Counter[tuple[str, int, int]] = Counter()
    for link in topo.links:
        ends = "-".join(sorted((topo.nodes[link.a].kind, topo.nodes[link.b].kind)))
        classes[(ends, link.bandwidth_bps, link.latency_ns)] += 1
    eps = topo.endpoints
    host_sizes = Counter(topo.nodes[e].host if topo.nodes[e].host is not None else ("solo", e) for e in eps)
    info: dict[str, Any] = {
        "name": topo.name,
        "source": topo.meta.get("source"),
        "format": topo.meta.get("format", "generator"),
        "description": topo.meta.get("description"),
        "gpu_model": topo.gpu_model,
        "nodes": len(topo.nodes),
        "nodes_by_kind": dict(sorted(kinds.items())),
        "switches_by_tier": {f"{TIER_NAMES.get(t, f'tier{t}')}": c for t, c in sorted(tiers.items())},
        "links": len(topo.links),
        "link_classes": [
            {"ends": e, "rate_bps": bps, "latency_ns": ns, "count": c} for (e, bps, ns), c in sorted(classes.items())
        ],
        "ranks": len(eps),
        "hosts": len(host_sizes),
        "gpus_per_host": sorted(set(host_sizes.values())),
        "switch_tiers": max(tiers, default=0),
    }
    if "cpu" in topo.meta:
        info["cpu"] = topo.meta["cpu"]  # the hosts' CPU, which NCCL's tuner reads (net overhead, LL ceiling)
    if "generator" in topo.meta:
        info["generator"] = topo.meta["generator"]
    over = leaf_oversubscription(topo)
    if over:
        info["leaf_oversubscription"] = {"min": min(over), "max": max(over)}
    if bisection and len(eps) >= 2:
        half = len(eps) // 2
        full = min(sum(nic_bps(topo, e) for e in eps[:half]), sum(nic_bps(topo, e) for e in eps[half : 2 * half]))
        bis = rank_bisection_bps(topo)
        info["bisection"] = {"bps": bis, "nic_bps_of_half": full, "ratio": bis / full if full else None}
    if len(eps) >= 2:
        info["example_routes"] = [route_info(topo, 0, 1), route_info(topo, 0, len(eps) - 1)]
    return info


def _rate(bps: float) -> str:
    return format_rate(int(bps)) if bps == int(bps) else f"{bps / 1e9:.3g}Gbps"


def format_description(info: dict[str, Any]) -> str:
    """The text `phantora topo` prints."""
    out = [f"topology {info['name']}" + (f"  ({info['description']})" if info.get("description") else "")]
    if info.get("source"):
        out.append(f"  source       {info['source']} [{info['format']}]")
    if info.get("gpu_model"):
        out.append(f"  gpu          {info['gpu_model']}")
    if info.get("cpu"):
        out.append(f"  cpu          {info['cpu']}")
    kinds = ", ".join(f"{c} {k}" for k, c in info["nodes_by_kind"].items())
    out.append(f"  nodes        {info['nodes']}: {kinds}")
    if info["switches_by_tier"]:
        tiers = ", ".join(f"{c} {t}" for t, c in info["switches_by_tier"].items())
        out.append(f"  switches     {tiers} ({info['switch_tiers']} tier{'s' if info['switch_tiers'] != 1 else ''})")
    sizes = "/".join(map(str, info["gpus_per_host"]))
    out.append(f"  ranks        {info['ranks']} in {info['hosts']} hosts ({sizes} per host)")
    out.append(f"  links        {info['links']}:")
    for c in info["link_classes"]:
        out.append(f"    {c['count']:>6} x {c['ends']:<16} {_rate(c['rate_bps']):>9}  {c['latency_ns']} ns")
    if "leaf_oversubscription" in info:
        o = info["leaf_oversubscription"]
        text = f"{o['min']:g}:1" if o["min"] == o["max"] else f"{o['min']:g}:1 .. {o['max']:g}:1"
        out.append(f"  oversubscription (leaf down:up)  {text}")
    if "bisection" in info:
        b = info["bisection"]
        ratio = f" ({b['ratio']:.3g} x the NIC capacity of half the ranks)" if b["ratio"] is not None else ""
        out.append(f"  bisection (rank halves, max flow)  {_rate(b['bps'])}{ratio}")
    for r in info.get("example_routes", []):
        out.append(
            f"  route rank {r['from_rank']} -> {r['to_rank']}: {' -> '.join(r['path'])} "
            f"({r['hops']} hops, {r['latency_ns']} ns, bottleneck {_rate(r['bottleneck_bps'])})"
        )
    return "\n".join(out)


def node_table(topo: Topology) -> list[dict[str, Any]]:
    """Every node: its id and name (as run directories name nodes, ids in their *_id columns), kind, host,
    tier and rank (endpoints); for `phantora topo --json`."""
    rank = {node: r for r, node in enumerate(topo.endpoints)}
    return [
        {"id": n.id, "name": n.name, "kind": n.kind, "host": n.host, "tier": n.tier, "rank": rank.get(n.id)}
        for n in topo.nodes
    ]
