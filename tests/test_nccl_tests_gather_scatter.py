"""gather_perf and scatter_perf: nccl-tests' gather.cu / scatter.cu, run as NCCL runs them (one p2p group with the
root). Checked against nccl-tests' counts (16-byte blocks of count / nranks), the bytes each pair carries (one
rank's block: (n - 1) blocks on the wire in all) and the root's link, which every block crosses."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.report import nccl_tests as nt
from phantora.results import schema as S

MiB = 1 << 20
H100_NVLINK_GBS = 3600e9 / 8 / 1e9  # the dgx_host NVLink port of an H100, one direction, GB/s


def _dgx(tmp_path: Path, n: int) -> str:
    path = tmp_path / f"dgx{n}.toml"
    path.write_text(f'gpu = "h100"\n[generator]\nkind = "dgx_host"\ngpus_per_host = {n}\n')
    return str(path)


def test_pairs_are_the_roots_fan_in_and_fan_out() -> None:
    ranks = (4, 5, 6, 7)
    assert nt.p2p_pairs("gather", ranks, 2) == [(4, 6), (5, 6), (7, 6)]
    assert nt.p2p_pairs("scatter", ranks, 0) == [(4, 5), (4, 6), (4, 7)]
    assert nt.p2p_pairs("send_recv", ranks, 0) == [(4, 5), (5, 6), (6, 7), (7, 4)]


@pytest.mark.parametrize("test", ["gather_perf", "scatter_perf"])
def test_counts_are_nccl_tests_blocks(test: str) -> None:
    """gather.cu / scatter.cu: (count / nranks) & ~(16 / eltSize - 1) elements a rank; the size column is the
    larger buffer, nranks blocks."""
    spec = nt.find_test(test)
    assert nt.counts(spec, 1000, 4, 6) == (6 * 40 * 4, 40, 6 * 40 * 4)  # 250 / 6 = 41 floats, down to 40
    assert nt.counts(spec, 7, 4, 6) == (0, 0, 0)
    assert spec.rooted and not spec.has_op and spec.factor(8) == 7 / 8


@pytest.mark.parametrize(("test", "end"), [("gather_perf", "dst"), ("scatter_perf", "src")])
def test_one_call_moves_n_minus_1_blocks_through_the_root(
    test: str, end: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One 64 MiB call on 4 H100s, root 2 (Simple: no wire overhead): every flow ends (gather) or starts (scatter)
    at the root, 3 blocks of 16 MiB in all; busbw is the bytes through the root's link over the time, so at most
    its NVLink rate."""
    out = tmp_path / "out"
    argv = ["nccl-tests", test, "--topology", _dgx(tmp_path, 4), "-b", "64M", "-e", "64M", "-n", "1", "-w", "0"]
    assert main([*argv, "-r", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    data = json.loads((out / S.RESULTS_JSON).read_text())
    (line,) = data["sizes"]
    assert line["choice"]["protocol"] == "Simple" and line["root"] == 2
    with (out / S.FLOWS_CSV).open() as f:
        flows = list(csv.DictReader(f))
    assert {fl[end] for fl in flows} == {"gpu2"}
    assert sum(int(fl["size_bytes"]) for fl in flows) == 3 * 16 * MiB
    assert line["busbw"] == pytest.approx(3 * 16 * MiB / 1e3 / line["time_us"], rel=1e-9)
    assert 0 < line["busbw"] <= H100_NVLINK_GBS


def test_a_root_outside_the_ranks_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nccl-tests", "gather_perf", "--np", "4", "-r", "4", "-b", "1M", "-e", "1M"]) == 2
    assert "'-r'" in capsys.readouterr().err


def test_a_hypercube_call_is_log2_n_exchanges_of_doubling_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hypercube.cu on 8 ranks: 3 groups, rank r swapping 2^k blocks with r ^ 2^k in group k, so each rank sends
    1 + 2 + 4 = 7 blocks (n - 1, the bytes its algbw counts) and every flow joins a rank to its partner of that
    step; algbw = busbw = 7 blocks over the time."""
    out = tmp_path / "out"
    argv = ["nccl-tests", "hypercube_perf", "--topology", _dgx(tmp_path, 8), "-b", "64M", "-e", "64M", "-n", "1"]
    assert main([*argv, "-w", "0", "--out", str(out)]) == 0
    capsys.readouterr()
    (line,) = json.loads((out / S.RESULTS_JSON).read_text())["sizes"]
    block = 8 * MiB
    assert line["bytes"] == 64 * MiB and line["count"] == block // 4 and line["nbytes"] == 7 * block
    with (out / S.FLOWS_CSV).open() as f:
        flows = list(csv.DictReader(f))
    assert sum(int(fl["size_bytes"]) for fl in flows) == 8 * 7 * block  # Simple at this size: no wire overhead
    for fl in flows:
        step = int(fl["tag"].split("/s")[1].split("/")[0])
        assert int(fl["src"][3:]) ^ int(fl["dst"][3:]) == 1 << step
    assert line["busbw"] == line["algbw"] == pytest.approx(7 * block / 1e3 / line["time_us"], rel=1e-9)


@pytest.mark.parametrize(("argv", "flag"), [(["--np", "6"], "--np"), (["-m", "2"], "-m")])
def test_a_hypercube_nccl_cannot_run_is_one_line(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["nccl-tests", "hypercube_perf", *argv, "-b", "1M", "-e", "1M"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"'{flag}'" in err[0]


def test_hypercube_out_of_place_copies_its_own_block_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """hypercube.cu, out of place, first copies the rank's own block into its receive buffer (cudaMemcpyAsync, device
    to device); in place the block already lies there. On 8 H100s at 1 GiB (blocks of 128 MiB) the out-of-place
    column is longer by that copy, 2 x 128 MiB read and written at the H100's published 3.35 TB/s: 80.13 us."""
    out = tmp_path / "out"
    argv = ["nccl-tests", "hypercube_perf", "--topology", _dgx(tmp_path, 8), "-b", "1G", "-e", "1G", "-n", "1"]
    assert main([*argv, "-w", "0", "--out", str(out)]) == 0
    capsys.readouterr()
    (line,) = json.loads((out / S.RESULTS_JSON).read_text())["sizes"]
    copy_us = 2 * 128 * MiB / 3.35e12 * 1e6
    assert line["time_us"] - line["inplace_time_us"] == pytest.approx(copy_us, abs=0.01)
