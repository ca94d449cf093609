"""A star fabric for tests: n hosts on one switch, every link the same, so closed forms are one link's."""

from __future__ import annotations

from phantora.topology.model import Topology

G = 10**9
US = 1000


def star(
    n: int, bps: int = 100 * G, lat: int = US, *, name: str | None = None, tier: int = 0, switch_first: bool = False
) -> Topology:
    """n hosts on one switch of `tier` (0: no fabric tier), each by one link of `bps` bits/s and `lat` ns. Hosts are
    nodes 0..n-1 and the switch node n, or (`switch_first`) the switch node 0 and the hosts 1..n; host i is rank i."""
    t = Topology(name if name is not None else f"star{n}")
    if switch_first:
        sw = t.add_node("switch", tier=tier)
        for _ in range(n):
            t.add_link(t.add_node("host"), sw, bps, lat)
        return t.validate()
    hosts = [t.add_node("host") for _ in range(n)]
    sw = t.add_node("switch", tier=tier)
    for h in hosts:
        t.add_link(h, sw, bps, lat)
    return t.validate()
