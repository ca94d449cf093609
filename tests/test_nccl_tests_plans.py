"""`phantora nccl-tests -m N`: a group NCCL 2.22+ launches as several plans says so on its table line (`plans=`),
whatever kind of plan cut it, as results.json does (2026-12-03: checked for p2p groups, the legacy kernels' plans
and NCCL 2.28's symmetric kernels; none was missing from the table at 26d95129)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import main
from phantora.results import schema as S

SYM_CALLS_A_KERNEL = 58  # register.kernel_works: symmetric_sched.cc, 2.28.3's 4 KiB arguments over its works
P2P_CALLS_A_PLAN = 223  # p2p_plans.py: enqueue.cc's budget, sendrecv_perf at 8 B on 8 H100s (one channel a peer)


def _line_and_choice(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any]]:
    assert main(["nccl-tests", *argv, "-n", "1", "-w", "0", "--out", str(out)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip() and not ln.startswith("#"))
    choice = json.loads((out / S.RESULTS_JSON).read_text())["sizes"][0]["choice"]
    return row, choice


def _printed(row: str) -> dict[str, str]:
    """The choice the table line ends with, key=value."""
    return dict(item.split("=", 1) for item in row.split("  # ", 1)[1].split())


@pytest.mark.parametrize(
    ("argv", "env", "plans"),
    [
        (["sendrecv_perf", "-b", "8", "-e", "8", "-m", "600"], {}, math.ceil(600 / P2P_CALLS_A_PLAN)),
        (["all_reduce_perf", "-b", "1K", "-e", "1K", "-m", "100", "-R", "2"], {"PHANTORA_NCCL_VERSION": "2.28.3"},
         math.ceil(100 / SYM_CALLS_A_KERNEL)),
        (["all_reduce_perf", "-b", "1M", "-e", "1M", "-m", "5000"], {}, None),
    ],
)  # fmt: skip
def test_every_kind_of_plan_cut_is_on_the_table_line(
    argv: list[str],
    env: dict[str, str],
    plans: int | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """p2p (p2p_plans), symmetric kernels (sym_plans, 58 calls a kernel in 2.28.3) and the legacy kernels' plans
    (group_plans; 5000 NVLS all-reduces: more than one plan) each print the plans results.json records."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    row, choice = _line_and_choice(argv, tmp_path / "out", capsys)
    printed = _printed(row)
    assert int(printed["plans"]) == choice["plans"] >= 2
    assert int(printed["group_calls"]) == choice["group_calls"] == int(argv[argv.index("-m") + 1])
    if plans is not None:
        assert choice["plans"] == plans
