"""`phantora compare`: metrics recomputed independently from the runs' own files, missing files as "-"."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from phantora.cli import main
from phantora.errors import InputError
from phantora.report.compare import compare_runs, format_table, load_and_compare, summarise
from phantora.report.fabric import pause_intervals
from phantora.results.read import load_run

WORKLOAD = """
name = "ar-a2a"
[[op]]
name = "ar"
kind = "all_reduce"
bytes = "64MiB"
ranks = "all"
algorithm = "ring"
[[op]]
name = "a2a"
kind = "all_to_all"
bytes = "8MiB"
ranks = "all"
after = ["ar"]
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same workload, flow mode, on star8 (non-blocking) and twoleaf8 (4:1 across leaves)."""
    root = tmp_path_factory.mktemp("cmp")
    wl = root / "ar.toml"
    wl.write_text(WORKLOAD)
    dirs = []
    for topo in ("star8", "twoleaf8"):
        out = root / topo
        assert main(["replay", str(wl), "--topology", topo, "--network", "flow", "--out", str(out)]) == 0
        dirs.append(out)
    return dirs[0], dirs[1]


def _flows(d: Path) -> tuple[np.ndarray, np.ndarray]:
    with (d / "flows.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["size_bytes"]) > 0]
    fct = np.array([int(r["fct_ns"]) for r in rows], dtype=float)
    alone = np.array([int(r["standalone_fct_ns"]) for r in rows], dtype=float)
    return fct, alone


def _expected(d: Path) -> dict[str, float]:
    """The comparison's figures, recomputed from the run's own files with csv/json/numpy."""
    res = json.loads((d / "results.json").read_text())
    fct, alone = _flows(d)
    slow = fct[alone > 0] / alone[alone > 0]
    with (d / "links.csv").open() as fh:
        util = [float(r["utilisation"]) for r in csv.DictReader(fh)]
    out = {
        "time_ns": res["makespan_ns"],
        "fct_p50_ns": np.percentile(fct, 50),
        "fct_p99_ns": np.percentile(fct, 99),
        "fct_max_ns": fct.max(),
        "slowdown_p50": np.percentile(slow, 50),
        "slowdown_p99": np.percentile(slow, 99),
        "slowdown_max": slow.max(),
        "util_mean": float(np.mean(util)),
        "util_max": max(util),
    }
    out.update({f"op:{op['name']}": op["duration_ns"] for op in res["ops"]})
    return out


def test_percent_differences_match_the_runs_files(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_runs
    _, cmp = load_and_compare([a, b])
    ea, eb = _expected(a), _expected(b)
    for key in ea:
        m = cmp.metric(key)
        assert m.values[0] == pytest.approx(ea[key], rel=1e-9), key
        assert m.values[1] == pytest.approx(eb[key], rel=1e-9), key
        assert m.diff_pct[0] == 0.0
        assert m.diff_pct[1] == pytest.approx((eb[key] - ea[key]) / ea[key] * 100, rel=1e-9, abs=1e-9), key
    # The all-to-all crosses a 4:1 oversubscribed spine on twoleaf8: it must be slower there.
    assert cmp.metric("op:a2a").diff_pct[1] > 50
    # A ring all-reduce of S bytes on 8 ranks at 100 Gb/s takes at least 2(n-1)/n * S / B.
    ring = 2 * 7 / 8 * 64 * 2**20 * 8 / 100e9 * 1e9
    assert ring <= cmp.metric("op:ar").values[0]
    # ... and, under the ideal model (line rate, no protocol, no latency), no more than 1% over it. An op's own
    # `algorithm` replaces the command's options (model included), so the ideal run leaves it out: the ideal
    # model's auto all-reduce is the ring.
    wl = tmp_path / "ar.toml"
    wl.write_text(WORKLOAD.replace('algorithm = "ring"\n', ""))
    ideal = ["--collective-model", "ideal"]
    assert main(["replay", str(wl), "--topology", "star8", *ideal, "--out", str(tmp_path / "ideal")]) == 0
    _, cmp = load_and_compare([tmp_path / "ideal"])
    assert ring <= cmp.metric("op:ar").values[0] <= ring * 1.01


def test_table_shows_diffs_and_dashes_for_flow_mode(two_runs: tuple[Path, Path], capsys) -> None:
    a, b = two_runs
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    lines = {ln.split("  ")[0].strip(): ln for ln in text.splitlines()}
    diff = (_expected(b)["time_ns"] - _expected(a)["time_ns"]) / _expected(a)["time_ns"] * 100
    assert f"{diff:+.1f}%" in lines["makespan"]
    # A flow-mode run has no PFC trace, queue samples or ECN counters: "-", not 0 and not a crash.
    for label in ("PFC paused time (all ports)", "queue depth max", "ECN marks", "CNPs"):
        cells = lines[label].split()
        assert cells[-3:] == ["-", "-", "-"], lines[label]


def test_missing_files_are_not_measured(two_runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, _ = two_runs
    partial = tmp_path / "partial"
    shutil.copytree(a, partial)
    (partial / "flows.csv").unlink()
    (partial / "links.csv").unlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    runs, cmp = load_and_compare([a, partial, empty])
    assert runs[1].flows is None and runs[1].links is None
    fct = cmp.metric("fct_p50_ns")
    assert fct.values[1] is None and fct.diff_pct[1] is None
    assert cmp.metric("time_ns").values[1] == cmp.metric("time_ns").values[0]  # results.json still there
    assert all(m.values[2] is None for m in cmp.metrics)
    assert main(["compare", str(a), str(partial), str(empty), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    fct_line = next(ln for ln in out.splitlines() if ln.startswith("FCT p50"))
    assert fct_line.split()[-4:] == ["-", "-", "-", "-"]
    data = json.loads((tmp_path / "rep" / "compare.json").read_text())
    row = next(m for m in data["metrics"] if m["key"] == "fct_p50_ns")
    assert row["values"][1] is None and row["values"][2] is None
    assert "| FCT p50 |" in (tmp_path / "rep" / "compare.md").read_text()


def test_bad_inputs_name_the_file(tmp_path: Path, capsys) -> None:
    assert main(["compare", str(tmp_path / "nope")]) == 2
    assert "nope: not a run directory" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "flows.csv").write_text("flow_id,size_bytes,start_ns,fct_ns\n1,100,0,5\n2,100,zero,5\n")
    with pytest.raises(InputError) as err:
        load_run(bad)
    assert err.value.file == str(bad / "flows.csv") and err.value.line == 3 and err.value.field == "start_ns"
    (bad / "flows.csv").unlink()
    (bad / "results.json").write_text('{"schema": "phantora.replay/1",\n "makespan_ns": }')
    with pytest.raises(InputError) as err:
        load_run(bad)
    assert err.value.line == 2
    (bad / "results.json").unlink()
    head = "time_ns,node,node_id,port,peer,prio,bytes\n"
    (bad / "queues.csv").write_text(
        head + "0,leaf0,4,1,host0,3,10\n100,leaf0,4,1,host0,3,2.0e3\n200,leaf0,4,1,host0,3,\n"
    )
    with pytest.raises(InputError) as err:  # a whole column is read at once; a bad cell is still named by its line
        load_run(bad)
    assert err.value.file == str(bad / "queues.csv") and (err.value.line, err.value.field) == (4, "bytes")
    (bad / "queues.csv").write_text(head + "0,leaf0,4,1,,3,10\n100,leaf0,4,1,host0,3,2.0e3\n")
    run = load_run(bad)
    assert run.queues is not None and run.queues[:, 4].tolist() == [10, 2000]  # "2.0e3" read as a number
    assert run.node_names == {4: "leaf0"} and run.port_peers == {(4, 1): "host0"}  # the first peer named


def test_pfc_pause_time_and_queue_percentiles(tmp_path: Path) -> None:
    """Hand-made ns-3 traces: paused time is the sum of pause-to-resume gaps; p99 at the hottest port."""
    d = tmp_path / "ns3run"
    d.mkdir()
    (d / "results.json").write_text(
        json.dumps(
            {
                "schema": "phantora.replay/1",
                "makespan_ns": 10_000,
                "network": "ns3",
                "ops": [],
                "engine": {"ecn_marks": 7, "cnps": 5, "drops": 0, "pfc_pause": 4},
            }
        )  # fmt: skip
    )
    pfc = [
        (100, 1, 0, 3, 1),
        (300, 1, 0, 3, 0),  # node 1 port 0: 200 ns
        (500, 1, 0, 3, 1),
        (550, 1, 0, 3, 1),  # a second pause while paused only extends it
        (900, 1, 0, 3, 0),  # +400 ns
        (950, 1, 0, 3, 0),  # a resume while running is ignored
        (2_000, 2, 1, 3, 1),  # node 2 port 1: still paused at the end of the run (10 us): 8000 ns
    ]
    (d / "pfc.csv").write_text(
        "time_ns,node,node_type,port,prio,pause,from_node\n"
        + "".join(f"{t},{n},1,{p},{q},{x},9\n" for t, n, p, q, x in pfc)
    )
    rng = np.random.default_rng(7)
    hot = rng.integers(0, 400_000, 200)
    rows = [(i * 100, 8, 2, 3, int(v)) for i, v in enumerate(hot)]
    rows += [(i * 100, 8, 2, 1, 1000) for i in range(200)]  # a second class on the same port adds up
    rows += [(i * 100, 8, 5, 3, 1000) for i in range(200)]  # a cooler port
    (d / "queues.csv").write_text(
        "time_ns,node,port,prio,bytes\n" + "".join(f"{t},{n},{p},{q},{b}\n" for t, n, p, q, b in rows)
    )
    run = load_run(d)
    s = summarise(run)
    assert s["pfc_pauses"] == 4  # frames with pause=1
    assert s["pfc_paused_ns"] == 200 + 400 + 8000
    assert s["queue_max_bytes"] == int(hot.max()) + 1000
    assert s["queue_p99_bytes"] == pytest.approx(np.percentile(hot + 1000, 99))
    assert s["ecn_marks"] == 7 and s["cnps"] == 5
    assert pause_intervals(run.pfc, run.end_ns)[(1, 0)] == [(100, 300), (500, 900)]
    cmp = compare_runs([run])
    assert cmp.per_link["pfc_paused_ns"] == {"node 1 port 0": [600], "node 2 port 1": [8000]}


def test_live_run_iteration_time_and_trace(tmp_path: Path) -> None:
    """iteration_ns: the steady-state mean (every step but the first); the trace gives per-rank spans."""
    d = tmp_path / "live"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"schema": "phantora.run/1", "iteration_ns": [900, 1000, 1200]}))
    events = [
        {"name": "step 0", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 1.0},
        {"name": "mm", "cat": "compute", "ph": "X", "pid": 0, "tid": 1, "ts": 0.0, "dur": 0.6},
        {"name": "all_reduce", "cat": "comm", "ph": "X", "pid": 1, "tid": 2, "ts": 0.6, "dur": 0.4},
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}},
    ]
    (d / "trace.json").write_text(json.dumps({"traceEvents": events}))
    run = load_run(d)
    assert run.time_kind == "iteration" and run.time_ns == 1100
    assert [(s.rank, s.lane, s.start_ns, s.end_ns) for s in run.spans] == [
        (0, "compute", 0, 600),
        (0, "step", 0, 1000),
        (1, "comm", 600, 1000),
    ]
    cmp = compare_runs([run])
    assert cmp.metric("time_ns").label == "iteration time"


def test_live_run_written_by_phantora_run(tmp_path: Path) -> None:
    """The results.json that `phantora run` writes (results.summary.summarize) and the bridge's cosim.json."""
    from phantora.perfmodel.gpus import get_gpu
    from phantora.results.summary import summarize

    ranks = {
        0: {"step_ends_ns": [100, 250, 330], "end_ns": 330, "comm": {"all_reduce": {"count": 3, "busy_ns": 90}}},
        1: {"step_ends_ns": [120, 240, 360], "end_ns": 360, "comm": {"all_reduce": {"count": 3, "busy_ns": 120}}},
    }
    summary = summarize(ranks, get_gpu("h100"))
    data = {"run": {"network": "ns3"}, **summary, "network": {"makespan_ns": 360, "engine_stats": {"cnps": 3}}}
    d = tmp_path / "live"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(data))
    run = load_run(d)
    # Steps end when the slowest rank ends them: 120, 250, 360 -> 120, 130, 110 ns; steady mean (130 + 110) / 2.
    assert run.kind == "run" and run.time_kind == "iteration" and run.time_ns == 120
    assert run.network == "ns3" and run.engine == {"cnps": 3} and run.sim_end_ns == 360
    assert run.collectives == {"all_reduce": 40}  # the slower rank: 120 ns over 3 calls
    records = [
        {"name": "all_reduce#0", "kind": "all_reduce", "t_start": 10, "end_ns": 60},
        {"name": "all_reduce#0", "kind": "all_reduce", "t_start": 200, "end_ns": 270},
        {"name": "broadcast#1", "kind": "broadcast", "t_start": 0, "end_ns": 5},
    ]
    (d / "cosim.json").write_text(json.dumps({"collectives": records}))
    assert load_run(d).collectives == {"all_reduce#0": 60, "broadcast#1": 5}
    only = tmp_path / "cosim-only"
    only.mkdir()
    cosim = {"network": "flow", "makespan_ns": 360, "ranks": {str(r): v for r, v in ranks.items()}}
    (only / "cosim.json").write_text(json.dumps(cosim))
    assert load_run(only).time_ns == 120  # the same steps, from the ranks' step ends


