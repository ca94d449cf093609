"""The ranks' trace chunks and their streamed merge into trace.json (phantora/results/trace_chunks.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from phantora.results import run_dir
from phantora.results.trace_chunks import chunk_line, parse_chunk, read_chunks, write_merged
from phantora.runtime.trace import TraceRecorder


def _events(rank: int, rng: random.Random, n: int) -> list[dict[str, Any]]:
    """A step's events of every kind a rank writes, with strings that look like the chunk's own keys."""
    evs: list[dict[str, Any]] = []
    for i in range(n):
        kind = rng.choice(["compute", "comm", "step", "storage"])
        ev = {"name": f'op "events": [{i}] \u00e9', "cat": kind, "ph": "X", "pid": rank, "tid": 1, "ts": i * 1.5}
        if kind == "comm":
            ev["args"] = {"bytes": rng.randrange(1 << 30), "group": [0, 1], "note": '], "comm": ['}
        evs.append(ev)
    return evs


def _key(ev: dict[str, Any]) -> str:
    return json.dumps(ev, sort_keys=True)


def test_a_chunk_line_parses_back_to_its_events_whatever_their_strings_hold():
    rng = random.Random(7)
    for n in (0, 1, 5, 40):
        evs = _events(2, rng, n)
        chunk = parse_chunk(chunk_line(2, 3, evs))
        assert chunk is not None and chunk.rank == 2 and chunk.step == 3
        assert sorted(map(_key, chunk.events())) == sorted(map(_key, evs))
        assert all(ev["cat"] == "comm" for ev in chunk.comm)
        assert len(chunk.comm) == sum(ev["cat"] == "comm" for ev in evs)


def test_a_line_cut_short_or_not_a_chunk_is_none_and_ends_the_rank():
    line = chunk_line(0, None, _events(0, random.Random(1), 6))
    assert parse_chunk(line).step is None
    for cut in (len(line) - 1, len(line) // 2, 10):  # a kill mid-write: no newline
        assert parse_chunk(line[:cut]) is None
    assert parse_chunk("not json\n") is None and parse_chunk("[1, 2]\n") is None


def test_an_older_layout_line_is_parsed_whole_and_merged(tmp_path: Path):
    evs = _events(1, random.Random(3), 12)
    (tmp_path / "rank1.jsonl").write_text(json.dumps({"rank": 1, "step": 0, "events": evs}) + "\n")
    (chunk,) = read_chunks(tmp_path / "rank1.jsonl")
    assert sorted(map(_key, chunk.events())) == sorted(map(_key, evs))


def test_the_streamed_merge_holds_every_event_once_with_its_added_args(tmp_path: Path):
    """Every event each rank wrote is in trace.json exactly once; each collective span has the arguments the
    merge gives it and nothing else changed; the chunks after a line cut short are not merged."""
    rng = random.Random(11)
    files, written = {}, []
    for rank in (0, 1, 10):
        path = tmp_path / f"rank{rank}.jsonl"
        with open(path, "w") as f:
            for step in range(4):
                evs = _events(rank, rng, rng.randrange(0, 30))
                written += evs
                f.write(chunk_line(rank, step, evs))
        files[rank] = path
    with open(files[1], "a") as f:  # a cut line, then a whole one that must not count
        f.write(chunk_line(1, 4, _events(1, rng, 3))[:25] + chunk_line(1, 5, _events(1, rng, 3)))

    def extra(ev: dict[str, Any]) -> dict[str, Any] | None:
        return {"nccl": {"algorithm": "Ring", "rank": ev["pid"]}} if ev["args"]["bytes"] % 2 else None

    out = tmp_path / "trace.json"
    with open(out, "w") as f:
        steps = write_merged(f, files, comm_extra=extra, extra_events=[{"name": "fault", "ph": "i"}], partial=True)
    doc = json.loads(out.read_text())
    assert steps == {0: 4, 1: 4, 10: 4}
    assert doc["otherData"] == {"partial": True, "steps_traced": {"0": 4, "1": 4, "10": 4}}
    assert doc["displayTimeUnit"] == "ns"
    want = []
    for ev in written:
        if ev["cat"] == "comm" and extra(ev):
            ev = {**ev, "args": {**ev["args"], **extra(ev)}}
        want.append(ev)
    assert sorted(map(_key, doc["traceEvents"])) == sorted(map(_key, [*want, {"name": "fault", "ph": "i"}]))


def test_merge_trace_of_a_recorders_steps_removes_its_chunks(tmp_path: Path):
    """The run directory's merge over a real recorder: steps, ops and a collective, then the files are gone."""
    out = tmp_path / "run"
    for rank in (0, 1):
        r = TraceRecorder(rank)
        for step in range(3):
            r.op("aten.mm", step * 10_000, step * 10_000 + 4_000)
            r.comm(f"all_reduce#{step}", step * 10_000 + 4_000, step * 10_000 + 9_000, {"bytes": 8, "group": [0, 1]})
            r.step(step, step * 10_000, step * 10_000 + 9_000)
            r.append_to(out / "trace" / f"rank{rank}.jsonl", step)
    doc = json.loads(run_dir.merge_trace(out).read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * 3 * 3 and "otherData" not in doc
    assert sorted(e["dur"] for e in spans if e["cat"] == "comm") == [5.0] * 6
    assert not (out / "trace").exists() and run_dir.merge_trace(out) is None


def test_trace_steps_keeps_the_first_steps_ops_and_every_steps_span(tmp_path: Path):
    """A rank session with `trace_steps=2` over 5 steps of 3 ops: the compute spans of steps 0-1 (6), the step
    spans of all 5; a session with 0 keeps all 15 ops."""
    from phantora.perfmodel.gpus import get_gpu
    from phantora.runtime.compute import OpCost, Roofline
    from phantora.runtime.nonet import NoNetworkClient
    from phantora.runtime.session import RankSession

    for cap, ops in ((2, 6), (0, 15), (9, 15)):
        out = tmp_path / f"cap{cap}"
        s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), out_dir=out, trace_steps=cap)
        for _ in range(5):
            for _ in range(3):
                s.charge("aten.mm", OpCost(flops=0, nbytes=0, dtype="", ns=1_000))
            s.step()
        doc = json.loads(run_dir.merge_trace(out).read_text())
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert sum(e["cat"] == "compute" for e in spans) == ops, cap
        assert sum(e["cat"] == "step" for e in spans) == 5
        assert max(e["ts"] for e in spans if e["cat"] == "compute") < (cap or 5) * 3.0  # 1 us ops, 3 a step


