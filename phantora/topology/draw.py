"""Draw a topology as a layered picture (matplotlib Agg; no display needed).

Large topologies are collapsed so the picture stays readable and fast: beyond ``max_endpoints``
endpoints, each host (its GPUs and NVSwitch) becomes one node; beyond that again, endpoints with
the same switches become one group node. A line's colour is its links' rate and its width grows with
the links it stands for; the legend names node kinds and link rates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from phantora.errors import InputError
from phantora.topology.model import ENDPOINT_KINDS, Topology

_COLOURS = {
    "gpu": "tab:green",
    "host": "tab:green",
    "server": "tab:green",
    "nvswitch": "tab:purple",
    "group": "tab:olive",
}
_TIER_COLOURS = ["tab:gray", "tab:blue", "tab:orange", "tab:red"]
_TIER_NAMES = ["switch", "leaf switch", "spine switch", "core switch"]
_KIND_NAMES = {
    "gpu": "GPU (with its NIC)",
    "host": "host",
    "server": "server (its GPUs and NVSwitch)",
    "nvswitch": "NVSwitch",
    "group": "endpoints reaching the same switches",
}
_RATE_COLOURS = ["tab:red", "tab:blue", "tab:green", "tab:brown", "tab:pink", "tab:cyan", "tab:olive"]


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
            drawn[key] = (1, "server", f"host{n.host}")
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


def topology_figure(topo: Topology, *, max_endpoints: int = 64) -> Figure:
    """The picture of `topo`: layers bottom-up, links coloured by rate (width: links bundled into one line),
    a legend for node kinds and link rates, and node labels that never overlap (a dense layer's labels are
    turned upright; a label that would still touch another is left out, and a note says how many)."""
    owner, drawn = _collapse(topo, max_endpoints)
    weight: Counter[tuple[str, str, int]] = Counter()
    for link in topo.links:
        a, b = owner[link.a], owner[link.b]
        if a != b:
            weight[(min(a, b), max(a, b), link.bandwidth_bps)] += 1
    pos = _layout(drawn)
    per_layer = Counter(layer for layer, _, _ in drawn.values())
    width = max(7.0, min(24.0, 0.15 * max(per_layer.values())))
    fig = Figure(figsize=(width, 1.6 * len(per_layer) + 2.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    rates = sorted({r for _, _, r in weight}, reverse=True)
    rate_colour = {r: _RATE_COLOURS[i % len(_RATE_COLOURS)] for i, r in enumerate(rates)}
    top = max(weight.values(), default=1)
    for r in rates:
        edges = [(e, n) for e, n in weight.items() if e[2] == r]
        segs = [(pos[a], pos[b]) for (a, b, _), _n in edges]
        widths = [0.4 + 2.0 * n / top for _e, n in edges]
        ax.add_collection(LineCollection(segs, linewidths=widths, colors=rate_colour[r], alpha=0.55, zorder=1))
    keys = list(drawn)
    colours = [_node_colour(drawn[k]) for k in keys]
    ax.scatter([pos[k][0] for k in keys], [pos[k][1] for k in keys], s=30, c=colours, zorder=2)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.45, len(per_layer) - 0.5)
    kinds = Counter(n.kind for n in topo.nodes)
    eps = sum(kinds[k] for k in ENDPOINT_KINDS)
    links = Counter(link.bandwidth_bps for link in topo.links)
    handles = [
        Line2D([], [], ls="", marker="o", color=colour, label=name) for name, colour in _kind_legend(drawn.values())
    ]
    handles += [Line2D([], [], color=rate_colour[r], lw=2, label=f"{_rate(r)} ({links[r]} links)") for r in rates]
    ax.set_title(f"{topo.name}: {eps} endpoints, {kinds['nvswitch']} NVSwitches, {kinds['switch']} switches")
    for ncols in range(min(len(handles), 4), 0, -1):  # as many columns as fit the figure's width
        legend = fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize="small",
                            frameon=False)  # fmt: skip
        fig.canvas.draw()  # lay the figure out, then keep it: the labels are placed in its final coordinates
        box = legend.get_window_extent()
        if ncols == 1 or (box.x0 >= 0 and box.x1 <= fig.bbox.width):
            break
        legend.remove()
    fig.set_layout_engine("none")
    hidden = _label(fig, ax, drawn, pos, per_layer)
    if hidden:
        ax.annotate(f"labels of {hidden} crowded nodes left out", (1.0, 0.0), xycoords="axes fraction",
                    ha="right", va="bottom", fontsize="small", color="0.4")  # fmt: skip
    return fig


def _label(
    fig: Figure,
    ax: Any,
    drawn: dict[str, tuple[int, str, str]],
    pos: dict[str, tuple[float, float]],
    per_layer: Counter[int],
) -> int:
    """Label each drawn node on the side its links do not take (the bottom layer below its nodes, the others
    above: the top layer has no links above, a middle one's label sits on an opaque box); turn a dense
    layer's labels upright; remove any label that overlaps one kept before it (so none overlap). Returns how
    many were removed."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    span = ax.get_window_extent(renderer).width
    bottom = min(layer for layer, _, _ in drawn.values())
    kept: list[Any] = []
    hidden = 0
    for k, (layer, _, name) in drawn.items():
        wide = 7 * 0.6 * len(name) * fig.dpi / 72  # about 0.6 em per character at 7 pt, in pixels
        upright = wide > span / max(per_layer[layer], 1) * 0.9
        below = layer == bottom
        text = ax.annotate(name, pos[k], fontsize=7, ha="center", va="top" if below else "bottom",
                           rotation=90 if upright else 0, xytext=(0, -6 if below else 6),
                           textcoords="offset points", zorder=3,
                           bbox={"fc": "white", "ec": "none", "alpha": 1.0, "pad": 0.5})  # fmt: skip
        box = text.get_window_extent(renderer)
        if any(box.overlaps(other) for other in kept):
            text.remove()
            hidden += 1
        else:
            kept.append(box)
    return hidden


def _node_colour(node: tuple[int, str, str]) -> str:
    layer, kind, _ = node
    return _COLOURS.get(kind) or _TIER_COLOURS[min(max(layer - 2, 0), 3)]


def _kind_legend(nodes: Iterable[tuple[int, str, str]]) -> list[tuple[str, str]]:
    """(legend text, colour) for each kind of drawn node, bottom layer first."""
    seen: dict[str, str] = {}
    for layer, kind, _ in sorted(nodes):
        if kind == "switch":
            name = _TIER_NAMES[min(max(layer - 2, 0), 3)]
        else:
            name = _KIND_NAMES[kind]
        seen.setdefault(name, _node_colour((layer, kind, "")))
    return list(seen.items())


def _rate(bps: int) -> str:
    for unit, scale in (("Tb/s", 10**12), ("Gb/s", 10**9), ("Mb/s", 10**6)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps} b/s"


def draw_topology(topo: Topology, out: str | Path, *, max_endpoints: int = 64) -> Path:
    """Write a PNG (or any matplotlib format, by suffix) picture of topo; return the path."""
    fig = topology_figure(topo, max_endpoints=max_endpoints)
    path = Path(out)
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot write the drawing: {exc}", file=str(path)) from None
    return path
