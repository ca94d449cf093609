"""Draw a topology as a layered picture (matplotlib Agg; no display needed).

Large topologies are collapsed so the picture stays readable and fast: beyond ``max_endpoints``
endpoints, each host (its GPUs and NVSwitch) becomes one node; beyond that again, endpoints with
the same switches become one group node. Edge width grows with the links it stands for.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from phantora.errors import InputError
from phantora.topology.model import ENDPOINT_KINDS, Topology

_COLOURS = {"gpu": "tab:green", "host": "tab:green", "nvswitch": "tab:purple", "group": "tab:olive"}
_TIER_COLOURS = ["tab:gray", "tab:blue", "tab:orange", "tab:red"]


def _collapse(topo: Topology, max_endpoints: int) -> tuple[dict[int, str], dict[str, tuple[int, str, str]]]:
    """Map each node id to a drawn node key; return (mapping, drawn nodes: key -> (layer, kind, label))."""
    eps = topo.endpoints
    owner: dict[int, str] = {}
    drawn: dict[str, tuple[int, str, str]] = {}
    by_host = len(eps) > max_endpoints
    for n in topo.nodes:
        if n.kind == "switch":
            key = f"n{n.id}"
            owner[n.id] = key
            drawn[key] = (n.tier + 2, "switch", n.name)
        elif by_host and n.host is not None:
            key = f"h{n.host}"
            owner[n.id] = key
            drawn[key] = (1, "host", f"host{n.host}")
        else:
            key = f"n{n.id}"
            owner[n.id] = key
            drawn[key] = (0 if n.kind == "nvswitch" else 1, n.kind, n.name)
    low = [k for k, (layer, _, _) in drawn.items() if layer <= 1]
    if len(low) > 2 * max_endpoints:  # still too many: group by the switches they reach
        reach: dict[str, set[str]] = {k: set() for k in low}
        for link in topo.links:
            a, b = owner[link.a], owner[link.b]
            if a in reach and b not in reach:
                reach[a].add(b)
            if b in reach and a not in reach:
                reach[b].add(a)
        groups: dict[tuple[str, ...], str] = {}
        sizes: Counter[str] = Counter()
        remap: dict[str, str] = {}
        for k in low:
            sig = tuple(sorted(reach[k]))
            g = groups.setdefault(sig, f"g{len(groups)}")
            remap[k] = g
            sizes[g] += 1
        for k in low:
            del drawn[k]
        for g, c in sizes.items():
            drawn[g] = (1, "group", f"{c} endpoints")
        owner = {n: remap.get(k, k) for n, k in owner.items()}
    return owner, drawn


def _layout(drawn: dict[str, tuple[int, str, str]]) -> dict[str, tuple[float, float]]:
    """Layers stacked bottom-up, each spread over the full width in node order."""
    layers: dict[int, list[str]] = {}
    for key, (layer, _, _) in drawn.items():
        layers.setdefault(layer, []).append(key)
    rank = {layer: i for i, layer in enumerate(sorted(layers))}
    return {
        k: ((i + 0.5) / len(keys), float(rank[layer])) for layer, keys in layers.items() for i, k in enumerate(keys)
    }


def draw_topology(topo: Topology, out: str | Path, *, max_endpoints: int = 64) -> Path:
    """Write a PNG (or any matplotlib format, by suffix) picture of topo; return the path."""
    owner, drawn = _collapse(topo, max_endpoints)
    weight: Counter[tuple[str, str]] = Counter()
    for link in topo.links:
        a, b = owner[link.a], owner[link.b]
        if a != b:
            weight[(min(a, b), max(a, b))] += 1
    pos = _layout(drawn)
    per_layer = Counter(layer for layer, _, _ in drawn.values())
    width = max(6.0, min(24.0, 0.15 * max(per_layer.values())))
    fig = Figure(figsize=(width, 1.6 * len(per_layer) + 1), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    top = max(weight.values(), default=1)
    segs = [(pos[a], pos[b]) for a, b in weight]
    widths = [0.3 + 2.0 * weight[e] / top for e in weight]
    ax.add_collection(LineCollection(segs, linewidths=widths, colors="0.6", alpha=0.5, zorder=1))
    keys = list(drawn)
    colours = [_COLOURS.get(drawn[k][1]) or _TIER_COLOURS[min(max(drawn[k][0] - 2, 0), 3)] for k in keys]
    ax.scatter([pos[k][0] for k in keys], [pos[k][1] for k in keys], s=30, c=colours, zorder=2)
    fits = int(width * 3)  # labels per layer that stay legible
    for k in keys:
        if per_layer[drawn[k][0]] <= fits:
            ax.annotate(
                drawn[k][2], pos[k], fontsize=7, ha="center", va="bottom", xytext=(0, 5), textcoords="offset points"
            )
    kinds = Counter(n.kind for n in topo.nodes)
    eps = sum(kinds[k] for k in ENDPOINT_KINDS)
    ax.set_title(f"{topo.name}: {eps} endpoints, {kinds['nvswitch']} NVSwitches, {kinds['switch']} switches")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.3, len(per_layer) - 0.6)
    path = Path(out)
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot write the drawing: {exc}", file=str(path)) from None
    return path
