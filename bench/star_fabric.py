"""What the small packet-engine benches share: a star fabric and reading an engine counter."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.topology.model import Topology

STAR_BPS = 100 * 10**9  # every link of the star
STAR_LATENCY_NS = 1000


def star(n: int) -> Topology:
    """n hosts (nodes 0..n-1) on one switch (node n), 100G links of 1 us."""
    t = Topology(f"star{n}")
    for _ in range(n):
        t.add_node("host")
    s = t.add_node("switch")
    for i in range(n):
        t.add_link(i, s, STAR_BPS, STAR_LATENCY_NS)
    return t.validate()


def stat_count(stats: dict[str, object], name: str) -> int:
    """An integer counter of the engine's stats (a clear error if it is missing or not a number)."""
    value = stats.get(name)
    if not isinstance(value, int | float):
        raise KeyError(f"engine stats: {name!r} is {value!r}, not a count")
    return int(value)
