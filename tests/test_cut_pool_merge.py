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


def test_records_merge_in_time_each_workers_order_kept_and_ties_counted() -> None:
    """Each worker's list is in its own event order (one engine's on its nodes), which a sort by fields would
    break within an ns; records of one ns from two workers are counted, as their order is not known."""
    from bridge.cut_pool import in_time

    w0 = [(5, "b"), (5, "a"), (9, "c")]  # two records of ns 5 in this worker's event order: b before a
    w1 = [(3, "x"), (9, "y"), (12, "z")]
    ties = [0]
    out = in_time([w0, w1], lambda r: r[0], ties)
    assert out == [(3, "x"), (5, "b"), (5, "a"), (9, "c"), (9, "y"), (12, "z")]
    assert ties == [1]  # ns 9 meets across workers; ns 5 is one worker's alone
    assert in_time([[(1, "p")], []], lambda r: r[0], ties) == [(1, "p")] and ties == [1]


def test_settings_are_the_first_workers_and_the_end_is_the_last_ack() -> None:
    from dataclasses import astuple

    from phantora.netsim.hpcc_io import FctLine

    w0 = _worker({"cc": "dcqcn", "events": 4}, {})
    w1 = _worker({"cc": "dcqcn", "events": 6}, {})
    w0["fct"] = [astuple(FctLine(0, 1, 10000, 100, 1000, 2_000, 700, 500, 0))]
    w1["fct"] = [astuple(FctLine(2, 1, 10000, 100, 1000, 1_000, 900, 500, 1))]
    res = _merge([w0, w1], 0.0, TOPO)
    assert res.stats["cc"] == "dcqcn" and res.stats["events"] == 10
    assert res.now == 2_700 and [r.flow_id for r in res.fct] == [1, 0]  # ends 1,900 then 2,700
