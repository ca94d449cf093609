"""A scenario in a run of several jobs (`phantora run|replay --jobs --scenario`, phantora.jobs.scenario).

Closed form (flow engine, ideal collectives, every link B = 100 Gb/s, 1 us): two 2-rank all-reduces of S bytes,
one per job, both crossing leaf 0's one uplink, get B/2 each there; with that uplink degraded to B/2 from t = 0
they get B/4 each, so each all-reduce takes ceil(4*S*8/B) + 4 us instead of ceil(2*S*8/B) + 4 us.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import main

B = 100 * 10**9
LAT = 1000
S = 4 * 2**20
WORKLOAD = (
    f'name = "ar"\n[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = {S}\nranks = "all"\nrepeat = 2\ngap = "20us"\n'
)
TOPOLOGY = (
    '[generator]\nkind = "leaf_spine"\nleaves = 2\nendpoints_per_leaf = 2\nspines = 1\nnic_rate = "100Gbps"\n'
    'uplink_rate = "100Gbps"\nlatency = "1us"\n'
)
JOBS = (
    '[[job]]\nname = "a"\nworkload = "ar.toml"\nranks = 2\nplacement = [0, 2]\n'
    '[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 2\nplacement = [1, 3]\n'
)
DEGRADE = '[[events]]\nkind = "link_degrade"\nat = "0ns"\nlink = ["leaf0", "spine0"]\nrate = "50Gbps"\n'


def files(tmp_path: Path, scenario: str) -> list[str]:
    (tmp_path / "ar.toml").write_text(WORKLOAD)
    (tmp_path / "topo.toml").write_text(TOPOLOGY)
    (tmp_path / "jobs.toml").write_text(JOBS)
    (tmp_path / "sc.toml").write_text(scenario)
    return ["--topology", str(tmp_path / "topo.toml"), "--jobs", str(tmp_path / "jobs.toml")]


@pytest.mark.parametrize("command", ["replay", "run"])
def test_jobs_run_under_the_scenario_and_report_it(tmp_path: Path, command: str) -> None:
    """Both commands hand the scenario to the jobs' one engine (each all-reduce as slow as the closed form says) and
    write results.json's scenario section, with every job's steps against each event, and the events in trace.json."""
    out = tmp_path / "out"
    argv = [command, *files(tmp_path, DEGRADE), "--scenario", str(tmp_path / "sc.toml"), "--out", str(out)]
    assert main([*argv, "--collective-model", "ideal"] if command == "replay" else argv) == 0
    doc = json.loads((out / "results.json").read_text())
    section = doc["scenario"]
    assert [(a["op"], a["links"]) for a in section["applied"]] == [("degrade", ["leaf0-spine0"])]
    (event,) = section["events"]
    assert event["event"] == "link_degrade#0" and event["end_ns"] is None
    assert {name: p["during"]["count"] for name, p in event["jobs"].items()} == {"a": 1, "b": 1}  # one step each
    if command == "replay":  # the ideal model's closed form (run --jobs has no --collective-model for recorded jobs)
        degraded = -(-4 * S * 8 * 10**9 // B) + 4 * LAT
        for job in ("a", "b"):
            ops = json.loads((out / "jobs" / job / "results.json").read_text())["collectives"]
            assert [op["end_ns"] - op["t_start"] for op in ops] == [degraded] * 2
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "scenario" and e["name"] == "degrade leaf0-spine0" for e in trace)


def test_without_the_scenario_the_jobs_share_the_full_uplink(tmp_path: Path) -> None:
    """The control of the test above: the same jobs and command, no scenario, B/2 each."""
    out = tmp_path / "out"
    assert main(["replay", *files(tmp_path, DEGRADE), "--out", str(out), "--collective-model", "ideal"]) == 0
    assert "scenario" not in json.loads((out / "results.json").read_text())
    ops = json.loads((out / "jobs" / "a" / "results.json").read_text())["collectives"]
    assert [op["end_ns"] - op["t_start"] for op in ops] == [-(-2 * S * 8 * 10**9 // B) + 4 * LAT] * 2


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ('kind = "gpu_slow"\nrank = 1\nat = "0ns"\nfactor = 2.0\n', "events[0].kind"),
        ('kind = "link_down"\nat_step = 1\nlink = ["leaf0", "spine0"]\n', "events[0].at_step"),
        ('kind = "nic_down"\nat = "0ns"\nrank = 1\n', "events[0].rank"),
        (
            'kind = "background"\nat = "0ns"\nhosts = [0, 1]\nduration = "1ms"\ncdf = "websearch"\nload = 0.3\n',
            "events[0].hosts",
        ),
    ],
)
@pytest.mark.parametrize("command", ["replay", "run"])
def test_what_names_a_jobs_rank_or_step_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, event: str, field: str
) -> None:
    argv = [command, *files(tmp_path, f"[[events]]\n{event}"), "--scenario", str(tmp_path / "sc.toml")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sc.toml'}:" in err and f"field '{field}'" in err and "each job's own" in err


@pytest.mark.slow
def test_a_live_job_and_a_recorded_one_under_the_scenario(tmp_path: Path) -> None:
    """`phantora run --jobs` with a live DDP job (rank processes, the coordinator's engine) and a recorded one: the
    coordinator's engine applies the degrade, and results.json's section names the live job's three steps."""
    argv = files(tmp_path, DEGRADE)
    (tmp_path / "jobs.toml").write_text(
        '[[job]]\nname = "live"\nscript = "gpt_ddp.py"\nargs = "--steps 3 --d-model 64 --layers 2 --seq 64 --batch 2"\n'
        'ranks = 2\nplacement = [0, 2]\n[[job]]\nname = "b"\nworkload = "ar.toml"\nranks = 2\nplacement = [1, 3]\n'
    )
    out = tmp_path / "out"
    assert main(["run", *argv, "--scenario", str(tmp_path / "sc.toml"), "--out", str(out), "--quiet"]) == 0
    section = json.loads((out / "results.json").read_text())["scenario"]
    assert [(a["op"], a["links"]) for a in section["applied"]] == [("degrade", ["leaf0-spine0"])]
    assert {name: p["during"]["count"] for name, p in section["events"][0]["jobs"].items()} == {"live": 3, "b": 1}


@pytest.mark.ns3
def test_packet_jobs_run_under_the_scenario(ns3_lib: Any, tmp_path: Path) -> None:
    """The same jobs on ns-3 (the plain packet engine under the scenario): the degrade is applied there, and with
    the uplink at B/2 shared by two all-reduces each takes at least the fluid closed form's ceil(4*S*8/B)."""
    out = tmp_path / "out"
    argv = ["replay", *files(tmp_path, DEGRADE), "--scenario", str(tmp_path / "sc.toml"), "--out", str(out)]
    assert main([*argv, "--network", "ns3", "--cc", "dcqcn", "--collective-model", "ideal"]) == 0
    section = json.loads((out / "results.json").read_text())["scenario"]
    assert section["engine"] == "ns3"
    assert [(a["op"], a["links"]) for a in section["applied"]] == [("degrade", ["leaf0-spine0"])]
    ops = json.loads((out / "jobs" / "a" / "results.json").read_text())["collectives"]
    assert all(op["end_ns"] - op["t_start"] >= -(-4 * S * 8 * 10**9 // B) for op in ops)


def test_a_jobs_ranks_get_the_run_options_a_single_run_gives(tmp_path: Path) -> None:
    """Each job's ranks are told the run's options through the launcher's one `rank_options` (--no-public-fit was
    dropped on the jobs path before), with the job's own start and step count."""
    from phantora.jobs.run import _job_env
    from phantora.jobs.spec import JobSpec
    from phantora.launcher import RunConfig
    from phantora.rank_options import Options

    cfg = RunConfig("", public_fit=False, sim_cuda=False, gpu="a100", trace="coarse")
    job = JobSpec("a", "script", "x.py", ranks=2, start_ns=7, steps=3)
    opts = Options.from_env(_job_env(cfg, job, tmp_path, ("roofline", (), None)))
    assert (opts.public_fit, opts.sim_cuda, opts.gpu, opts.trace) == (False, False, "a100", "coarse")
    assert (opts.compute_model, opts.start_ns, opts.max_steps, opts.out_dir) == ("roofline", 7, 3, str(tmp_path))
