"""The end of a `phantora nccl-tests` table as nccl-tests 2.19.6 writes it (src/util.cu writeResultFooter,
src/common.cu run): "Avg bus bandwidth" is the mean busbw of both column groups of every line (BenchTime adds each
group's busBw to bw[0] and counts it), and `NCCL_TESTS_MIN_BW` (GB/s) makes the line end in OK or FAILED (below
0.9 x the figure), the JSON's "okay" a bool, and a failed check the exit status testNumResults (7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.results import schema as S
from tests.test_nccl_tests_format import _busbw_mean, parse

ONE_RANK = ["nccl-tests", "broadcast_perf", "-b", "1M", "-e", "4M", "-f", "4", "-g", "1", "-n", "2", "-w", "0"]
TWO_RANKS = ["nccl-tests", "all_reduce_perf", "-b", "64K", "-e", "256K", "-f", "4", "-g", "2", "-n", "1", "-w", "0"]


def _avg_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith("# Avg bus bandwidth"))


def test_the_average_counts_the_in_place_group_where_it_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One rank: the out-of-place group copies the buffer, the in-place group only launches, so their busbw
    differ; nccl-tests' trailer is the mean of all four figures (to the printed rounding), and results.json's
    avg_busbw is the same figure."""
    out = tmp_path / "out"
    assert main([*ONE_RANK, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    t = parse(text)
    assert len(t.rows) == 2 and all(r.groups[0][2] != r.groups[1][2] for r in t.rows)
    assert t.avg_busbw == pytest.approx(_busbw_mean(t.rows), abs=0.01)
    outplace = sum(r.groups[0][2] for r in t.rows) / len(t.rows)
    assert abs(t.avg_busbw - outplace) > 1.0  # the bug this guards: the out-of-place group alone
    data = json.loads((out / S.RESULTS_JSON).read_text())
    assert data["avg_busbw"] == pytest.approx(_busbw_mean(t.rows), abs=0.01)
    assert _avg_line(text) == f"# Avg bus bandwidth    : {data['avg_busbw']:g} "  # no check: nothing after it


@pytest.mark.parametrize("floor, verdict, rc", [(0.001, "OK", 0), (1e6, "FAILED", 7)])
def test_nccl_tests_min_bw_checks_the_average(
    floor: float, verdict: str, rc: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """`NCCL_TESTS_MIN_BW=X`: the trailer ends in OK at or above 0.9 X, FAILED below it, and a failed check
    exits 7 with nccl-tests' " .. HOST pid N: Test failure" line after the closing lines; -J's JSON says "okay"
    as nccl-tests' jsonBool writes it, a "true" or "false" string."""
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", str(floor))
    js = tmp_path / "t.json"
    assert main([*TWO_RANKS, "-J", str(js)]) == rc
    text = capsys.readouterr().out
    avg = parse("\n".join(ln for ln in text.splitlines() if "Test failure" not in ln)).avg_busbw
    assert _avg_line(text) == f"# Avg bus bandwidth    : {avg:g} {verdict}"
    doc = json.loads(js.read_text())
    assert doc["average_bus_bandwidth"]["okay"] == ("true" if verdict == "OK" else "false")  # jsonBool's strings
    lines = text.splitlines()
    assert lines[lines.index("# Collective test concluded: all_reduce_perf") + 1] == "#"
    failure = [ln for ln in lines if "Test failure" in ln]
    assert len(failure) == (rc != 0)
    if failure:
        assert failure[0].startswith(" .. host0 pid ") and failure[0].endswith(": Test failure common.cu:1454")


def test_min_bw_of_minus_one_is_unchecked_and_a_bad_value_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """nccl-tests' check_avg_bw of -1 means no check (its default); a value that is not a number is an error
    naming the variable before anything runs (nccl-tests' atof would read it as 0: every run passes)."""
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", "-1")
    js = tmp_path / "t.json"
    assert main([*TWO_RANKS, "-J", str(js)]) == 0
    assert _avg_line(capsys.readouterr().out).endswith(" ")
    assert json.loads(js.read_text())["average_bus_bandwidth"]["okay"] == "unchecked"
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", "fast")
    assert main(TWO_RANKS) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        "phantora nccl-tests: error: field 'NCCL_TESTS_MIN_BW': not a number (GB/s): 'fast'"
    ]
