"""A `--jobs` run's trace.json: streamed from the jobs' own trace.json (`phantora.results.trace_stream`,
`phantora.jobs.results.write_jobs_trace`) and capped by `--trace-steps` in every job's ranks.

The streamed document must equal the whole-document merge it replaced (each job's trace.json loaded, shifted by
`job_trace_events`, dumped at once), whatever the block boundaries fall on; the live test checks the cap on a run of
two cuda_ddp.py jobs: compute ops in the first N steps only, collective spans in every step.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from phantora.errors import InputError
from phantora.jobs.results import NETWORK_PID, JobTrace, job_trace_events, write_jobs_trace
from phantora.results.trace_stream import read_trace_events

# events whose strings hold what a splitter on the text would trip on: brackets, braces, commas, the document's own
# tail, escaped quotes, and characters of several bytes
TRICKY = [
    {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "rank 1"}},
    {"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},
    {"name": 'op "x"], "displayTimeUnit": "ns"}', "cat": "compute", "ph": "X", "pid": 1, "tid": 1, "ts": 0.5},
    {"name": "matmul ∑ 出力 {,}", "cat": "compute", "ph": "X", "pid": 0, "tid": 1, "ts": 1.25, "dur": 2.0},
    {"name": "all_reduce#0", "cat": "comm", "ph": "X", "pid": 0, "tid": 2, "ts": 3.0, "dur": 1.0,
     "args": {"group": [0, 1], "nccl": {"algorithm": "Ring", "pairs": [{"src": 1, "dst": 0}]}}},
    {"name": "step 0", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 4.0, "args": {"step": 0}},
]  # fmt: skip


def _doc(events: list[dict[str, Any]], **other: Any) -> dict[str, Any]:
    return {"traceEvents": events, "displayTimeUnit": "ns", **({"otherData": other} if other else {})}


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_read_trace_events_gives_the_documents_events_across_block_boundaries(tmp_path: Path, block: int) -> None:
    compact, indented = tmp_path / "a.json", tmp_path / "b.json"
    compact.write_text(json.dumps(_doc(TRICKY, ops_traced_steps=2)))
    indented.write_text(json.dumps(_doc(TRICKY), indent=1, ensure_ascii=False))
    assert list(read_trace_events(compact, block)) == TRICKY
    assert list(read_trace_events(indented, block)) == TRICKY
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(_doc([])))
    assert list(read_trace_events(empty, block)) == []
    # read as a stream: what follows the list is never parsed (a whole-document load would refuse this one)
    tail = tmp_path / "tail.json"
    tail.write_text(json.dumps(_doc(TRICKY))[:-1] + ', "otherData": {')
    assert list(read_trace_events(tail, block)) == TRICKY


def test_read_trace_events_reads_another_layout_whole_and_names_a_bad_file(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"displayTimeUnit": "ns", "traceEvents": TRICKY}))  # the list not first
    assert list(read_trace_events(other)) == TRICKY
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(_doc(TRICKY))[:-40])
    with pytest.raises(InputError, match=r"cut\.json: field 'traceEvents': cut short"):
        list(read_trace_events(cut, 16))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"traceEvents": {"a": 1}}))
    with pytest.raises(InputError, match=r"wrong\.json: field 'traceEvents'"):
        list(read_trace_events(wrong))


def test_the_streamed_run_trace_equals_the_whole_document_merge(tmp_path: Path) -> None:
    """Job a (ranks 0-1), job b (global ranks 2-3, its file indented), and a recorded job c without ranks; then a
    scenario's events and the run's notes: the same document, event for event, as loading every job's trace whole."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc(TRICKY, ops_traced_steps=1)))
    b.write_text(json.dumps(_doc(TRICKY[::-1]), indent=2))
    colls = {
        "a": [{"name": "ar", "kind": "all_reduce", "t_start": 3000, "end_ns": 4000}],
        "b": [
            {"name": "ag", "kind": "all_gather", "t_start": 1000, "end_ns": 3000},
            {"name": "ar", "kind": "all_reduce", "t_start": 0, "end_ns": 2000},
        ],
        "c": [{"name": "bg", "kind": "all_reduce", "t_start": 5, "end_ns": 9}],
    }
    parts = [
        JobTrace("a", 0, 0, a, colls["a"]),
        JobTrace("b", 1, 2, b, colls["b"]),
        JobTrace("c", 2, 0, None, colls["c"]),
    ]
    scenario = [{"name": "link down", "ph": "i", "s": "g", "pid": -1, "ts": 2.0}]
    notes = {"ops_traced_steps": 1, "note": "first step's ops"}
    f = io.StringIO()
    write_jobs_trace(f, parts, scenario, notes)
    got = json.loads(f.getvalue())
    whole: list[dict[str, Any]] = []
    for p in parts:
        ranks = json.loads(p.ranks_trace.read_text())["traceEvents"] if p.ranks_trace else []
        whole += job_trace_events(p.name, p.index, p.offset, ranks, p.collectives)
    assert got == {"traceEvents": whole + scenario, "displayTimeUnit": "ns", "otherData": notes}
    # and what the merge means: b's rank r is pid 2 + r, named as b's; c has its network lane only
    ev = got["traceEvents"]
    assert {e["args"]["name"] for e in ev if e["name"] == "process_name"} == {
        "a rank 1", "a network", "b rank 1", "b network", "c network",
    }  # fmt: skip
    assert sorted({e["pid"] for e in ev if e.get("cat") == "compute"}) == [0, 1, 2, 3]
    assert [e["tid"] for e in ev if e["pid"] == NETWORK_PID + 1 and e.get("ph") == "X"] == [0, 1]
    f = io.StringIO()
    write_jobs_trace(f, [], ())
    assert json.loads(f.getvalue()) == {"traceEvents": [], "displayTimeUnit": "ns"}  # no notes: no otherData


