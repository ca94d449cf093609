"""Per-job results: step times, PFC pauses suffered and caused, link rows and the per-job timeline."""

from __future__ import annotations

from pathlib import Path

from phantora.jobs.results import (
    JobFlow,
    job_trace_events,
    link_rows,
    pause_spans,
    pfc_by_job,
    read_pfc_rows,
    step_summary,
)
from phantora.netsim.observe import PfcEvent
from phantora.results.write import write_pfc_csv
from phantora.topology.generators import leaf_spine


def test_step_summary_times_from_the_start_and_averages_the_steady_steps() -> None:
    s = step_summary([1_300, 1_500, 1_800], start_ns=1_000)
    assert [x["time_ns"] for x in s["steps"]] == [300, 200, 300]
    assert s["step_time_ns"] == {"mean": 250.0, "min": 200, "max": 300, "steps_averaged": 2}


def test_pause_spans_pair_pauses_with_resumes_and_close_open_ones_at_the_end() -> None:
    rows = [  # time, node, port, prio, pause, from_node
        (10, 0, 0, 3, 1, 4),
        (15, 0, 0, 3, 1, 4),  # a second pause extends the first
        (30, 0, 0, 3, 0, 4),
        (40, 1, 0, 5, 1, 4),  # never resumed
    ]
    assert pause_spans(rows, end_ns=100) == [(0, 0, 3, 4, 10, 30), (1, 0, 5, 4, 40, 100)]


def test_pfc_rows_are_read_by_node_id_from_named_and_from_older_files(tmp_path: Path) -> None:
    """pfc.csv names its nodes (node = "gpu1") and keeps the ids in node_id / from_node_id; files written
    before names held the ids in node / from_node. Both read as the same id rows."""
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us")  # GPUs 0-3, leaves 4-5
    events = [PfcEvent(10, 1, 0, 0, 3, True, 4), PfcEvent(30, 1, 0, 0, 3, False, 4), PfcEvent(40, 3, 0, 0, 3, True, 5)]
    named = write_pfc_csv(tmp_path / "pfc.csv", topo, events)
    assert named.read_text().splitlines()[1].split(",")[1] == "gpu1"  # the case that crashed the jobs run
    old = tmp_path / "old.csv"
    old.write_text("time_ns,node,port,prio,pause,from_node\n10,1,0,3,1,4\n30,1,0,3,0,4\n40,3,0,3,1,5\n")
    want = [(10, 1, 0, 3, 1, 4), (30, 1, 0, 3, 0, 4), (40, 3, 0, 3, 1, 5)]
    assert read_pfc_rows(named) == read_pfc_rows(old) == want


def test_pfc_suffered_by_the_paused_class_caused_by_the_congested_egress() -> None:
    # 2 leaves x 2 GPUs, 1 spine: GPUs 0-3, leaves 4-5, spine 6. Leaf 4 pauses gpu0's port (gpu0 -> leaf4).
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us")
    flows = [
        JobFlow("a", 0, 2, 0, 1000, 3, 0, 100),  # gpu0 -> gpu2 in class 3: crosses the paused link, then 4 -> 6
        JobFlow("b", 1, 3, 0, 1000, 5, 0, 100),  # gpu1 -> gpu3 in class 5: shares the egress 4 -> 6, not the port
        JobFlow("c", 1, 3, 1, 1000, 3, 200, 300),  # class 3, but after the pause
    ]
    port = next(i for i, (v, _) in enumerate(topo.neighbours(0)) if v == 4)
    pauses = [(0, port, 3, 4, 20, 60)]
    got = pfc_by_job(topo, flows, pauses)
    assert got["a"] == {"pauses_suffered": 1, "paused_ns_suffered": 40, "pauses_caused": 1}
    assert got["b"] == {"pauses_suffered": 0, "paused_ns_suffered": 0, "pauses_caused": 1}
    assert got["c"] == {"pauses_suffered": 0, "paused_ns_suffered": 0, "pauses_caused": 0}
    # a pause of another class on that port touches nobody
    assert all(v["pauses_suffered"] == 0 for v in pfc_by_job(topo, flows, [(0, port, 6, 4, 20, 60)]).values())


def test_link_rows_and_the_job_timeline() -> None:
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us")
    ch = topo.neighbours(0)[0][1]
    (row,) = link_rows(topo, {"a": {ch: 12_500}}, elapsed_ns=1_000)
    assert row[7:] == ["a", 12_500, 1.0]  # 12.5 kB in 1 us at 100 Gb/s: the whole link
    rank_events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "rank 1"}},
        {"name": "step 0", "ph": "X", "pid": 1, "tid": 0, "ts": 0.0, "dur": 1.0},
    ]
    colls = [
        {"name": "ar", "kind": "all_reduce", "t_start": 0, "end_ns": 2000},
        {"name": "ag", "kind": "all_gather", "t_start": 1000, "end_ns": 3000},
    ]
    ev = job_trace_events("b", 1, 4, rank_events, colls)
    assert ev[0]["pid"] == 5 and ev[0]["args"] == {"name": "b rank 1"}
    spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "comm"]
    assert [(e["name"], e["tid"]) for e in spans] == [("ar", 0), ("ag", 1)]  # overlapping: two lanes


def test_a_jobs_trace_gets_nccls_choice_of_each_of_its_collectives_in_its_own_ranks() -> None:
    """A live job's ranks name their own world (0..n-1) while the coordinator's records name its ranks (a job at
    offset 4 all-reduces on [4, 5]): each span gets its own call's choice, an all-to-all's pairs too, and another
    job's records nothing (before, a `--jobs` run's trace carried no NCCL choice)."""
    from phantora.jobs.results import job_comm_args

    ring, pair = {"algorithm": "Ring", "channels": 2}, {"algorithm": "p2p", "channels": 1}
    names = [[4, "all_to_all#1@0.1"], [5, "all_to_all#1@0.1"]]
    records = [
        {"job": 0, "name": "all_reduce#0", "group": [0, 1, 2, 3], "nccl": {"algorithm": "Tree"}},
        {"job": 1, "name": "all_reduce#0", "group": [4, 5], "nccl": ring},
        {"job": 1, "name": "all_to_all#1@0.1", "group": [5, 4], "nbytes": 64, "names": names, "nccl": pair},
    ]
    args = job_comm_args(records, 1, 4)
    assert args == {
        (0, "all_reduce#0", (0, 1)): {"nccl": ring},
        (1, "all_reduce#0", (0, 1)): {"nccl": ring},
        (0, "all_to_all#1", (0, 1)): {
            "nccl": {"algorithm": "p2p", "pairs": [{"src": 1, "dst": 0, "bytes": 64, **pair}]}
        },
        (1, "all_to_all#1", (0, 1)): {
            "nccl": {"algorithm": "p2p", "pairs": [{"src": 1, "dst": 0, "bytes": 64, **pair}]}
        },
    }
