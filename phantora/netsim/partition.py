"""A partition of any fabric into N switch groups, for parallel packet simulation (issue 38).

Unlike `phantora.netsim.pieces` (link-disjoint pieces: traffic must stay inside one), a partition may cut
links: a packet crossing a cut link travels from one worker to the other, and the least latency of the cut
links is the lookahead of conservative synchronisation (docs/packet-model.md, "Parallel packet simulation").

How the groups are chosen (deterministic; `partition_fabric`):
- *Atoms*: an endpoint whose NIC has one switch (its leaf) goes with that switch: its access link is never
  cut. Under nvlink=fluid NVSwitches carry no packets: they and their links are outside the fabric (group
  NO_GROUP). Otherwise every node is an atom of its own.
- *Weights*: a link weighs what it carries: the recorded traffic's bytes routed over it (ECMP with each
  flow's key, as the engine routes it) plus 1, or without traffic its capacity in Gbit/s. An atom weighs the
  weight of the links at its nodes (a packet hop costs events at both ends).
- *Seed*: the atoms of the lowest switch tier (leaves with their NICs) in node order are cut into N runs of
  about equal weight (pods are consecutive in our generators, so a pod stays whole when it fits).
- *Grow*: every other atom, tier by tier upwards in node order, joins the group it has the most link
  weight to; ties go to the lightest group (then the lowest index). A leaf-spine's spines, tied
  everywhere, are dealt out evenly.
- *Refine*: single-atom moves, then pair swaps, that strictly lower the cut weight and keep every group
  within the balance bound (the largest of 5 % above the mean and the heaviest atom), until none is left
  (bounded passes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.topology.model import Link, Topology

NO_GROUP = -1
INF_NS = 1 << 62
BALANCE = 1.05
MAX_PASSES = 8
MAX_SWAP_ATOMS = 600


@dataclasses.dataclass(frozen=True)
class Partition:
    """Node id -> group, the cut links, the lookahead (least cut-link latency, INF_NS when nothing is cut) and
    each group's weight (its share of the simulated work)."""

    groups: tuple[int, ...]
    cut_links: tuple[int, ...]
    lookahead_ns: int
    loads: tuple[float, ...]
    cut_weight: float

    @property
    def n(self) -> int:
        return len(self.loads)

    def members(self, g: int) -> list[int]:
        """The node ids of group `g`."""
        return [v for v, x in enumerate(self.groups) if x == g]


def partition_fabric(
    topo: Topology, n: int, traffic: Iterable[Flow] | None = None, *, nvlink_fluid: bool = True
) -> Partition:
    """Partition `topo` into `n` switch groups (see the module docstring); `traffic` weighs links by bytes."""
    if n < 1:
        raise InputError(f"a partition needs at least one group, not {n}", field="partition")
    fabric = [not (nvlink_fluid and node.kind == "nvswitch") for node in topo.nodes]
    live = [lk for lk in topo.links if fabric[lk.a] and fabric[lk.b]]
    weight = _link_weights(topo, live, traffic, nvlink_fluid)
    atom = _atoms(topo, fabric)
    atoms = sorted({a for a in atom if a != NO_GROUP})
    if n > len(atoms):
        raise InputError(f"{topo.name} has {len(atoms)} switch groups at most, not {n}", field="partition")
    aw = {a: 0.0 for a in atoms}
    adj: dict[int, dict[int, float]] = {a: {} for a in atoms}
    for lk in live:
        w = weight[lk.id]
        aw[atom[lk.a]] += w
        aw[atom[lk.b]] += w
        x, y = atom[lk.a], atom[lk.b]
        if x != y:
            adj[x][y] = adj[x].get(y, 0.0) + w
            adj[y][x] = adj[y].get(x, 0.0) + w
    tier = {a: _tier(topo, a) for a in atoms}
    group = _seed(atoms, tier, aw, n)
    load = [0.0] * n
    for a, g in group.items():
        load[g] += aw[a]
    for a in sorted((a for a in atoms if a not in group), key=lambda a: (tier[a], a)):
        conn = [0.0] * n
        for b, w in adj[a].items():
            if b in group:
                conn[group[b]] += w
        g = min(range(n), key=lambda i: (-conn[i], load[i], i))
        group[a] = g
        load[g] += aw[a]
    _refine(atoms, adj, aw, group, load)
    groups = tuple(group[atom[v]] if atom[v] != NO_GROUP else NO_GROUP for v in range(len(topo.nodes)))
    cut = tuple(lk.id for lk in live if groups[lk.a] != groups[lk.b])
    return Partition(
        groups=groups,
        cut_links=cut,
        lookahead_ns=min((topo.links[i].latency_ns for i in cut), default=INF_NS),
        loads=tuple(load),
        cut_weight=sum(weight[i] for i in cut),
    )