def test_a_negative_trace_steps_is_refused_for_several_jobs(tmp_path: Path) -> None:
    from phantora.jobs.run import launch_jobs
    from phantora.jobs.spec import parse_jobs
    from phantora.launcher import RunConfig

    spec = parse_jobs('[[job]]\nworkload = "ddp_buckets.toml"\nranks = 2\n', str(tmp_path / "jobs.toml"), tmp_path)
    cfg = RunConfig(script="", topology="testbed16", out_dir=tmp_path / "out", trace_steps=-1)
    with pytest.raises(InputError, match="field '--trace-steps': expected a step count >= 0"):
        launch_jobs(spec, cfg)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def span_ns(e: dict[str, Any]) -> tuple[int, int]:
    """A trace event's start and end in whole ns (the trace's us carry ns to 3 decimals; their float sum may not)."""
    start = round(e["ts"] * 1000)
    return start, start + round(e["dur"] * 1000)


@pytest.mark.slow
def test_trace_steps_caps_every_jobs_ops_and_keeps_every_steps_collectives(tmp_path: Path) -> None:
    """Two cuda_ddp.py jobs of 2 ranks and 3 steps (b starts 1 ms later), --trace-steps 2: every rank of both jobs
    has compute ops in steps 0 and 1 only (none after step 1 ends), a collective span in each of its 3 steps (DDP's
    all-reduce), and the run's and each job's trace.json say ops_traced_steps = 2."""
    from phantora.cli import main

    jobs = tmp_path / "jobs.toml"
    job = 'script = "cuda_ddp.py"\nargs = "--steps 3"\nranks = 2\n'
    jobs.write_text(f'[[job]]\nname = "a"\n{job}[[job]]\nname = "b"\n{job}start = "1ms"\n')
    out = tmp_path / "out"
    assert main(["run", "-q", "-t", "twoleaf8", "--jobs", str(jobs), "--trace-steps", "2", "--out", str(out)]) == 0
    doc = json.loads((out / "trace.json").read_text())
    assert doc["otherData"]["ops_traced_steps"] == 2
    for name in ("a", "b"):
        assert json.loads((out / "jobs" / name / "trace.json").read_text())["otherData"]["ops_traced_steps"] == 2
    ev = doc["traceEvents"]
    for pid in range(4):  # a's ranks 0-1, b's 2-3
        steps = sorted(span_ns(e) for e in ev if e["pid"] == pid and e.get("cat") == "step")
        assert len(steps) == 3
        ops = [span_ns(e) for e in ev if e["pid"] == pid and e.get("cat") == "compute"]
        comm = [span_ns(e)[0] for e in ev if e["pid"] == pid and e.get("cat") == "comm"]
        assert [sum(t0 <= s < t1 for s, _ in ops) > 0 for t0, t1 in steps] == [True, True, False]
        assert max(end for _, end in ops) <= steps[1][1]
        assert all(any(t0 <= t < t1 for t in comm) for t0, t1 in steps)
    assert steps[0][0] == 1_000_000  # b's rank 1 starts at 1 ms
    lanes = {e["pid"] for e in ev if e.get("cat") == "comm" and e["pid"] >= NETWORK_PID}
    assert lanes == {NETWORK_PID, NETWORK_PID + 1}
