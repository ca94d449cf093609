"""How `bridge.cut_pool` merges its partition workers' records into one engine's (issue 38), without ns-3.

Each worker runs its own group's nodes: a counter (events, marks) is its own part of the whole, so the parts add
up; a peak (the fullest switch buffer) or a property of the whole fabric (its base RTT) is the largest, not the
sum; and the switch links' load comes from the merged channels, where each channel's bytes are its sender's. Records
(FCT, PFC, CE marks, CNPs, drops) merge in one keyed engine's order by the order key of the event that made each.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.columns import completions_to_columns
from bridge.cut_pool import _merge
from phantora.errors import PhantoraError
from phantora.netsim.record_order import merge_by_key
from phantora.topology.generators import leaf_spine

TOPO = leaf_spine(2, 2, 2, nvswitch=False)  # 2 leaves x 2 spines: 4 cables, 8 switch-to-switch channels
KINDS = [n.kind for n in TOPO.nodes]
FABRIC = [c for c in range(TOPO.num_channels) if all(KINDS[n] == "switch" for n in TOPO.channel_ends(c))]


def _worker(stats: dict[str, float], sent: dict[int, int]) -> dict[str, Any]:
    """A worker's output: `sent` bytes on the channels it sends on, zero on the other fabric channels."""
    rows = [[c, *TOPO.channel_ends(c), 100 * 10**9, sent.get(c, 0), 0, 0, 0, 0] for c in FABRIC]
    empty: list[Any] = []
    return {"done": completions_to_columns([]), "fct": empty, "pfc": empty, "marks": empty, "cnps": empty,
            "transport": empty, "channels": rows, "stats": stats, "windows": {}, "keys": {"fct": []}}  # fmt: skip


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


def test_records_merge_in_one_engines_event_order_not_by_worker() -> None:
    """Ties of one ns across workers go by the key of the event that made each record (scheduling ns, then
    scheduling node, then its count), as one keyed engine runs them, wherever the worker order would put them;
    the records of one event (one key) keep their worker's order, which a sort by fields would break."""
    w0 = [(5, "b"), (5, "a"), (9, "c"), (9, "d")]
    k0 = [(5, 2, 1, 0), (5, 2, 1, 0), (9, 7, 6, 4), (9, 8, 0, 1)]  # b and a: one event's two records
    w1 = [(3, "x"), (9, "y"), (9, "z"), (12, "w")]
    k1 = [(3, 0, 9, 0), (9, 7, 2, 5), (9, 8, 0, 0), (12, 11, 9, 1)]
    ties = [0]
    got = merge_by_key("test", [w0, w1], [k0, k1], ties)
    # ns 9: y's event was scheduled at 7 by node 2, c's at 7 by node 6 (y first: the lower node); z's at 8 by
    # node 0 with count 0, d's by node 0 with count 1 (z first). Worker order would give c, d, y, z.
    assert [r[1] for r in got] == ["x", "b", "a", "y", "c", "z", "d", "w"]
    assert ties == [3]  # y after a (ns 5 vs 9: no), c after y, z after c, d after z
    assert merge_by_key("test", [w1, w0], [k1, k0]) == got  # the workers' numbering does not matter


def test_a_key_in_two_workers_or_a_missing_key_is_refused_naming_it() -> None:
    with pytest.raises(PhantoraError, match=r"pfc records: partition workers 0 and 1 both ran .* \(4, 1, 3, 0\)"):
        merge_by_key("pfc", [[1], [2]], [[(4, 1, 3, 0)], [(4, 1, 3, 0)]])
    with pytest.raises(PhantoraError, match="partition worker 1: 2 fct records but 1 order keys"):
        merge_by_key("fct", [[1], [2, 3]], [[(4, 1, 3, 0)], [(5, 1, 3, 0)]])
    with pytest.raises(PhantoraError, match=r"worker 0: cnps record 1 has order key \(4, 1, 2, 0\) after"):
        merge_by_key("cnps", [[1, 2]], [[(4, 1, 3, 0), (4, 1, 2, 0)]])


def test_settings_are_the_first_workers_and_the_end_is_the_last_ack() -> None:
    from dataclasses import astuple

    from phantora.netsim.hpcc_io import FctLine

    w0 = _worker({"cc": "dcqcn", "events": 4}, {})
    w1 = _worker({"cc": "dcqcn", "events": 6}, {})
    w0["fct"] = [astuple(FctLine(0, 1, 10000, 100, 1000, 2_000, 700, 500, 0))]
    w1["fct"] = [astuple(FctLine(2, 1, 10000, 100, 1000, 1_000, 900, 500, 1))]
    w0["keys"]["fct"] = [(2_700, 2_690, 0, 3)]  # each record's event: its ns first
    w1["keys"]["fct"] = [(1_900, 1_890, 2, 3)]
    res = _merge([w0, w1], 0.0, TOPO)
    assert res.stats["cc"] == "dcqcn" and res.stats["events"] == 10
    assert res.now == 2_700 and [r.flow_id for r in res.fct] == [1, 0]  # ends 1,900 then 2,700


def test_trims_merge_by_their_events_keys() -> None:
    """Issue 38: each worker's trims (DLCP) come with their events' keys and merge as one keyed engine's, like the
    other records (they were left in the workers before): two trims of one ns go by key, against worker order."""
    from dataclasses import astuple

    from phantora.netsim.observe import Trim

    w0 = _worker({"events": 1}, {})
    w1 = _worker({"events": 1}, {})
    w0["trims"] = [astuple(Trim(5_000, 20, 1, 3, 7, 4096, 4096)), astuple(Trim(6_000, 20, 1, 3, 7, 8192, 4096))]
    w1["trims"] = [astuple(Trim(5_000, 21, 2, 3, 9, 0, 4096))]
    w0["keys"]["trims"] = [(5_000, 4_990, 20, 1), (6_000, 5_990, 20, 2)]
    w1["keys"]["trims"] = [(5_000, 4_990, 11, 0)]  # scheduled by node 11: before node 20's event of that ns
    res = _merge([w0, w1], 0.0, TOPO)
    assert [(t.time_ns, t.flow_id) for t in res.trims] == [(5_000, 9), (5_000, 7), (6_000, 7)]
    assert res.ties == 1


def test_partition_summary_reports_each_workers_peak_memory() -> None:
    """summary.json / results.json keep each worker's peak RSS (KiB from getrusage, in MiB), not only the largest."""
    from phantora.netsim.partitioned import partition_summary

    def worker(maxrss_kb: int, cpu: float) -> dict[str, Any]:
        return {"windows": 3, "bytes_out": 10, "run_cpu_s": cpu, "ns3_cpu_s": cpu / 2, "run_wall_s": cpu,
                "wall_s": cpu, "ended_by": {}, "widths": {}, "setup_cpu_s": 1.0, "maxrss_kb": maxrss_kb}  # fmt: skip

    out = partition_summary([worker(614_400, 4.0), worker(819_200 + 1023, 2.0)], ties=0)
    assert out["maxrss_mb_each"] == [600, 800]  # 614,400 KiB = 600 MiB; a part MiB rounds down
    assert out["maxrss_mb"] == 800 and out["run_cpu_s"] == [4.0, 2.0] and out["ns3_cpu_s"] == [2.0, 1.0]
