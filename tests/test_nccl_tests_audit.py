"""The fast slice of bench/audit_nccl_tests.py (issue 33's audit of `phantora nccl-tests`): every program on one
8-H100 server and two on testbed16's two hosts, 8 B to 1 GiB, end with nccl-tests' 13-column table, a choice per
size in results.json, busbw within the links' bounds (closed forms in the script's docstring) and not falling
with the size under one choice; a forced algorithm NCCL has not for a collective is one line naming it. The full
matrix (programs x GPUs x topologies, the flags, an ns-3 sample) is the script's --set base / flags / ns3."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_modules import load

audit = load("bench/audit_nccl_tests.py")


def test_the_bounds_are_the_closed_forms() -> None:
    """2 hosts of 8 H100 (450 GB/s NVLink, 50 GB/s NICs): a ring all-reduce is held to the 8 NICs of a host,
    a tree one to 2(n-1)/n of them, NVLS in one host to 2(n-1)/n of NVLink, all-to-all to (n-1)/(n-G) NIC."""
    assert audit.bound("all_reduce", "Ring", 16, 450, 50, 8, 2, True) == 400
    assert audit.bound("all_reduce", "Tree", 16, 450, 50, 8, 2, True) == 450  # 750 over NICs, NVLink's 450
    assert audit.bound("all_reduce", "NVLS", 8, 450, 0, 8, 1, True) == pytest.approx(787.5)
    assert audit.bound("all_reduce", "sym", 8, 300, 0, 8, 1, False) == 300  # A100: no multicast
    assert audit.bound("alltoall", "p2p", 16, 450, 50, 8, 2, True) == pytest.approx(93.75)


def test_the_table_check_finds_a_short_row() -> None:
    ok = "  1024  256  float  sum  -1  20.27  0.05  0.09  0  20.27  0.05  0.09  0  # algorithm=Ring protocol=LL"
    short = ok.split("#")[0].rstrip().rsplit(" ", 1)[0]  # #wrong of the in-place half missing
    rows, bad = audit.parse_table(ok + "\n" + short + "\n# comment")
    assert len(rows) == 1 and len(bad) == 1 and "12 columns" in bad[0]


@pytest.mark.parametrize(
    "case",
    [audit.Case(p, "h100", "dgx8", [], {}, audit.FLAG_SIZES) for p in audit.PROGRAMS]
    + [audit.Case(p, "h100", "testbed16", [], {}, audit.FLAG_SIZES) for p in ("all_reduce", "alltoall")],
    ids=lambda c: f"{c.prog}-{c.topo}",
)
def test_a_program_runs_within_its_bounds(case, tmp_path: Path) -> None:
    found, row = audit.check(case, tmp_path)
    assert row["rc"] == 0 and found == [], found
    assert row["max_busbw"] > 0


def test_a_forced_algorithm_nccl_has_not_is_one_line(tmp_path: Path) -> None:
    found, row = audit.check(audit.Case("all_gather", "h100", "dgx8", [], {"NCCL_ALGO": "Tree"}), tmp_path)
    assert found == [] and row["rc"] == 2 and "NCCL_ALGO=Tree" in row["refusal"]
