"""Bad input found by the 2026-12-03 audit (docs/status.md "bad input and failure handling"): each is one line
naming the file, line or field, refused before any work, or a failed job's table line names its cause."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import main
from phantora.errors import InputError
from phantora.jobs.run import format_jobs
from phantora.netsim.packet_config import PacketConfig, apply_overrides, read_hpcc_config


def test_set_time_with_a_bad_unit_names_the_field() -> None:
    with pytest.raises(InputError) as err:
        apply_overrides(PacketConfig(), ["nic_latency=1xs"])
    assert err.value.field == "nic_latency" and "unknown time unit 'xs'" in str(err.value)
    with pytest.raises(InputError) as err:
        apply_overrides(PacketConfig(), ["nic_latency=-1us"])
    assert err.value.field == "nic_latency" and "-1us" in str(err.value)


def test_a_config_file_time_with_a_bad_unit_names_file_line_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "config.txt"
    cfg.write_text("buffer_bytes 4MB\nnic_latency 1xs\n")
    with pytest.raises(InputError) as err:
        read_hpcc_config(cfg)
    assert (err.value.file, err.value.line, err.value.field) == (str(cfg), 2, "nic_latency")


@pytest.mark.parametrize(("item", "field"), [("seed=1.5", "seed"), ("buffer_bytes=inf", "buffer_bytes")])
def test_whole_number_fields_refuse_fractions_and_infinity(item: str, field: str) -> None:
    """Before: seed=1.5 ran as seed 1, buffer_bytes=inf stopped in an OverflowError traceback."""
    with pytest.raises(InputError) as err:
        apply_overrides(PacketConfig(), [item])
    assert err.value.field == field and "whole number" in str(err.value)
    assert apply_overrides(PacketConfig(), ["seed=1e3", "buffer_bytes=1.5KB"]).seed == 1000


def test_nccl_tests_refuses_an_unknown_gpu_on_a_topology(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `--gpu h999` on a topology file ran, the table headed "simulated h999"."""
    argv = ["nccl-tests", "all_reduce_perf", "--topology", "testbed16", "--gpu", "h999", "-b", "1K", "-e", "1K"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "field 'gpu': unknown GPU 'h999'" in err and "h100" in err


def test_calibrate_refuses_an_output_path_it_cannot_write_before_fitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the public fit ran (8 s), then a FileNotFoundError traceback."""
    bad = tmp_path / "no" / "held.csv"
    t0 = time.process_time()
    assert main(["calibrate", "--public", "--errors", str(bad)]) == 2
    assert time.process_time() - t0 < 1.0
    out = capsys.readouterr()
    assert f"{bad}: field '--errors': cannot write it: no directory" in out.err and "public rows" not in out.out
    assert main(["calibrate", "--public", "--out", str(tmp_path)]) == 2
    assert "field '--out': cannot write it" in capsys.readouterr().err


def test_a_failed_jobs_line_names_its_ranks_exception_and_where() -> None:
    """A job whose script raised: the table adds the rank's own verdict (from its log) under the failure."""
    text = (
        "rank 1 of job b exited (code 1) without calling finish()\n"
        "rank 0 of job b (pid 9) exited with code 1 mid-run.\nTraceback (most recent call last):\n"
        '  File "train.py", line 2, in <module>\nRuntimeError: boom\n'
        "phantora: rank 0 failed (at train.py:2 in <module>): RuntimeError: boom"
    )
    summary: dict[str, Any] = {
        "run": {"topology": "testbed16", "network": "flow", "wall_s": 1.0},
        "makespan_ns": 1000,
        "jobs": [
            {
                "name": "b",
                "kind": "script",
                "ranks": 2,
                "status": "failed",
                "error": {"code": "peer-died", "text": text},
            }
        ],
    }
    lines = format_jobs(summary).splitlines()
    at = lines.index("    failed (peer-died): rank 1 of job b exited (code 1) without calling finish()")
    assert lines[at + 1] == "    rank 0 of job b failed (at train.py:2 in <module>): RuntimeError: boom"
    summary["jobs"][0]["error"]["text"] = "rank 1 of job b exited (code 3) without calling finish()"
    assert "job b failed (at" not in format_jobs(summary)


@pytest.mark.slow
def test_a_job_whose_script_raises_at_import_prints_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`phantora run --jobs`: job b's script raises at import; a runs on, and the table names b's file and line."""
    (tmp_path / "bad.py").write_text('import torch\nraise RuntimeError("boom at import")\n')
    ok = Path(__file__).parent / "scripts" / "steps_then_die.py"
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        f'[[job]]\nname = "a"\nscript = "{ok}"\nargs = "--steps 2"\nranks = 2\n'
        '[[job]]\nname = "b"\nscript = "bad.py"\nranks = 2\n'
    )
    assert main(["run", "-q", "-t", "twoleaf8", "--jobs", str(jobs)]) == 1
    printed = capsys.readouterr().out
    assert "of job b failed (at " in printed and "bad.py:2 in <module>): RuntimeError: boom at import" in printed


def test_a_rank_killed_by_a_signal_names_the_signal() -> None:
    """Before: "rank 1 of job j1 exited (code -9)"; the coordinator's text now names SIGKILL."""
    from tests.test_jobs_core import Jobs

    h = Jobs([0, 2, 1, 3])
    h.core.rank_exited(3, -9)
    assert h.failed == [1] and "rank 1 of job j1 exited (code -9: SIGKILL) without" in h.sent[2][-1]["text"]


def test_a_named_jobs_early_errors_name_it(tmp_path: Path) -> None:
    """Before: "job #0: unknown key" for a job named 'a' (its later errors said job 'a')."""
    from phantora.jobs.spec import parse_jobs

    body = '[[job]]\nname = "a"\nscript = "x.py"\nranks = 2\nrank = 2\n'
    with pytest.raises(InputError) as err:
        parse_jobs(body, str(tmp_path / "jobs.toml"), tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'jobs.toml'}:1: field 'rank': job 'a': unknown key")
