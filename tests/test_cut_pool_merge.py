"""How `bridge.cut_pool` merges its partition workers' records into one engine's (issue 38), without ns-3.

Each worker runs its own group's nodes: a counter (events, marks) is its own part of the whole, so the parts add
up; a peak (the fullest switch buffer) or a property of the whole fabric (its base RTT) is the largest, not the
sum; and the switch links' load comes from the merged channels, where each channel's bytes are its sender's.
"""

from __future__ import annotations

from typing import Any

from bridge.columns import completions_to_columns
from bridge.cut_pool import _merge
from phantora.topology.generators import leaf_spine

TOPO = leaf_spine(2, 2, 2, nvswitch=False)  # 2 leaves x 2 spines: 4 cables, 8 switch-to-switch channels
KINDS = [n.kind for n in TOPO.nodes]
FABRIC = [c for c in range(TOPO.num_channels) if all(KINDS[n] == "switch" for n in TOPO.channel_ends(c))]


def _worker(stats: dict[str, float], sent: dict[int, int]) -> dict[str, Any]:
    """A worker's output: `sent` bytes on the channels it sends on, zero on the other fabric channels."""
    rows = [[c, *TOPO.channel_ends(c), 100 * 10**9, sent.get(c, 0), 0, 0, 0, 0] for c in FABRIC]
    empty: list[Any] = []
    return {"done": completions_to_columns([]), "fct": empty, "pfc": empty, "marks": empty, "cnps": empty,
            "transport": empty, "channels": rows, "stats": stats, "windows": {}}  # fmt: skip


def test_counters_add_peaks_and_fabric_constants_do_not() -> None:
    a, b = FABRIC[0], FABRIC[1]
    common = {"cc_base_rtt_ns": 8000, "switch_links_idle": 7}
    w0 = _worker({**common, "events": 10, "ecn_marks": 3, "max_switch_buffer_bytes": 5000,
                  "switch_link_bytes_max": 300, "switch_link_bytes_min": 300}, {a: 300})  # fmt: skip
    w1 = _worker({**common, "events": 7, "ecn_marks": 2, "max_switch_buffer_bytes": 3000,
                  "switch_link_bytes_max": 100, "switch_link_bytes_min": 100}, {b: 100})  # fmt: skip
    stats = _merge([w0, w1], 0.0, TOPO).stats
    assert len(FABRIC) == 2 * 2 * 2
    assert (stats["events"], stats["ecn_marks"]) == (17, 5)
    assert (stats["max_switch_buffer_bytes"], stats["cc_base_rtt_ns"]) == (5000, 8000)  # not 8000 / 16000
    assert (stats["switch_link_bytes_max"], stats["switch_link_bytes_min"], stats["switch_links_idle"]) == (300, 100, 6)
