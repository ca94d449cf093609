"""bench/bench_whole_dag_driver.py's ``job:DIR`` case: the key of a replay's files and the critical path it reports."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load


def _load() -> ModuleType:
    return load("bench/bench_whole_dag_driver.py")


def _replay_dir(d: Path, flows: str, step_ns: int, workers: int) -> Path:
    d.mkdir()
    (d / "flows.csv").write_text(flows)
    (d / "links.csv").write_text("link,bytes\n0,10\n")
    res = {
        "step_times_ns": [step_ns],
        "makespan_ns": step_ns,
        "engine_stats": {"events": 100 + workers, "decompose": {"workers": workers}},
        "run": {"settings": {"workers": workers}},
    }
    (d / "results.json").write_text(json.dumps(res))
    return d


def test_job_key_reads_the_tables_and_simulated_figures_not_the_engines_counters(tmp_path: Path) -> None:
    b = _load()
    flows = "id,start_ns,end_ns\n0,0,5\n"
    one = b.job_key(_replay_dir(tmp_path / "one", flows, 131, workers=0))
    two = b.job_key(_replay_dir(tmp_path / "two", flows, 131, workers=2))
    assert one == two and len(one) == 12  # engine_stats and run differ: not in the key
    assert b.job_key(_replay_dir(tmp_path / "row", flows.replace(",5", ",6"), 131, workers=2)) != one
    assert b.job_key(_replay_dir(tmp_path / "step", flows, 132, workers=2)) != one


def test_critical_path_is_the_drivers_work_alone_plus_its_rounds_and_the_workers_planning() -> None:
    b = _load()
    d = {"overlap_cpu_s": 3.0, "meanwhile_cpu_s": 1.0, "built_cpu_s": 0.5, "plan_cpu_s": 0.2}
    # driver 5 s of CPU, of it 1.5 s beside its workers: 3.5 alone + 3 of rounds + 0.2 planning
    assert b.critical_of({"decompose": d}, 5.0) == pytest.approx(6.7)
    assert b.critical_of({"events": 1}, 5.0) is None  # one engine: no decomposition stats


def test_a_job_without_a_recording_is_refused_naming_the_folder(tmp_path: Path) -> None:
    b = _load()
    with pytest.raises(SystemExit, match=r"job:.*nothing.*no graph.json"):
        b.run_job(str(tmp_path / "nothing"), 2)
