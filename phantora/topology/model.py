"""The `Topology` model shared by every network engine: nodes, full-duplex links, ECMP routes.

Conventions
- Node ids are dense integers 0..N-1. A node has a kind: ``gpu`` (an endpoint with its own NIC,
  as in SimAI), ``host`` (a plain endpoint, as in HPCC files), ``nvswitch`` or ``switch``.
- Ranks map to endpoints in order: rank i is ``topology.endpoints[i]``. A placed copy
  (``with_rank_order``) puts chosen endpoints first, so several jobs' ranks land on their GPUs.
- A link is full duplex: each direction is a *channel* with the link's bandwidth (bits/s) and
  latency (ns). Channel ids are ``2*link_id`` (a->b) and ``2*link_id+1`` (b->a).
- Routing: endpoints never forward. Traffic between two endpoints that share an NVSwitch goes
  through it; all other traffic avoids NVSwitches and takes a shortest path (in hops) through
  switches. Among equal-cost next hops, the topology's ECMP policy (``ecmp_hash``: ``phantora``
  or ``hpcc``, see ``phantora.topology.ecmp``) picks one. The ns-3 switches use the same
  functions, so both engines put a flow on the same path.
- A flow through the NICs (`via_nic`, `Flow.via_nic`) leaves through its NICs even between endpoints of one
  NVSwitch (NCCL's NET transport between GPUs of one host with P2P off: collectives/nccl/net_split.py). Its ECMP
  hash reads its key with `NIC_HASH_BIT` set (`ecmp_input`), as ns-3's packet headers carry its key word (their
  own `viaNic` field carries the route).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from phantora.errors import InputError
from phantora.topology.ecmp import check_ecmp_hash, ecmp_input, hpcc_hash, hpcc_neighbour_rank, splitmix_hash

ENDPOINT_KINDS = ("gpu", "host")


NODE_KINDS = ("gpu", "host", "nvswitch", "switch")
RouteArgs = tuple[int, int] | tuple[int, int, int] | tuple[int, int, int, bool]  # `route`'s, from `route_cache_key`


@dataclass(frozen=True)
class Node:
    """A node of the network."""

    id: int
    kind: str
    name: str
    host: int | None = None  # index of the server a gpu/nvswitch belongs to
    tier: int = 0  # switches: 0 = NVSwitch/none, 1 = leaf, 2 = spine, 3 = core


@dataclass(frozen=True)
class Link:
    """A full-duplex link between nodes a and b."""

    id: int
    a: int
    b: int
    bandwidth_bps: int
    latency_ns: int


@dataclass
class Topology:
    """Nodes, links and routing. Build it with `add_node` / `add_link`, then call `validate`."""

    name: str = "topology"
    nodes: list[Node] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    gpu_model: str | None = None
    meta: dict[str, object] = field(default_factory=dict)
    ecmp_hash: str = "phantora"  # ECMP policy: phantora | hpcc (phantora.topology.ecmp); set with use_ecmp

    def __post_init__(self) -> None:
        self._adj: list[list[tuple[int, int]]] = [[] for _ in self.nodes]  # (neighbour, channel)
        self._dist_cache: dict[int, list[int]] = {}
        self._base_cache: dict[tuple[int, ...], list[int]] = {}
        self._endpoints: list[int] | None = None
        self._endpoint_set: frozenset[int] | None = None
        self._rank_order: list[int] | None = None  # endpoint node ids in rank order, if placed
        self._hpcc_order: dict[int, dict[int, int]] = {}  # dst -> node -> position in HPCC's BFS queue
        self._nvs_cache: dict[tuple[int, int], int | None] = {}  # (a, b) -> shared_nvswitch(a, b)
        self._one_path: dict[tuple[int, int], bool] = {}  # (src, dst) -> one_path(src, dst)
        self._switch_channels: list[int] | None = None
        check_ecmp_hash(self.ecmp_hash)
        for link in list(self.links):
            self._attach(link)

    # ----- construction -------------------------------------------------------------------
    def add_node(self, kind: str, name: str | None = None, host: int | None = None, tier: int = 0) -> int:
        """Append a node and return its id."""
        if kind not in NODE_KINDS:
            raise InputError(f"unknown node kind {kind!r} (known: {', '.join(NODE_KINDS)})", field="kind")
        nid = len(self.nodes)
        self.nodes.append(Node(nid, kind, name or f"{kind}{nid}", host, tier))
        self._adj.append([])
        self._switch_channels = None
        self._endpoints = None
        self._endpoint_set = None
        self._rank_order = None
        return nid

    def add_link(self, a: int, b: int, bandwidth_bps: int, latency_ns: int) -> int:
        """Append a full-duplex link and return its id."""
        for end in (a, b):
            if not 0 <= end < len(self.nodes):
                raise InputError(f"link {a}-{b}: unknown node {end} (have {len(self.nodes)} nodes)")
        if a == b:
            raise InputError(f"link {a}-{b}: a link must join two different nodes")
        if bandwidth_bps <= 0:
            raise InputError(f"link {a}-{b}: bandwidth must be positive, got {bandwidth_bps}", field="bandwidth")
        if latency_ns < 0:
            raise InputError(f"link {a}-{b}: latency must be >= 0, got {latency_ns}", field="latency")
        link = Link(len(self.links), a, b, int(bandwidth_bps), int(latency_ns))
        self.links.append(link)
        self._attach(link)
        return link.id

    def _attach(self, link: Link) -> None:
        self._adj[link.a].append((link.b, 2 * link.id))
        self._adj[link.b].append((link.a, 2 * link.id + 1))
        self._dist_cache.clear()
        self._base_cache.clear()
        self._hpcc_order.clear()
        self._nvs_cache.clear()
        self._one_path.clear()
        self._switch_channels = None

    # ----- queries ------------------------------------------------------------------------
    @property
    def endpoints(self) -> list[int]:
        """Endpoint node ids in rank order (rank i -> endpoints[i])."""
        if self._endpoints is None:
            natural = [n.id for n in self.nodes if n.kind in ENDPOINT_KINDS]
            self._endpoints = self._rank_order if self._rank_order is not None else natural
        return self._endpoints

    @property
    def endpoint_set(self) -> frozenset[int]:
        """The endpoint node ids (GPUs, hosts), for membership tests."""
        if self._endpoint_set is None:
            self._endpoint_set = frozenset(n.id for n in self.nodes if n.kind in ENDPOINT_KINDS)
        return self._endpoint_set

    @property
    def switch_channels(self) -> list[int]:
        """The directed channels from a switch to a switch, in id order (the fabric's load spreads over them)."""
        if self._switch_channels is None:
            switch = [n.kind == "switch" for n in self.nodes]
            both = [lk.id for lk in self.links if switch[lk.a] and switch[lk.b]]
            self._switch_channels = [2 * i + d for i in both for d in (0, 1)]
        return self._switch_channels

    @property
    def rank_order(self) -> list[int] | None:
        """Endpoint node ids in rank order when the ranks were placed (`with_rank_order`), else None."""
        return None if self._rank_order is None else list(self._rank_order)

    def with_rank_order(self, ranks: Sequence[int]) -> Topology:
        """A copy whose rank i is this topology's rank ``ranks[i]``; the endpoints not named follow in order.

        The nodes, links and routes are the same: only which GPU a rank number means changes."""
        eps = self.endpoints
        seen: set[int] = set()
        for r in ranks:
            if not 0 <= r < len(eps) or r in seen:
                raise InputError(f"rank order names rank {r} twice or outside 0..{len(eps) - 1}", field="ranks")
            seen.add(r)
        order = [eps[r] for r in ranks] + [e for i, e in enumerate(eps) if i not in seen]
        copy = Topology(self.name, list(self.nodes), list(self.links), self.gpu_model, dict(self.meta), self.ecmp_hash)
        copy._rank_order = order
        return copy

    def with_links_down(self, down: Collection[int]) -> Topology:
        """A copy whose routes avoid the links `down`: routing's view of a failure (link and channel ids,
        nodes and rank order unchanged; the copy is not validated, so an endpoint may have no route)."""
        copy = Topology(self.name, list(self.nodes), [], self.gpu_model, dict(self.meta), self.ecmp_hash)
        copy.links = list(self.links)
        for link in self.links:
            if link.id not in down:
                copy._attach(link)
        copy._rank_order = self._rank_order
        return copy

    @property
    def num_ranks(self) -> int:
        return len(self.endpoints)

    def node_of_rank(self, rank: int) -> int:
        eps = self.endpoints
        if not 0 <= rank < len(eps):
            raise InputError(f"rank {rank} is outside the topology '{self.name}' ({len(eps)} ranks)", field="ranks")
        return eps[rank]

    def neighbours(self, node: int) -> list[tuple[int, int]]:
        """(neighbour, channel id) pairs of a node."""
        return self._adj[node]

    @property
    def num_channels(self) -> int:
        return 2 * len(self.links)

    def channel_ends(self, ch: int) -> tuple[int, int]:
        link = self.links[ch >> 1]
        return (link.a, link.b) if ch % 2 == 0 else (link.b, link.a)

    def channel_bandwidth(self, ch: int) -> int:
        return self.links[ch >> 1].bandwidth_bps

    def channel_latency(self, ch: int) -> int:
        return self.links[ch >> 1].latency_ns

    def shared_nvswitch(self, a: int, b: int) -> int | None:
        """The NVSwitch both endpoints attach to, if any (remembered per pair)."""
        pair = (a, b)
        if pair in self._nvs_cache:
            return self._nvs_cache[pair]
        na = {v for v, _ in self._adj[a] if self.nodes[v].kind == "nvswitch"}
        got = next((v for v, _ in self._adj[b] if v in na), None)
        self._nvs_cache[pair] = got
        return got

    def nvswitch_of(self, src: int, dst: int, *, via_nic: bool) -> int | None:
        """The NVSwitch a flow (src, dst) crosses: `shared_nvswitch`, None for a flow through the NICs."""
        return None if via_nic else self.shared_nvswitch(src, dst)

    def _forwards(self, node: int) -> bool:
        return self.nodes[node].kind == "switch"

    def _dist_to(self, dst: int) -> list[int]:
        """Hop distance of every node to dst through switches only (endpoints do not forward).

        Endpoints attached to the same switches share one BFS (a leaf's 32 GPUs cost one search).
        """
        dist = self._dist_cache.get(dst)
        if dist is not None:
            return dist
        seeds: set[int] = set()
        direct = False
        for v, _ in self._adj[dst]:
            kind = self.nodes[v].kind
            if kind == "switch":
                seeds.add(v)
            elif kind != "nvswitch":
                direct = True  # an endpoint-to-endpoint link: search from dst itself
        if direct:
            dist = self._bfs({dst}, 0, origin=dst)
        else:
            key = tuple(sorted(seeds))
            base = self._base_cache.get(key)
            if base is None:
                base = self._base_cache[key] = self._bfs(seeds, 1, origin=-1)
            dist = base.copy()
            dist[dst] = 0
        self._dist_cache[dst] = dist
        return dist

    def _bfs(self, sources: set[int], start: int, origin: int) -> list[int]:
        """Multi-source BFS expanding only switches (and origin); NVSwitches are never entered."""
        inf = 1 << 30
        dist = [inf] * len(self.nodes)
        for s in sources:
            dist[s] = start
        queue = deque(sorted(sources))
        nodes = self.nodes
        while queue:
            u = queue.popleft()
            if u != origin and nodes[u].kind != "switch":
                continue  # endpoints and NVSwitches are leaves of the search
            du = dist[u] + 1
            for v, _ in self._adj[u]:
                if dist[v] == inf and nodes[v].kind != "nvswitch":
                    dist[v] = du
                    queue.append(v)
        return dist

    def use_ecmp(self, name: str) -> Topology:
        """Choose the ECMP policy (``phantora`` or ``hpcc``) every route of this topology follows."""
        self.ecmp_hash = check_ecmp_hash(name)
        return self

    def next_hops(self, node: int, dst: int) -> list[tuple[int, int]]:
        """Equal-cost (neighbour, channel) choices from node towards dst, in the ECMP policy's order:
        by neighbour id (phantora), or as HPCC's routing BFS from dst finds them (hpcc)."""
        dist = self._dist_to(dst)
        want = dist[node] - 1
        hops = sorted((v, ch) for v, ch in self._adj[node] if dist[v] == want and (v == dst or self._forwards(v)))
        if self.ecmp_hash == "hpcc" and len(hops) > 1:
            order = self._hpcc_queue_order(dst)
            hops.sort(key=lambda h: (order.get(h[0], len(self.nodes)), h))
        return hops

    def _hpcc_queue_order(self, dst: int) -> dict[int, int]:
        """Position of each node in the queue of HPCC's BFS from dst (CalculateRoute): neighbours are
        visited in ``hpcc_neighbour_rank`` order and only switches are queued (NVSwitches never)."""
        order = self._hpcc_order.get(dst)
        if order is not None:
            return order
        nodes = self.nodes
        order = {dst: 0}
        queue = [dst]
        for u in queue:
            nbrs = sorted({v for v, _ in self._adj[u]}, key=lambda v: hpcc_neighbour_rank(v, nodes[v].kind == "switch"))
            for v in nbrs:
                if v not in order and nodes[v].kind == "switch":
                    order[v] = len(queue)
                    queue.append(v)
        self._hpcc_order[dst] = order
        return order

    def pick(self, node: int, src: int, dst: int, flow_key: int) -> tuple[int, int]:
        """The (neighbour, channel) a packet of flow (src, dst) leaves `node` by, hashing `flow_key` (`ecmp_input`)."""
        hops = self.next_hops(node, dst)
        if len(hops) == 1:
            return hops[0]
        if self.ecmp_hash == "hpcc":
            return hops[hpcc_hash(src, dst, flow_key, node) % len(hops)]
        return hops[splitmix_hash(flow_key, node) % len(hops)]

    def one_path(self, src: int, dst: int) -> bool:
        """Whether every flow from src to dst takes one path, whatever its ECMP key (no hop has a choice; remembered
        per pair): route caches then key such flows by their pair, not by their key or id."""
        pair = (src, dst)
        got = self._one_path.get(pair)
        if got is None:
            got = src == dst or self.shared_nvswitch(src, dst) is not None
            if not got and self._dist_to(dst)[src] < 1 << 30:
                node, got = src, True
                while node != dst and got:
                    hops = self.next_hops(node, dst)
                    got = len(hops) == 1
                    node = hops[0][0]
            self._one_path[pair] = got
        return got

    def route_cache_key(self, src: int, dst: int, flow_key: int, via_nic: bool = False) -> RouteArgs:
        """What a route cache keys a flow by, `route`'s arguments: its pair where the pair has one path (`one_path`),
        else its pair and ECMP key (a flow without a key passes its id); a flow through the NICs: all four."""
        if via_nic:
            return (src, dst, flow_key, True)  # through the NICs: routed with its key
        return (src, dst) if self.one_path(src, dst) else (src, dst, flow_key)

    def check_route(self, src: int, dst: int, via_nic: bool = False) -> None:
        """Raise `route`'s InputError if no flow (through the NICs or not) can go from src to dst, without walking a
        path (whether a pair has a route does not depend on a flow's ECMP key)."""
        if src != dst and self.nvswitch_of(src, dst, via_nic=via_nic) is None and self._dist_to(dst)[src] >= 1 << 30:
            raise InputError(f"no route from {self.nodes[src].name} to {self.nodes[dst].name} in '{self.name}'")

    def route(self, src: int, dst: int, flow_key: int = 0, via_nic: bool = False) -> list[int]:
        """Channel ids of the path a flow with this key (through the NICs or not) takes from src to dst."""
        if src == dst:
            return []
        nv = self.nvswitch_of(src, dst, via_nic=via_nic)
        if nv is not None:
            return [self._channel(src, nv), self._channel(nv, dst)]
        self.check_route(src, dst, via_nic)
        path: list[int] = []
        node = src
        hashed = ecmp_input(flow_key, via_nic)
        while node != dst:
            v, ch = self.pick(node, src, dst, hashed)
            path.append(ch)
            node = v
        return path

    def _channel(self, a: int, b: int) -> int:
        for v, ch in self._adj[a]:
            if v == b:
                return ch
        raise InputError(f"no link between {self.nodes[a].name} and {self.nodes[b].name}")

    def path_latency_ns(self, path: list[int]) -> int:
        return sum(self.links[ch >> 1].latency_ns for ch in path)

    def path_bottleneck_bps(self, path: list[int]) -> int:
        return min(self.links[ch >> 1].bandwidth_bps for ch in path)

    # ----- checks -------------------------------------------------------------------------
    def validate(self, source: str | None = None) -> Topology:
        """Check the topology is usable: endpoints exist and every pair of endpoints is connected."""
        if not self.endpoints:
            raise InputError("the topology has no GPU or host endpoints", file=source)
        for n in self.nodes:
            if n.kind in ENDPOINT_KINDS and not self._adj[n.id]:
                raise InputError(f"endpoint {n.name} (node {n.id}) has no link", file=source)
        self._check_routable(source)
        return self

    def _check_routable(self, source: str | None) -> None:
        """Every pair of endpoints must share an NVSwitch, a direct link, or a connected switch fabric."""
        comp: dict[int, int] = {}  # switch -> id of its component in the switch-only graph
        for s in (n.id for n in self.nodes if n.kind == "switch"):
            if s in comp:
                continue
            comp[s] = s
            queue = deque([s])
            while queue:
                u = queue.popleft()
                for v, _ in self._adj[u]:
                    if v not in comp and self.nodes[v].kind == "switch":
                        comp[v] = s
                        queue.append(v)
        classes: dict[tuple[frozenset[int], frozenset[int]], list[int]] = {}
        direct: dict[int, set[int]] = {}
        for e in self.endpoints:
            fabrics, nvs = set(), set()
            for v, _ in self._adj[e]:
                kind = self.nodes[v].kind
                if kind == "switch":
                    fabrics.add(comp[v])
                elif kind == "nvswitch":
                    nvs.add(v)
                else:
                    direct.setdefault(e, set()).add(v)
            classes.setdefault((frozenset(fabrics), frozenset(nvs)), []).append(e)
        keys = list(classes)
        if frozenset.intersection(*(k[0] for k in keys)):
            return  # one switch fabric reaches every endpoint
        for i, ki in enumerate(keys):
            for kj in keys[i:]:
                if ki[0] & kj[0] or ki[1] & kj[1]:
                    continue
                for a in classes[ki]:
                    for b in classes[kj]:
                        if a != b and b not in direct.get(a, ()):
                            na, nb = self.nodes[a], self.nodes[b]
                            raise InputError(
                                f"the topology is disconnected: {na.name} (node {a}) cannot reach {nb.name} "
                                f"(node {b}) through switches, an NVSwitch or a direct link",
                                file=source,
                            )

    def summary(self) -> dict[str, object]:
        """Counts of nodes by kind, links, and bandwidth classes, for `phantora topo`."""
        kinds: dict[str, int] = {}
        for n in self.nodes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        bw: dict[int, int] = {}
        for link in self.links:
            bw[link.bandwidth_bps] = bw.get(link.bandwidth_bps, 0) + 1
        return {
            "name": self.name,
            "nodes": len(self.nodes),
            "kinds": kinds,
            "links": len(self.links),
            "link_bandwidths_bps": dict(sorted(bw.items())),
            "ranks": self.num_ranks,
            "gpu_model": self.gpu_model,
        }
