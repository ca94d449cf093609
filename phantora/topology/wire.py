"""A topology as plain data for msgpack (never pickle): its nodes, links, meta, ECMP policy and rank order, rebuilt
with the public `Topology` API so that every process routes as the one that sent it (bridge/runspec.py's run
set-up, the cut workers, the fluid shards' processes)."""

from __future__ import annotations

from typing import Any

import msgpack

from phantora.topology.model import Topology


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    """`topo` as msgpack-able data (a meta value msgpack cannot carry goes as its repr)."""
    meta: dict[str, Any] = {}
    for k, v in topo.meta.items():
        try:
            msgpack.packb(v)
            meta[str(k)] = v
        except (TypeError, ValueError):
            meta[str(k)] = repr(v)
    return {
        "name": topo.name,
        "gpu_model": topo.gpu_model,
        "nodes": [[n.kind, n.name, n.host, n.tier] for n in topo.nodes],
        "links": [[lk.a, lk.b, lk.bandwidth_bps, lk.latency_ns] for lk in topo.links],
        "meta": meta,
        "ecmp_hash": topo.ecmp_hash,
        "rank_order": topo.rank_order,
    }


def topology_from_dict(d: dict[str, Any]) -> Topology:
    """The topology `topology_to_dict` gave `d` for."""
    meta = dict(d.get("meta", {}))
    topo = Topology(name=d["name"], gpu_model=d.get("gpu_model"), meta=meta, ecmp_hash=d.get("ecmp_hash", "phantora"))
    for kind, name, host, tier in d["nodes"]:
        topo.add_node(kind, name, host, tier)
    for a, b, bw, lat in d["links"]:
        topo.add_link(a, b, bw, lat)
    order = d.get("rank_order")
    if order is not None:  # node ids -> the natural rank of each
        natural = {node: r for r, node in enumerate(topo.endpoints)}
        topo = topo.with_rank_order([natural[n] for n in order])
    return topo