def _link_weights(
    topo: Topology, live: list[Link], traffic: Iterable[Flow] | None, nvlink_fluid: bool
) -> dict[int, float]:
    """Link id -> weight: traffic bytes over it + 1, or its capacity in Gbit/s without traffic."""
    if traffic is None:
        return {lk.id: lk.bandwidth_bps / 1e9 for lk in live}
    w = {lk.id: 1.0 for lk in live}
    for f in traffic:
        if (
            f.src == f.dst
            or f.size <= 0
            or (nvlink_fluid and topo.nvswitch_of(f.src, f.dst, via_nic=f.via_nic) is not None)
        ):
            continue
        for ch in topo.route(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic):
            lid = ch >> 1
            if lid in w:
                w[lid] += f.size
    return w


def _atoms(topo: Topology, fabric: list[bool]) -> list[int]:
    """Node id -> atom id (its lowest node id), NO_GROUP outside the fabric: a NIC with one switch joins it."""
    atom = [v if fabric[v] else NO_GROUP for v in range(len(topo.nodes))]
    for v in topo.endpoint_set:
        switches = {u for u, _ in topo.neighbours(v) if fabric[u] and topo.nodes[u].kind == "switch"}
        if len(switches) == 1:
            atom[v] = next(iter(switches))
    return atom


def _tier(topo: Topology, a: int) -> int:
    node = topo.nodes[a]
    return node.tier if node.kind == "switch" else 0


def _seed(atoms: list[int], tier: dict[int, int], aw: dict[int, float], n: int) -> dict[int, int]:
    """The lowest switch tier's atoms (or every atom when there are no switches) cut into n runs of about equal
    weight, in node order."""
    tiers = sorted({tier[a] for a in atoms if tier[a] > 0})
    base = [a for a in atoms if tier[a] == tiers[0]] if tiers else list(atoms)
    if len(base) < n:
        base = sorted(atoms, key=lambda a: (tier[a], a))[:n]
    total = sum(aw[a] for a in base)
    group: dict[int, int] = {}
    acc, prev = 0.0, -1
    for i, a in enumerate(base):
        g = int(acc * n / total) if total > 0 else i * n // len(base)
        g = min(max(g, prev, n - (len(base) - i)), prev + 1, n - 1)  # monotone, no group skipped or left empty
        group[a] = prev = g
        acc += aw[a]
    return group


def _refine(
    atoms: list[int], adj: dict[int, dict[int, float]], aw: dict[int, float], group: dict[int, int], load: list[float]
) -> None:
    """Move single atoms while it strictly lowers the cut weight and keeps groups within the balance bound."""
    n = len(load)
    bound = max(BALANCE * sum(load) / n, max(aw.values(), default=0.0))
    count = [0] * n
    for g in group.values():
        count[g] += 1
    for _ in range(MAX_PASSES):
        moved = False
        for a in atoms:
            g = group[a]
            if count[g] < 2:
                continue  # never empty a group
            conn = [0.0] * n
            for b, w in adj[a].items():
                conn[group[b]] += w
            best = max(
                (i for i in range(n) if i != g and load[i] + aw[a] <= bound), key=lambda i: (conn[i], -i), default=None
            )
            if best is not None and conn[best] > conn[g]:
                group[a] = best
                load[g] -= aw[a]
                load[best] += aw[a]
                count[g] -= 1
                count[best] += 1
                moved = True
        moved = _swap_pass(atoms, adj, aw, group, load, bound) or moved
        if not moved:
            break


