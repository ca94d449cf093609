"""Several jobs on one fabric, end to end (`phantora.jobs.run.launch_jobs`, the flow engine).

Closed forms (every link B = 100 Gb/s, 1 us): a 2-rank ring all-reduce of S bytes across one spine crosses 4
links and takes ceil(S*8/B) + 4 us alone; two such jobs meeting on a 2:1 leaf uplink get B/2 each by max-min,
ceil(2*S*8/B) + 4 us. Those are the ideal collective model's (line rate, no protocol, no latency): the tests
checking them select it (IDEAL). Jobs on disjoint halves of a non-blocking fabric share no link, so each runs
exactly as it does alone, to the ns, under the default (NCCL) model too. The fast tests use recorded (workload)
jobs; the slow ones live DDP jobs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.jobs import JobProcs
from bridge.run import CosimRun
from phantora.collectives.spec import AlgoOptions
from phantora.jobs.run import launch_jobs
from phantora.jobs.spec import parse_jobs
from phantora.launcher import RunConfig
from phantora.netsim.cli_config import engine_spec_from_flags
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

B = 100 * 10**9
LAT = 1000
S = 4 * 2**20
IDEAL = AlgoOptions(model="ideal")  # the closed forms above are the ideal model's

ALLREDUCES = f"""
name = "ar"
[[op]]
name = "ar"
kind = "all_reduce"
bytes = {S}
ranks = "all"
repeat = 3
gap = "20us"
"""


def two_to_one() -> Topology:
    """2 leaves x 2 GPUs, one spine, every link B: a leaf's uplink is shared 2:1."""
    return leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="two-to-one")


def non_blocking() -> Topology:
    """4 leaves x 2 GPUs, 2 spines at B: every leaf has as much uplink as downlink."""
    return leaf_spine(4, 2, 2, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="nb8")


def jobs_file(tmp_path: Path, body: str) -> Any:
    (tmp_path / "ar.toml").write_text(ALLREDUCES)
    return parse_jobs(body, str(tmp_path / "jobs.toml"), tmp_path)


def run(
    tmp_path: Path, spec: Any, topo: Topology, name: str, alone: bool = True, algo: AlgoOptions | None = None
) -> Any:
    cfg = RunConfig(script="", topology=topo, out_dir=tmp_path / name, trace="none")
    return launch_jobs(spec, cfg, alone=alone, algo=algo)


def job_doc(out: Path, job: str) -> dict[str, Any]:
    return json.loads((out / "jobs" / job / "results.json").read_text())