def test_a_long_live_runs_all_to_all_pairs_are_its_all_to_alls_and_a_group_of_one_is_no_call(tmp_path: Path) -> None:
    """Past MAX_NAMED_OPS names a live run's collectives are averaged per kind; an all-to-all's records are its
    pairs (kind `send_recv`, named `all_to_all#k@0.1`, as Megatron's alltoall token dispatcher's on EP 2), which
    make the `op all_to_all` row, not `op send_recv`; a pipeline's own sends stay `send_recv`."""
    from phantora.results.read import MAX_NAMED_OPS

    pairs = [
        {"name": f"all_to_all#{k}@0.1", "kind": "send_recv", "t_start": 0, "end_ns": 10 + 10 * (k % 2)}
        for k in range(MAX_NAMED_OPS)
    ]
    sends = [{"name": f"send#{k}", "kind": "send_recv", "t_start": 0, "end_ns": 40} for k in range(2)]
    reduces = [{"name": "all_reduce#0", "kind": "all_reduce", "group": [0, 1], "t_start": 0, "end_ns": 30}]
    reduces += [{"name": "all_reduce#0", "kind": "all_reduce", "group": [r], "t_start": 5, "end_ns": 5} for r in (0, 1)]
    d = tmp_path / "live"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"run": {"network": "flow"}, "steps": []}))
    (d / "cosim.json").write_text(json.dumps({"collectives": pairs + sends + reduces}))
    # a group of one rank (Megatron's distributed optimizer with DP 1) makes no call: not averaged in as 0
    assert load_run(d).collectives == {"all_to_all": 15, "send_recv": 40, "all_reduce": 30}


