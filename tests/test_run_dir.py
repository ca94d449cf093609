"""Run directories: never two runs' results in one, a status that says what happened, steps that survive a crash."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.errors import InputError, PhantoraError
from phantora.launcher import RunConfig, launch
from phantora.results import run_dir

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "steps_then_die.py"


def test_claim_refuses_a_file_a_used_directory_and_an_unwritable_path(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="names a file") as e:
        run_dir.claim(f)
    assert str(f) in str(e.value)
    used = tmp_path / "used"
    (used / "logs").mkdir(parents=True)
    (used / "results.json").write_text("{}")
    with pytest.raises(InputError, match=r"already holds 2 entries \(logs, results.json\).*--overwrite"):
        run_dir.claim(used)
    with pytest.raises(InputError, match="cannot be written"):
        run_dir.claim(f / "sub")  # under a file: no directory can be made there
    assert run_dir.claim(tmp_path / "new" / "run").is_dir()


def test_overwrite_removes_only_what_a_run_wrote(tmp_path: Path) -> None:
    for name in ("results.json", "flows.csv", "steps.jsonl", "status.json", "notes.txt"):
        (tmp_path / name).write_text("old")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.log").write_text("old")
    run_dir.claim(tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # the user's own file stays


def test_steps_merge_as_the_slowest_rank_ends_them(tmp_path: Path) -> None:
    """Step k ends when the last rank ends it; a line a kill cut short, and steps not every rank finished, are
    left out."""
    parts = tmp_path / "steps"
    parts.mkdir()
    rows = {
        0: [(100, 80, 10, {"all_reduce": 8}), (250, 100, 20, {"all_reduce": 8})],
        1: [(120, 90, 30, {"all_reduce": 8}), (230, 95, 5, {"all_reduce": 8}), (400, 1, 1, {})],
    }
    for r, lines in rows.items():
        text = "".join(
            json.dumps({"end_ns": e, "compute_ns": c, "memory_peak_bytes": m, "reserved_peak_bytes": 2 * m,
                        "comm_bytes": b, "comm_wait_ns": c // 10}) + "\n"
            for e, c, m, b in lines
        )  # fmt: skip
        (parts / f"rank{r}.jsonl").write_text(text + ('{"end_ns": 5' if r == 0 else ""))
    steps = run_dir.merge_steps(tmp_path, [0, 1])
    assert [(s["end_ns"], s["time_ns"], s["compute_ns"], s["exposed_ns"]) for s in steps] == [
        (120, 120, 90, 30),
        (250, 130, 100, 30),
    ]
    assert [s["memory_peak_bytes"] for s in steps] == [30, 20] and steps[0]["reserved_peak_bytes"] == 60
    assert steps[1]["comm_bytes"] == {"all_reduce": 16}
    assert [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()] == steps


def test_a_run_killed_mid_way_keeps_its_finished_steps_and_says_what_happened(tmp_path: Path) -> None:
    seen: list[dict] = []  # progress: told of each step as every live rank finishes it
    env = {"PHANTORA_TORCH_VERSION": "2.5"}  # given to the ranks only: config.json records it as they had it
    cfg = RunConfig(str(SCRIPT), ["--steps", "5"], "testbed16", nproc=2, out_dir=tmp_path / "full",
                    on_step=seen.append, env=env)  # fmt: skip
    full = launch(cfg)
    assert run_dir.read_status(tmp_path / "full")["state"] == "complete"
    assert json.loads((tmp_path / "full" / "config.json").read_text())["versions"]["torch_modelled"] == "2.5"
    assert [s["end_ns"] for s in seen] == [s["end_ns"] for s in full.summary["steps"]]
    died = tmp_path / "died"
    with pytest.raises(PhantoraError, match="rank 1"):
        launch(RunConfig(str(SCRIPT), ["--steps", "5", "--die-at", "3"], "testbed16", nproc=2, out_dir=died, env=env))
    status = run_dir.read_status(died)
    assert status is not None and status["state"] == "failed" and status["rank"] == 1
    assert status["steps_finished"] == 3 and "SIGKILL" in status["reason"]
    assert not (died / "results.json").exists()  # no results of a run that did not finish
    kept = [json.loads(x) for x in (died / "steps.jsonl").read_text().splitlines()]
    # the finished steps are the complete run's first three (the same program, deterministic)
    assert [s["end_ns"] for s in kept] == [s["end_ns"] for s in full.summary["steps"][:3]]
    assert [s["time_ns"] for s in kept] == [s["time_ns"] for s in full.summary["steps"][:3]]
    assert all(s["comm_bytes"] == {"all_reduce": 2 * 4 << 18} for s in kept)  # 1 MiB from each of 2 ranks
    # the trace of the finished steps is kept too, marked partial, with the same step spans as the full run's
    trace = json.loads((died / "trace.json").read_text())
    assert trace["otherData"] == {"partial": True, "steps_traced": {"0": 3, "1": 3}} and "partial" in status["trace"]
    assert not (died / "trace").exists()  # the rank files were merged

    def spans(doc: dict, cat: str) -> list[tuple]:
        return sorted((e["pid"], e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e.get("cat") == cat)

    whole = json.loads((tmp_path / "full" / "trace.json").read_text())
    assert "otherData" not in whole and len(spans(whole, "step")) == 2 * 5
    assert spans(trace, "step") == [s for s in spans(whole, "step") if int(s[1].split()[1]) < 3]
    for cat in ("compute", "comm"):  # every event of steps 0-2, none of a later step
        end = max(s["end_ns"] for s in kept) / 1000
        assert spans(trace, cat) == [s for s in spans(whole, cat) if s[2] < end] and spans(trace, cat)

    # compare reads the partial run, marks it partial and takes its iteration time from the steps it kept
    from phantora.report.compare import load_and_compare

    runs, cmp = load_and_compare([tmp_path / "full", died])
    assert [r.partial for r in runs] == [False, True]
    assert cmp.runs[1]["status"].startswith("partial (failed: ") and cmp.runs[1]["status"].endswith("3 steps kept)")
    steady = [s["time_ns"] for s in kept[1:]]
    assert cmp.metric("time_ns").values[1] == round(sum(steady) / len(steady))

    # a live flow-mode run writes links.csv: gpu0 and gpu1 share an NVSwitch, so gpu0 -> nvsw0 carries
    # exactly the bytes of gpu0's flows
    with (tmp_path / "full" / "flows.csv").open() as fh:
        sent = sum(int(r["size_bytes"]) for r in csv.DictReader(fh) if r["src"] == "gpu0")
    with (tmp_path / "full" / "links.csv").open() as fh:
        links = {(r["from"], r["to"]): int(r["bytes"]) for r in csv.DictReader(fh)}
    assert sent > 0 and links[("gpu0", "nvsw0")] == sent


def test_the_cli_refuses_an_earlier_runs_directory_and_leaves_it_alone(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text('{"old": 1}')
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "star8", "--nproc", "2", "--out", str(tmp_path)]
    out = subprocess.run([*cmd, str(SCRIPT), "--steps", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--overwrite" in out.stderr and "Traceback" not in out.stderr
    assert (tmp_path / "results.json").read_text() == '{"old": 1}'
    again = [*cmd, "--overwrite", str(SCRIPT), "--steps", "1"]
    out = subprocess.run(again, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "results.json").read_text())["world_size"] == 2
    # the run says what it wrote: flows.csv, links.csv and cosim.json too (the line named four files and logs/)
    wrote = next(line for line in out.stdout.splitlines() if line.startswith("wrote "))
    listed = wrote.split(": ", 1)[1].split(", ")
    assert {"flows.csv", "links.csv", "cosim.json", "results.json", "trace.json", "logs/"} <= set(listed)
    assert all((tmp_path / name).exists() for name in listed)
    assert run_dir.read_status(tmp_path)["state"] == "complete"


@pytest.mark.slow  # ~45 s: two ns-3 runs through the CLI
def test_the_config_records_every_setting_and_rerun_reproduces_the_run(tmp_path: Path) -> None:
    """--set values and every default in config.json; `phantora rerun` gives identical simulated steps."""
    from phantora.netsim.packet_config import PacketConfig
    from phantora.results.provenance import read_config

    first, script = tmp_path / "first", tmp_path / SCRIPT.name
    shutil.copy(SCRIPT, script)
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "star8", "--nproc", "2", "--network", "ns3"]
    cmd += ["--cc", "dcqcn", "--set", "buffer_bytes=4000000", "--set", "pfc=false", "--out", str(first), "-q"]
    out = subprocess.run([*cmd, str(script), "--steps", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = read_config(first)
    fields = doc["packet"]["fields"]
    assert fields["buffer_bytes"] == 4_000_000 and fields["pfc"] is False and fields["cc"] == "dcqcn"
    defaults = PacketConfig()
    for name in ("payload_bytes", "reserve_bytes", "dt_shift", "ack_interval", "seed", "ecn"):
        assert fields[name] == getattr(defaults, name), name  # the defaults that applied, written out
    assert "resolved" not in doc["packet"]  # what the defaults resolve to is ns-3's report, engine.json
    star = json.loads((first / "engine.json").read_text())["ns3"]["resolved"]["ecn_kmin_bytes"]
    assert star == {str(r): r // 10**9 * 4000 for r in map(int, star)}  # 4 KB per Gb/s, the default rule
    params = doc["packet"]["ns3_params"]  # by ns-3 attribute path (packet_config.NS3_ATTRIBUTES)
    assert params["switch.BufferSize"] == "4000000" and params["switch.PfcEnabled"] == "false"
    assert doc["command"][:2] == ["phantora", "run"] and "--set" in doc["command"]
    assert len(doc["topology"]["sha256"]) == 64 and doc["versions"]["torch"].startswith("2.13.0")
    again = subprocess.run(
        [sys.executable, "-m", "phantora.cli", "rerun", str(first), "-q"], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "reproduced: the 2 simulated step times are identical" in again.stdout
    steps = [json.loads((tmp_path / d / "results.json").read_text())["steps"] for d in ("first", "first-rerun")]
    assert steps[0] == steps[1]
    again_doc = read_config(tmp_path / "first-rerun")
    assert again_doc["packet"] == doc["packet"] and again_doc["rerun_of"]["dir"] == str(first)
    assert again_doc["inputs"]["script"] == doc["inputs"]["script"] and doc["inputs"]["script"]["path"] == str(script)
    script.write_text(script.read_text() + "# edited\n")  # an edited script: refused, named
    again = subprocess.run([sys.executable, "-m", "phantora.cli", "rerun", str(first)], capture_output=True, text=True)
    assert again.returncode == 2 and f"script {script} changed since the run" in again.stderr


def test_a_checkpoint_stall_in_the_merged_steps_is_storage_not_exposed_time(tmp_path: Path) -> None:
    """steps.jsonl says what the summary says: a step of 100 ns with 60 ns of compute and a rank's 30 ns
    checkpoint write leaves 100 - 60 - 30 = 10 ns exposed."""
    parts = tmp_path / "steps"
    parts.mkdir()
    line = {"end_ns": 100, "compute_ns": 60, "memory_peak_bytes": 0, "reserved_peak_bytes": 0, "comm_bytes": {},
            "comm_wait_ns": 0}  # fmt: skip
    (parts / "rank0.jsonl").write_text(json.dumps({**line, "storage_ns": 30, "storage_bytes": 300}) + "\n")
    (parts / "rank1.jsonl").write_text(json.dumps({**line, "storage_ns": 10, "storage_bytes": 100}) + "\n")
    [step] = run_dir.merge_steps(tmp_path, [0, 1])
    assert (step["storage_ns"], step["storage_bytes"], step["exposed_ns"]) == (30, 400, 10)


def test_versions_record_the_torch_the_simulated_gpu_stands_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """PHANTORA_TORCH_VERSION moves step times (torch_release.py), so config.json's versions record it as the ranks
    get it (this process's environment under RunConfig.env); unset, the installed torch. A rerun, whose ranks get
    the run's recorded env again, notes only a real difference."""
    from phantora.commands.rerun import _version_note
    from phantora.results.provenance import versions

    var = "PHANTORA_TORCH_VERSION"
    monkeypatch.delenv(var, raising=False)
    installed = versions()["torch"]
    assert installed and versions()["torch_modelled"] == installed
    assert versions({var: "2.5"})["torch_modelled"] == "2.5"
    monkeypatch.setenv(var, "2.5")
    assert versions()["torch_modelled"] == "2.5"
    then = versions()
    monkeypatch.delenv(var)
    _version_note(then, {"env": {var: "2.5"}})
    assert capsys.readouterr().out == ""
    _version_note(then, {"env": {}})
    assert f"torch_modelled 2.5 -> {installed}" in capsys.readouterr().out