def test_a_negative_trace_steps_is_refused_naming_the_option(tmp_path: Path):
    from phantora.errors import InputError
    from phantora.launcher import RunConfig, launch

    cfg = RunConfig(script="examples/cuda_ddp.py", topology="testbed16", nproc=2, trace_steps=-1)
    try:
        launch(cfg)
    except InputError as exc:
        assert "--trace-steps" in str(exc)
    else:
        raise AssertionError("a negative --trace-steps ran")


def _span_dict(name: Any, pid: int, start: Any, end: Any) -> dict[str, Any]:
    """A compute op's event as the trace format defines it (times in µs)."""
    return {
        "name": name,
        "cat": "compute",
        "ph": "X",
        "pid": pid,
        "tid": 1,
        "ts": start / 1000,
        "dur": (end - start) / 1000,
    }


def test_a_recorders_chunk_is_json_dumps_of_its_events_with_ops_formatted_as_text(tmp_path: Path):
    """append_to formats compute ops as text (trace_json.py): the line must be json.dumps of the same events."""
    rng = random.Random(11)
    names = ["aten::mm", 'a "quoted" \\ name', "caf\u00e9 \u2028 \u2713", "nccl launch"]
    for level in ("ops", "coarse"):
        for n in (0, 1, 9, 300):
            rec, path = TraceRecorder(3, level), tmp_path / f"r{level}{n}.jsonl"
            ops: list[tuple[Any, Any, Any]] = []
            t = rng.randrange(10**13)
            for i in range(n):
                end = t + rng.randrange(10**8)
                ops.append((rng.choice(names), t, end if i % 50 else float(end)))  # a float time: json's own path
                t = end + rng.randrange(3) * rng.randrange(10**4)  # some ops back to back (one coarse block)
            for op in ops:
                rec.op(*op)
            rec.step(0, 0, t)
            rec.comm("all_reduce", 5, t, {"bytes": 8})
            rec.io("ckpt", t, t + 9, {"bytes": 1})
            rec.append_to(path, 0)
            line = path.read_text()
            events = json.loads(line)["events"]
            got_ops = [ev for ev in events if ev.get("cat") == "compute"]
            if level == "ops":
                assert got_ops == [_span_dict(name, 3, s, e) for name, s, e in ops]
            want = {"rank": 3, "step": 0, "comm": json.loads(line)["comm"], "events": events}
            assert line == json.dumps(want) + "\n"  # the encoder's own text, byte for byte