def test_the_run_table_shows_the_settings_that_differ(tmp_path: Path, capsys) -> None:
    """From each run's config.json: the options and packet fields whose values differ, nothing else."""
    wl = tmp_path / "ar.toml"
    wl.write_text(WORKLOAD)
    dirs = []
    for name, extra in (("one", ["--channels", "1"]), ("two", ["--channels", "2"])):
        dirs.append(tmp_path / name)
        assert main(["replay", str(wl), "-t", "star8", *extra, "--out", str(dirs[-1])]) == 0
    _, cmp = load_and_compare(dirs)
    assert [r["settings"] for r in cmp.runs] == [{"channels": "1"}, {"channels": "2"}]
    assert [(r["network"], r["cc"], r["status"], r["partial"]) for r in cmp.runs] == [
        ("flow", None, "complete", False)
    ] * 2
    capsys.readouterr()
    assert main(["compare", *map(str, dirs), "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    assert "one: replay, network flow, cc -, complete; channels=1" in capsys.readouterr().out
    md = (tmp_path / "rep" / "compare.md").read_text()
    assert "| run | kind | network | cc | status | channels | path | files |" in md
    assert "| two | replay | flow | - | complete | 2 |" in md


@pytest.mark.ns3
def test_the_run_table_shows_the_cc_and_the_packet_settings_with_defaults(ns3_lib, tmp_path: Path) -> None:
    flows = tmp_path / "incast.txt"
    flows.write_text("2\n1 0 3 100 200000 0\n2 0 3 100 200000 0\n")
    a, b = tmp_path / "dcqcn", tmp_path / "hpcc"
    assert main(["netsim", "--network", "ns3", "-t", "star8", "-f", str(flows), "--cc", "dcqcn", "-o", str(a)]) == 0
    ns3 = ["netsim", "--network", "ns3", "-t", "star8", "-f", str(flows)]
    assert main([*ns3, "--cc", "hpcc", "--set", "buffer_bytes=1000000", "--queue-sample-ns", "0", "-o", str(b)]) == 0
    _, cmp = load_and_compare([a, b])
    assert [r["cc"] for r in cmp.runs] == ["dcqcn", "hpcc"]
    settings = [r["settings"] for r in cmp.runs]
    assert settings == [
        {"buffer_bytes": "default", "queue_sample_ns": "1000"},
        {"buffer_bytes": "1000000", "queue_sample_ns": "0"},
    ]


@pytest.mark.ns3
def test_the_run_table_carries_the_engine_warnings(ns3_lib, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run whose switch has no shared buffer (star8's one 100G switch: 8 x 37,500 B headroom + 8 x 4,096 B reserve =
    332,768 B, over a 300 KB buffer) has its engine.json warning under its run line, in compare.md and
    compare.json; the default buffer's run has none."""
    flows = tmp_path / "incast.txt"
    flows.write_text("2\n1 0 3 100 200000 0\n2 0 3 100 200000 0\n")
    ns3 = ["netsim", "--network", "ns3", "-t", "star8", "-f", str(flows), "--cc", "dcqcn", "-q", "-o"]
    a, b = tmp_path / "default", tmp_path / "small"
    assert main([*ns3, str(a)]) == 0 and main([*ns3, str(b), "--set", "buffer_bytes=300000"]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out.splitlines()
    at = printed.index(next(line for line in printed if line.startswith("  small: netsim")))
    assert printed[at + 1].startswith("    warning: buffer_bytes=300,000 leaves switch8 no shared buffer")
    assert "332,768 B" in printed[at + 1] and not any("warning" in line for line in printed[:at])
    doc = json.loads((tmp_path / "rep" / "compare.json").read_text())
    assert [len(r["warnings"]) for r in doc["runs"]] == [0, 1]
    assert f"small: warning: {doc['runs'][1]['warnings'][0]}" in (tmp_path / "rep" / "compare.md").read_text()


def _links_run(root: Path, name: str, network: str, row: str) -> Path:
    """A run directory of a config.json naming `network` and a links.csv of one link, `row`."""
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"options": {"network": network}}))
    head = (
        "channel,link,from,to,from_id,to_id,bandwidth_bps,bytes,utilisation,packets,paused_ns,ecn_marks,max_queue_bytes"
    )
    (d / "links.csv").write_text(f"{head}\n{row}\n")
    return d


def test_flow_and_packet_utilisation_are_said_to_count_different_bytes(tmp_path: Path) -> None:
    """The user trial's gpu14->nvsw1 of 16-rank torchtitan: 346,839,840 B of payload in flow mode, and with DCQCN
    704,802 packets of 48 header bytes more, 380,670,336 B; the table says the two count different bytes, and says
    nothing when the runs are all of one network."""
    from phantora.report.compare import WIRE_BYTES, to_markdown

    assert 346_839_840 + 704_802 * 48 == 380_670_336
    flow = _links_run(tmp_path, "flow", "flow", "28,14,gpu14,nvsw1,14,17,3600000000000,346839840,0.031767,,,,")
    ns3 = _links_run(tmp_path, "dcqcn", "ns3", "28,14,gpu14,nvsw1,14,17,3600000000000,380670336,0.034837,704802,0,0,0")
    both = compare_runs([load_run(flow), load_run(ns3)])
    assert f"({WIRE_BYTES})" in format_table(both)
    assert f"{WIRE_BYTES}." in to_markdown(both)
    alone = compare_runs([load_run(ns3), load_run(ns3)])
    assert WIRE_BYTES not in format_table(alone) and WIRE_BYTES not in to_markdown(alone)