def _swap_pass(
    atoms: list[int],
    adj: dict[int, dict[int, float]],
    aw: dict[int, float],
    group: dict[int, int],
    load: list[float],
    bound: float,
) -> bool:
    """Swap pairs of atoms of two groups where it strictly lowers the cut weight within the balance bound (what
    single moves cannot do between groups at the bound). Quadratic in atoms: skipped above MAX_SWAP_ATOMS."""
    if len(atoms) > MAX_SWAP_ATOMS:
        return False
    moved = False
    for i, a in enumerate(atoms):
        for b in atoms[i + 1 :]:
            g, h = group[a], group[b]
            if g == h or load[g] - aw[a] + aw[b] > bound or load[h] - aw[b] + aw[a] > bound:
                continue
            ca = _conn(adj, group, a)
            cb = _conn(adj, group, b)
            wab = adj[a].get(b, 0.0)
            gain = ca.get(h, 0.0) - ca.get(g, 0.0) + cb.get(g, 0.0) - cb.get(h, 0.0) - 2 * wab
            if gain > 0:
                group[a], group[b] = h, g
                load[g] += aw[b] - aw[a]
                load[h] += aw[a] - aw[b]
                moved = True
    return moved


def _conn(adj: dict[int, dict[int, float]], group: dict[int, int], a: int) -> dict[int, float]:
    """Group -> link weight from atom `a` to it."""
    out: dict[int, float] = {}
    for b, w in adj[a].items():
        out[group[b]] = out.get(group[b], 0.0) + w
    return out


def partition_params(
    topology: Topology, n: int, *, nvlink_fluid: bool = False, worker: int | None = None
) -> list[tuple[str, str]]:
    """PhantoraNetwork params that cut `topology` into `partition_fabric`'s n groups: every group in one engine
    (partition.Loopback: packets over a cut cable travel as messages between windows), or with `worker` this
    engine a worker that runs that group only (partition.Worker). Nodes outside every group (NVSwitches under
    nvlink=fluid) join their neighbours' group when they all have the same (`adopted`), else form group n of
    their own, whose cables are cut; they carry no packet (partition.Idle: their cables' delay is no lookahead)."""
    groups = adopted(topology, partition_fabric(topology, n, nvlink_fluid=nvlink_fluid).groups)
    text = ",".join(str(n if g == NO_GROUP else g) for g in groups)
    mode = ("partition.Loopback", "1") if worker is None else ("partition.Worker", str(worker))
    idle = [str(v) for v, g in enumerate(groups) if g == NO_GROUP]
    return [("partition.Groups", text), mode, *([("partition.Idle", ",".join(idle))] if idle else [])]


def adopted(topology: Topology, groups: Sequence[int]) -> list[int]:
    """`groups` with each node outside every group (NO_GROUP: an NVSwitch under nvlink=fluid) in the group of its
    neighbours when they are all in that one (a host whose GPUs, and so NICs, hang off switches of one group).
    Such a node carries no packet (the fluid side carries NVLink), so its group only says which worker keeps it;
    left in a group of its own, each of its cables is cut and their latency (25 ns for NVLink) would bound every
    window, not the fabric's cut cables. A node whose neighbours span groups (a rail fabric's host) stays out."""
    near: dict[int, set[int]] = {}
    for lk in topology.links:
        for a, b in ((lk.a, lk.b), (lk.b, lk.a)):
            if groups[a] == NO_GROUP:
                near.setdefault(a, set()).add(groups[b])
    out = list(groups)
    for v, gs in near.items():
        if len(gs) == 1 and NO_GROUP not in gs:
            out[v] = next(iter(gs))
    return out
