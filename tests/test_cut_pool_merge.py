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
from phantora.netsim.record_order import KeyedMerge, merge_by_key
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


def test_records_merged_in_parts_are_the_merge_of_all_of_them() -> None:
    """A stepped worker sends the records made since its last answer: each part merged after the ones before is
    the merge of all, ties across a part's border included (the example above cut after each ns: 3 ties); a
    part with a record before one already merged (d's key below z's) merges everything again, to the same list."""
    w0 = [(5, "b"), (5, "a"), (9, "c"), (9, "d")]
    k0 = [(5, 2, 1, 0), (5, 2, 1, 0), (9, 7, 6, 4), (9, 8, 0, 1)]
    w1 = [(3, "x"), (9, "y"), (9, "z"), (12, "w")]
    k1 = [(3, 0, 9, 0), (9, 7, 2, 5), (9, 8, 0, 0), (12, 11, 9, 1)]
    whole = ["x", "b", "a", "y", "c", "z", "d", "w"]
    for cuts in ([(1, 1), (2, 2), (4, 4)], [(2, 1), (3, 2), (4, 3), (4, 4)], [(2, 1), (4, 4)]):
        merge, at = KeyedMerge("test", 2), (0, 0)
        for a, b in cuts:
            merge.add([w0[at[0] : a], w1[at[1] : b]], [k0[at[0] : a], k1[at[1] : b]])
            at = (a, b)
        assert [r[1] for r in merge.out] == whole and merge.ties == 3, cuts
        assert merge.remerged == 0, cuts
    late = KeyedMerge("test", 2)
    late.add([w0[:3], w1], [k0[:3], k1])  # z (9, 8, 0, 0) and w (12, ...) merged before d (9, 8, 0, 1) came
    late.add([w0[3:], []], [k0[3:], []])
    assert [r[1] for r in late.out] == whole and late.ties == 3 and late.remerged == 1
    with pytest.raises(PhantoraError, match=r"worker 0: test record 3 has order key \(4, 1, 2, 0\) after"):
        bad = KeyedMerge("test", 1)
        bad.add([[1, 2, 3]], [[(4, 1, 3, 0), (4, 1, 3, 1), (4, 1, 4, 0)]])
        bad.add([[4]], [[(4, 1, 2, 0)]])


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


def test_records_go_on_the_wire_as_astuple_gives_them() -> None:
    """A worker sends each record as the tuple of its fields (`as_rows`, without astuple's deep copy)."""
    from dataclasses import astuple

    from bridge.cut_worker import as_rows
    from phantora.netsim.hpcc_io import FctLine
    from phantora.netsim.observe import CnpEvent, Drop, EcnMark, FlowTransport, PfcEvent, QueueSample, Trim

    rows = [FctLine(1, 2, 3, 4, 5, 6, 7, 8, 9), PfcEvent(10, 1, 1, 2, 3, True, 4), EcnMark(1, 2, 3, 4, 5, 6),
            CnpEvent(1, 2, 3, 4, 5), Drop(1, 2, 3, 4, 5, 6), Trim(1, 2, 3, 4, 5, 6, 7), FlowTransport(1, 2, 3, 4, 5),
            QueueSample(1, 2, 3, 4, 5)]  # fmt: skip
    for r in rows:
        assert as_rows([r, r]) == [astuple(r), astuple(r)] and type(as_rows([r])[0]) is tuple
    assert as_rows([]) == []