def test_recorded_jobs_on_a_shared_uplink_slow_down_as_max_min_predicts(tmp_path: Path) -> None:
    spec = jobs_file(
        tmp_path,
        '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = [0, 2]\n'
        '[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 2\nplacement = [1, 3]\n',
    )
    rep = run(tmp_path, spec, two_to_one(), "shared", algo=IDEAL)
    alone_ns = -(-S * 8 * 10**9 // B) + 4 * LAT
    shared_ns = -(-2 * S * 8 * 10**9 // B) + 4 * LAT
    for name in ("a", "b"):
        ops = rep.jobs[name]["collectives"]
        assert [op["end_ns"] - op["t_start"] for op in ops] == [shared_ns] * 3
        alone = job_doc(tmp_path / "shared" / "alone" / name, name)["collectives"]
        assert [op["end_ns"] - op["t_start"] for op in alone] == [alone_ns] * 3
        row = next(r for r in rep.summary["jobs"] if r["name"] == name)
        span_shared, span_alone = 3 * shared_ns + 3 * 20_000, 3 * alone_ns + 3 * 20_000
        assert (row["time_ns"], row["alone_time_ns"]) == (span_shared, span_alone)
        assert row["slowdown"] == pytest.approx(span_shared / span_alone)
    # links_by_job.csv: each job put S bytes per all-reduce on leaf 0's uplink (GPUs 0-3, leaves 4-5, spine 6)
    rows = (tmp_path / "shared" / "links_by_job.csv").read_text().splitlines()
    up = [r.split(",") for r in rows[1:] if r.split(",")[2:4] == ["leaf0", "spine0"]]
    assert sorted((r[7], int(r[8])) for r in up) == [("a", 3 * S), ("b", 3 * S)]


def test_recorded_jobs_on_disjoint_halves_run_exactly_as_alone(tmp_path: Path) -> None:
    # a on leaves 0-1, b on leaves 2-3: both cross the spines, on links of their own
    spec = jobs_file(
        tmp_path,
        '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 4\nplacement = "0-3"\n'
        '[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 4\nplacement = "4-7"\n',
    )
    rep = run(tmp_path, spec, non_blocking(), "halves")
    for name in ("a", "b"):
        shared = rep.jobs[name]["collectives"]
        alone = job_doc(tmp_path / "halves" / "alone" / name, name)["collectives"]
        assert shared == alone
        row = next(r for r in rep.summary["jobs"] if r["name"] == name)
        assert row["slowdown"] == 1.0


def test_a_later_start_and_steps_of_a_recorded_job(tmp_path: Path) -> None:
    spec = jobs_file(
        tmp_path, '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = [0, 2]\nstart = "1ms"\nsteps = 2\n'
    )
    rep = run(tmp_path, spec, two_to_one(), "late", alone=False, algo=IDEAL)
    one = -(-S * 8 * 10**9 // B) + 4 * LAT
    step = 3 * (one + 20_000)
    doc = rep.jobs["a"]
    assert doc["start_ns"] == 1_000_000
    assert [s["end_ns"] for s in doc["steps"]] == [1_000_000 + step, 1_000_000 + 2 * step]
    assert doc["step_time_ns"]["mean"] == step


def test_live_replay_ranks_in_the_coordinator_match_the_closed_form(tmp_path: Path) -> None:
    """The same two jobs as rank processes (phantora.egraph.replay_rank) through one coordinator: each job has its own
    world, and their all-reduces share the uplink exactly as in the in-process replay."""
    (tmp_path / "ar.toml").write_text(ALLREDUCES)
    cmd = [sys.executable, "-m", "phantora.egraph.replay_rank", str(tmp_path / "ar.toml")]
    topo = two_to_one().with_rank_order([0, 2, 1, 3])
    jobs = [JobProcs("a", 2, cmd), JobProcs("b", 2, cmd)]
    res = CosimRun(topo, jobs=jobs, all_or_nothing=False, algo=IDEAL).run()
    shared_ns = -(-2 * S * 8 * 10**9 // B) + 4 * LAT
    assert [j["status"] for j in res.jobs] == ["complete", "complete"]
    for rec in res.collectives:
        assert rec["end_ns"] - rec["t_start"] == shared_ns
    assert sorted({tuple(r["group"]) for r in res.collectives}) == [(0, 1), (2, 3)]


def test_one_failing_job_ends_alone(tmp_path: Path) -> None:
    (tmp_path / "ar.toml").write_text(ALLREDUCES)
    good = [sys.executable, "-m", "phantora.egraph.replay_rank", str(tmp_path / "ar.toml")]
    bad = [sys.executable, "-c", "import sys; sys.exit(7)"]
    res = CosimRun(two_to_one(), jobs=[JobProcs("a", 2, good), JobProcs("b", 2, bad)], all_or_nothing=False).run()
    assert [j["status"] for j in res.jobs] == ["complete", "failed"]
    assert "exited (code 7)" in res.jobs[1]["error"]["text"]
    assert all(res.ranks[r] is not None for r in (0, 1)) and res.ranks.get(2) is None


GPT = "--steps 3 --d-model 64 --layers 2 --seq 64 --batch 2"


@pytest.mark.slow
def test_live_ddp_jobs_on_disjoint_halves_run_exactly_as_alone(tmp_path: Path) -> None:
    body = "".join(
        f'[[job]]\nname = "{n}"\nscript = "gpt_ddp.py"\nargs = "{GPT}"\nranks = 4\nplacement = "{p}"\n'
        for n, p in (("a", "0-3"), ("b", "4-7"))
    )
    rep = run(tmp_path, parse_jobs(body, "jobs.toml", tmp_path), non_blocking(), "ddp")
    for name in ("a", "b"):
        row = next(r for r in rep.summary["jobs"] if r["name"] == name)
        assert row["status"] == "complete" and row["slowdown"] == 1.0
        shared, alone = rep.jobs[name], job_doc(tmp_path / "ddp" / "alone" / name, name)
        assert [s["end_ns"] for s in shared["steps"]] == [s["end_ns"] for s in alone["steps"]]
        assert shared["collectives"] == alone["collectives"]


@pytest.mark.slow
def test_live_ddp_jobs_on_a_shared_uplink_slow_down_as_max_min_predicts(tmp_path: Path) -> None:
    # one DDP bucket: one gradient all-reduce per step, issued by both jobs at the same time (same compute)
    body = "".join(
        f'[[job]]\nname = "{n}"\nscript = "gpt_ddp.py"\nargs = "{GPT} --bucket-mb 1000"\nranks = 2\nplacement = {p}\n'
        for n, p in (("a", "[0, 2]"), ("b", "[1, 3]"))
    )
    rep = run(tmp_path, parse_jobs(body, "jobs.toml", tmp_path), two_to_one(), "ddp", alone=False, algo=IDEAL)
    grads = [c for c in rep.jobs["a"]["collectives"] if c["kind"] == "all_reduce"]
    assert len(grads) >= 3
    cosim = json.loads((tmp_path / "ddp" / "cosim.json").read_text())
    checked = 0
    for rec in cosim["collectives"]:
        if rec["kind"] != "all_reduce" or rec["nbytes"] < 4096:
            continue
        flows = [r for r in cosim["collectives"] if r["kind"] == "all_reduce" and r["t_start"] == rec["t_start"]]
        assert len(flows) == 2  # the other job's twin all-reduce started at the same ns
        # two ring channels of nbytes/2 per direction share the uplink with the twin's: B/4 each
        want = -(-2 * rec["nbytes"] * 8 * 10**9 // B) + 4 * LAT
        assert rec["end_ns"] - rec["t_start"] == want, rec
        checked += 1
    assert checked >= 6  # 3 steps x 2 jobs


def test_replay_jobs_command_and_compare_alone_vs_shared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from phantora.cli import main
    from phantora.report.compare import compare_jobs

    (tmp_path / "ar.toml").write_text(ALLREDUCES)
    (tmp_path / "topo.toml").write_text(
        '[generator]\nkind = "leaf_spine"\nleaves = 2\nendpoints_per_leaf = 2\nspines = 1\nnic_rate = "100Gbps"\n'
        'uplink_rate = "100Gbps"\nlatency = "1us"\n'
    )
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = "spread"\n'
        '[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 2\nplacement = "spread"\n'
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "replay",
                "--topology",
                str(tmp_path / "topo.toml"),
                "--jobs",
                str(jobs),
                "--alone",
                "--out",
                str(out),
                "--collective-model",
                "ideal",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "2 jobs on topo" in printed and "2.000x" not in printed  # the spans include the gaps: below 2x
    span_shared = 3 * (-(-2 * S * 8 * 10**9 // B) + 4 * LAT + 20_000)
    span_alone = 3 * (-(-S * 8 * 10**9 // B) + 4 * LAT + 20_000)
    got = {name: cmp for name, _, cmp in compare_jobs(out)}
    assert sorted(got) == ["a", "b"]
    for cmp in got.values():
        assert cmp.metric("time_ns").values == [span_alone, span_shared]
        assert cmp.metric("job:bytes").values[0] == cmp.metric("job:bytes").values[1] == 3 * 2 * S * 4
    assert main(["compare", str(out)]) == 0
    assert "== job a: alone vs shared ==" in capsys.readouterr().out
    assert main(["replay", "--topology", "twoleaf8"]) == 2  # neither INPUT nor --jobs: a one-line error (input)
    assert "give one INPUT or --jobs FILE" in capsys.readouterr().err


def save_graph(tmp_path: Path) -> Path:
    """A recorded 2-rank job: 3 steps of 20 us compute, then an all-reduce of S bytes it waits for."""
    from phantora.egraph import ProgramBuilder, build_graph
    from phantora.egraph.format import save

    bs = []
    for r in range(2):
        b = ProgramBuilder(r)
        for _ in range(3):
            b.compute("fwd_bwd", 20_000)
            b.wait([b.collective("all_reduce", [0, 1], S)])
            b.step()
        bs.append(b)
    save(build_graph(bs), tmp_path / "graph")
    return tmp_path / "graph"


def test_a_recorded_graph_and_a_workload_share_the_uplink(tmp_path: Path) -> None:
    save_graph(tmp_path)
    spec = jobs_file(
        tmp_path,
        '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = [0, 2]\n'
        '[[job]]\nname = "g"\ngraph = "graph"\nplacement = [1, 3]\ntraffic_class = 5\n',
    )
    rep = run(tmp_path, spec, two_to_one(), "mixed", algo=IDEAL)
    shared_ns = -(-2 * S * 8 * 10**9 // B) + 4 * LAT
    alone_ns = -(-S * 8 * 10**9 // B) + 4 * LAT
    g = rep.jobs["g"]
    assert g["run"]["ranks"] == 2 and g["run"]["traffic_class"] == 5
    assert [s["time_ns"] for s in g["steps"]] == [20_000 + shared_ns] * 3
    row = next(r for r in rep.summary["jobs"] if r["name"] == "g")
    assert (row["time_ns"], row["alone_time_ns"]) == (20_000 + shared_ns, 20_000 + alone_ns)


def test_a_recorded_job_loads_the_network_under_a_live_job(tmp_path: Path) -> None:
    """The graph runs as a flow DAG inside the coordinator, beside the live ranks' collectives."""
    from phantora.jobs.recorded import merge, plan_recorded

    graph = save_graph(tmp_path)
    (tmp_path / "ar.toml").write_text(ALLREDUCES)
    topo = two_to_one()
    bg = parse_jobs(f'[[job]]\nname = "g"\ngraph = "{graph}"\n', "jobs.toml", tmp_path).jobs[0]
    rec = plan_recorded(bg, 1, topo, [1, 3], IDEAL)
    cmd = [sys.executable, "-m", "phantora.egraph.replay_rank", str(tmp_path / "ar.toml")]
    res = CosimRun(
        topo.with_rank_order([0, 2]), jobs=[JobProcs("a", 2, cmd)], background=merge([rec]), algo=IDEAL
    ).run()
    shared_ns = -(-2 * S * 8 * 10**9 // B) + 4 * LAT
    assert [r["end_ns"] - r["t_start"] for r in res.collectives] == [shared_ns] * 3
    doc = rec.results(rec.local(res.background), {})
    assert [s["time_ns"] for s in doc["steps"]] == [20_000 + shared_ns] * 3


@pytest.mark.slow
def test_a_live_job_starts_later_and_stops_after_its_steps(tmp_path: Path) -> None:
    body = f'[[job]]\nname = "a"\nscript = "gpt_ddp.py"\nargs = "{GPT}"\nranks = 2\nstart = "1ms"\nsteps = 2\n'
    rep = run(tmp_path, parse_jobs(body, "jobs.toml", tmp_path), two_to_one(), "late", alone=False)
    doc = rep.jobs["a"]
    assert doc["job"]["status"] == "complete" and doc["start_ns"] == 1_000_000
    assert len(doc["steps"]) == 2  # the script asked for 3
    assert doc["steps"][0]["time_ns"] == doc["steps"][0]["end_ns"] - 1_000_000
    lines = (tmp_path / "late" / "jobs" / "a" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(ln)["time_ns"] for ln in lines] == [s["time_ns"] for s in doc["steps"]]
    # each collective's group in the job's own ranks (DDP's 2 ranks), which `phantora compare` reads
    assert doc["collectives"] and {tuple(c["group"]) for c in doc["collectives"]} == {(0, 1)}


def test_two_multi_job_runs_compare_as_fabrics(tmp_path: Path) -> None:
    from phantora.report.compare import load_and_compare

    spec = jobs_file(tmp_path, '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = [0, 2]\n')
    run(tmp_path, spec, two_to_one(), "one", alone=False, algo=IDEAL)
    spec2 = jobs_file(
        tmp_path,
        '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = [0, 2]\n'
        '[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 2\nplacement = [1, 3]\n',
    )
    run(tmp_path, spec2, two_to_one(), "two", alone=False, algo=IDEAL)
    runs, cmp = load_and_compare([tmp_path / "one", tmp_path / "two"])
    assert [r.kind for r in runs] == ["jobs", "jobs"]
    span = 3 * (-(-S * 8 * 10**9 // B) + 4 * LAT + 20_000)
    span2 = 3 * (-(-2 * S * 8 * 10**9 // B) + 4 * LAT + 20_000)
    assert cmp.metric("time_ns").values == [span, span2]


@pytest.mark.ns3
@pytest.mark.slow
def test_packet_mode_jobs_on_disjoint_halves_run_exactly_as_alone(ns3_lib: Any, tmp_path: Path) -> None:
    """The same to-the-ns check with ns-3 and DCQCN: jobs that share no link do not see each other."""
    spec = jobs_file(
        tmp_path,
        '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 4\nplacement = "0-3"\n'
        '[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 4\nplacement = "4-7"\n',
    )
    ns3 = engine_spec_from_flags("ns3", cc="dcqcn")
    cfg = RunConfig(script="", topology=non_blocking(), engine=ns3, out_dir=tmp_path / "p")
    rep = launch_jobs(spec, cfg, alone=True)
    for name in ("a", "b"):
        assert rep.jobs[name]["collectives"] == job_doc(tmp_path / "p" / "alone" / name, name)["collectives"]
    assert [r["slowdown"] for r in rep.summary["jobs"]] == [1.0, 1.0]


@pytest.mark.ns3
def test_the_jobs_summary_carries_the_engines_warning(ns3_lib: Any, tmp_path: Path, capsys: Any) -> None:
    """A 100 kB buffer on two_to_one: each leaf's 3 ports (2 GPUs, 1 spine, all 100G over 1 us) take 3 x 37,500 B of
    PFC headroom (3 x rate x delay) and 3 x 4,096 B of reserve, 124,788 B, more than the buffer; the spine's 2 ports
    take 83,192 B and leave it a pool of 16,808 B, so one of its egress queues holds at most 2 x 4,096 + 2 x 37,500 +
    3,755 = 86,947 B (two ingresses filling the pool one after another: 17,898 // 9 = 1,988, then 15,910 // 9 = 1,767,
    17,898 the pool and a 1,090 B packet), under the 100G kmin of 400,000 B: the second warning, ECN never marks. The
    warnings are told when the engine is built, and the jobs' summary (printed and results.json), like a single run's,
    and each job's results.json network.warnings hold them."""
    from phantora.jobs.run import format_jobs

    (tmp_path / "small.toml").write_text(ALLREDUCES.replace(f"bytes = {S}", "bytes = 65536").replace("repeat = 3", ""))
    spec = jobs_file(
        tmp_path,
        '[[job]]\nname = "a"\nworkload = "small.toml"\nranks = 2\nplacement = [0, 2]\n'
        '[[job]]\nname = "b"\nworkload = "small.toml"\nranks = 2\nplacement = [1, 3]\n',
    )
    out = tmp_path / "w"
    cfg = RunConfig(
        script="", topology=two_to_one(), out_dir=out, trace="none",
        engine=engine_spec_from_flags("ns3", cc="dcqcn", sets=["buffer_bytes=100000"]),
    )  # fmt: skip
    rep = launch_jobs(spec, cfg, alone=False)
    warning, ecn = warnings = rep.summary["warnings"]
    assert "buffer_bytes=100,000 leaves leaf" in warning and "(and 1 other switch)" in warning
    assert f"take {3 * 37_500 + 3 * 4_096:,} B" in warning
    assert ecn.startswith("ECN never marks at 2 of spine") and "(86,947 B" in ecn
    err = capsys.readouterr().err
    assert all(err.count(f"phantora: warning: {w}") == 1 for w in warnings)  # at build; engine.json adds none
    assert f"\nwarning: {warning}" in format_jobs(rep.summary)
    assert json.loads((out / "results.json").read_text())["warnings"] == warnings
    assert job_doc(out, "a")["network"]["warnings"] == job_doc(out, "b")["network"]["warnings"] == warnings


@pytest.mark.ns3
def test_packet_mode_pfc_pauses_are_counted_per_job_from_pfc_csv(ns3_lib: Any, tmp_path: Path) -> None:
    """Two jobs meeting 2:1 on the leaf uplinks with a 200 kB switch buffer: the leaves PAUSE the GPUs' NICs.
    pfc.csv names its nodes; the per-job figures in results.json agree with a count made here from those
    names: a job suffers the pauses of its own GPUs' uplinks (gpuN -> leaf), and since both jobs send through
    each congested leaf uplink the whole time, each job causes every pause."""
    import csv

    spec = jobs_file(
        tmp_path,
        '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = [0, 2]\n'
        '[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 2\nplacement = [1, 3]\n',
    )
    out = tmp_path / "pfc"
    cfg = RunConfig(
        script="", topology=two_to_one(), out_dir=out, trace="none",
        engine=engine_spec_from_flags("ns3", cc="dcqcn", sets=["buffer_bytes=200000"]),
    )  # fmt: skip
    rep = launch_jobs(spec, cfg, alone=False)
    with (out / "pfc.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    frames = [r for r in rows if r["pause"] == "1"]
    assert frames, "the small buffer should make the leaves send PFC pauses"
    assert {r["node"][:3] for r in rows} == {"gpu"} and {r["from_node"][:4] for r in rows} == {"leaf"}
    # pause spans per paused port (a pause while paused extends the span), by node name
    spans: dict[str, int] = {}
    paused = set()
    for r in sorted(rows, key=lambda r: int(r["time_ns"])):
        key = (r["node"], r["port"], r["prio"])
        if r["pause"] == "1" and key not in paused:
            paused.add(key)
            spans[r["node"]] = spans.get(r["node"], 0) + 1
        elif r["pause"] == "0":
            paused.discard(key)
    fabric = rep.summary["fabric"]
    assert fabric["pfc_pauses"] == len(frames)
    total = sum(spans.values())
    for job in rep.summary["jobs"]:
        mine = fabric["jobs"][job["name"]]
        assert mine["pauses_suffered"] == sum(spans.get(g, 0) for g in job["gpus"]) > 0
        assert mine["pauses_caused"] == total
        assert 0 < mine["paused_ns_suffered"] <= rep.summary["makespan_ns"] * len(job["gpus"])
    # a job's own directory keeps no pfc.csv: `compare` reads the fabric's, so its paused time (all ports) is the
    # sum of the spans counted here (a pause still open at the end closes at the run's end)
    from phantora.report.compare import summarise
    from phantora.results.read import add_fabric_ports, load_run

    job_run = load_run(out / "jobs" / "a")
    add_fabric_ports(job_run, out)
    opened: dict[tuple[str, str, str], int] = {}
    paused_ns = 0
    for r in sorted(rows, key=lambda r: int(r["time_ns"])):
        key, t = (r["node"], r["port"], r["prio"]), int(r["time_ns"])
        if r["pause"] == "1":
            opened.setdefault(key, t)
        elif key in opened:
            paused_ns += t - opened.pop(key)
    end = max(job_run.end_ns or 0, max(int(r["time_ns"]) for r in rows))
    paused_ns += sum(end - t for t in opened.values())
    got = summarise(job_run)
    assert got["pfc_pauses"] == len(frames) and got["pfc_paused_ns"] == paused_ns > 0


@pytest.mark.slow
def test_a_live_job_killed_mid_run_ends_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 of job b is SIGKILLed as step 2 begins: b fails with its two finished steps kept, a runs on;
    `phantora run --jobs` prints the failure and exits 1."""
    from phantora.cli import main

    script = Path(__file__).parent / "scripts" / "steps_then_die.py"
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        f'[[job]]\nname = "a"\nscript = "{script}"\nargs = "--steps 4"\nranks = 2\n'
        f'[[job]]\nname = "b"\nscript = "{script}"\nargs = "--steps 4 --die-at 2"\nranks = 2\n'
    )
    out = tmp_path / "out"
    assert main(["run", "-q", "-t", "twoleaf8", "--jobs", str(jobs), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "failed (peer-died): rank 1 of job b exited" in printed
    doc = json.loads((out / "results.json").read_text())
    assert [(j["name"], j["status"], j["steps"]) for j in doc["jobs"]] == [("a", "complete", 4), ("b", "failed", 2)]
    assert "killed by SIGKILL" in doc["jobs"][1]["error"]["text"]
    assert json.loads((out / "jobs" / "b" / "status.json").read_text())["state"] == "failed"
    assert json.loads((out / "status.json").read_text())["jobs_failed"] == ["b"]
    # each job's ranks' trace chunks are merged into its trace.json, and the run's trace.json holds them too
    a_trace = json.loads((out / "jobs" / "a" / "trace.json").read_text())["traceEvents"]
    assert {ev["pid"] for ev in a_trace if ev.get("ph") == "X"} == {0, 1}
    assert not (out / "jobs" / "a" / "trace").exists()
    # the failed job's trace says it is partial, and how many steps each rank finished (rank 1 died in step 2)
    b_other = json.loads((out / "jobs" / "b" / "trace.json").read_text()).get("otherData") or {}
    assert b_other.get("partial") is True and int(b_other["steps_traced"]["1"]) == 2, b_other
    assert "partial" not in (json.loads((out / "jobs" / "a" / "trace.json").read_text()).get("otherData") or {})
    run_trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert len(run_trace) > len(a_trace)
