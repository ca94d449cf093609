"""NCCL_TESTS_SPLIT_MASK / NCCL_TESTS_SPLIT: nccl-tests' processes split into communicators that run at once.

The colours are nccl-tests' own (src/common.cu `run`: strtoul base 16 for the mask; AND/&, OR/|, MOD/%, DIV// with
parseInt for the split); the times are checked against the links' closed-form bound and against the -a rule of
nccl-tests' Allreduce (mean, min, max over the processes; process 0's with -a 0)."""

from __future__ import annotations

import pytest

from phantora.cli import main
from phantora.errors import InputError
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.report import nccl_tests as nt
from phantora.report import nccl_tests_split as ns
from phantora.topology import load_topology


@pytest.mark.parametrize(
    ("env", "colors"),
    [({"NCCL_TESTS_SPLIT_MASK": "0x7"}, [p & 7 for p in range(16)]),
     ({"NCCL_TESTS_SPLIT_MASK": "7"}, [p & 7 for p in range(16)]),  # base 16 without 0x
     ({"NCCL_TESTS_SPLIT_MASK": "10"}, [p & 16 for p in range(16)]),  # "10" is 16 in base 16
     ({"NCCL_TESTS_SPLIT_MASK": "zz"}, [0] * 16),  # strtoul reads nothing: mask 0
     ({"NCCL_TESTS_SPLIT": "AND 0x3"}, [p & 3 for p in range(16)]),
     ({"NCCL_TESTS_SPLIT": "&3"}, [p & 3 for p in range(16)]),
     ({"NCCL_TESTS_SPLIT": "and0b11"}, [p & 3 for p in range(16)]),  # case-insensitive, 0b binary
     ({"NCCL_TESTS_SPLIT": "OR 1"}, [p | 1 for p in range(16)]),
     ({"NCCL_TESTS_SPLIT": "%4"}, [p % 4 for p in range(16)]),
     ({"NCCL_TESTS_SPLIT": "MOD 010"}, [p % 8 for p in range(16)]),  # base 0: a leading 0 is octal
     ({"NCCL_TESTS_SPLIT": "DIV 8"}, [p // 8 for p in range(16)]),
     ({"NCCL_TESTS_SPLIT": "/6"}, [p // 6 for p in range(16)]),
     ({"NCCL_TESTS_SPLIT": "bogus"}, [0] * 16),  # no test matches: colour 0
     ({"NCCL_TESTS_SPLIT_MASK": "0x1", "NCCL_TESTS_SPLIT": "DIV 8"}, [p & 1 for p in range(16)]),  # the mask wins
     ({}, None)],
)  # fmt: skip
def test_colours_are_nccl_tests_own(env: dict[str, str], colors: list[int] | None) -> None:
    assert ns.split_colors(env, 16) == colors


def test_a_split_by_zero_is_an_error_naming_the_variable() -> None:
    with pytest.raises(InputError) as err:
        ns.split_colors({"NCCL_TESTS_SPLIT": "MOD 0"}, 8)
    assert err.value.field == "NCCL_TESTS_SPLIT"


def test_communicators_hold_their_processes_gpus_process_0s_first() -> None:
    split = ns.split_run([1, 0, 1, 0], tuple(range(8)), 2)  # 4 processes of 2 GPUs (-g 2)
    assert split.groups == ((0, 1, 4, 5), (2, 3, 6, 7)) and split.procs == (2, 2)


def _rows(out: str) -> list[list[str]]:
    return [ln.split() for ln in out.splitlines() if ln and not ln.startswith("#")]


def test_rail_pairs_that_share_no_link_each_take_a_lone_pairs_time() -> None:
    """rail128's first two hosts, NCCL_TESTS_SPLIT_MASK=0x7: 8 pairs (GPU i of each host), each on its own two
    400G NICs and rail leaf i. Run at once, every pair's time equals that pair's alone: they share no link."""
    topo = load_topology("rail128")
    benches = [nt.Bench(nt.find_test("all_reduce"), topo, (i, i + 8), "float", iters=2, warmup=0) for i in range(8)]
    sim = make_engine(EngineSpec(), topo)
    together = ns.bench_split(benches, sim, 16 << 20)
    sim.close()
    alone_bench = nt.Bench(nt.find_test("all_reduce"), topo, (3, 11), "float", iters=2, warmup=0)
    sim = make_engine(EngineSpec(), topo)
    alone = nt.bench_size(alone_bench, sim, 16 << 20)
    sim.close()
    for r in together:
        assert r.time_ns == pytest.approx(alone.time_ns, rel=1e-3)


def test_pairs_across_an_oversubscribed_uplink_share_it(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """twoleaf8 (hosts 0-3 and 4-7 on two leaves, one 100G uplink each): NCCL_TESTS_SPLIT="MOD 4" makes 4 pairs
    (p, p + 4) that all cross the uplink at once. A 2-rank all-reduce sends S each way, so 4 of them need 4 S over
    12.5 GB/s: busbw (= algbw for 2 ranks) at most 12.5 / 4 GB/s, and close to it at 64 MiB."""
    monkeypatch.setenv("NCCL_TESTS_SPLIT", "MOD 4")
    argv = ["nccl-tests", "all_reduce_perf", "--topology", "twoleaf8", "-b", "64M", "-e", "64M", "-n", "2", "-w", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (row,) = _rows(out)
    busbw = float(row[7])
    assert 0.9 * 12.5 / 4 <= busbw <= 12.5 / 4
    assert "#  Rank  5 Group  1 " in out  # process 5's colour, 5 % 4
    monkeypatch.delenv("NCCL_TESTS_SPLIT")
    assert main(argv[:2] + ["--np", "2", *argv[2:]]) == 0  # one pair alone on a leaf: no uplink, far faster
    (lone,) = _rows(capsys.readouterr().out)
    assert float(lone[7]) > 2 * busbw


def test_a_combines_unequal_communicators_as_nccl_tests_allreduce(
    capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """NCCL_TESTS_SPLIT="DIV 6" on 8 GPUs: a 6-rank and a 2-rank communicator. -a 0 prints process 0's time (the
    6-rank one's), -a 2 the minimum, -a 3 the maximum, -a 1 the mean over the 8 processes: (6 t6 + 2 t2) / 8;
    the size, count and busbw factor stay process 0's communicator's (6 ranks)."""
    monkeypatch.setenv("NCCL_TESTS_SPLIT", "DIV 6")
    base = ["nccl-tests", "all_gather_perf", "-b", "96M", "-e", "96M", "-n", "2", "-w", "0"]
    times = {}
    for a in (0, 1, 2, 3):
        assert main([*base, "-a", str(a)]) == 0
        (row,) = _rows(capsys.readouterr().out)
        times[a] = float(row[5])
        size, count = int(row[0]), int(row[1])
        assert count == (96 << 20) // 4 // 6 // 4 * 4 and size == count * 4 * 6  # 16-byte multiples of 6 ranks
        assert float(row[7]) == pytest.approx(size / 1e3 / times[a] * 5 / 6, abs=0.02)
    t6 = times[0]
    t2 = times[3] if times[2] == t6 else times[2]
    assert t6 != t2 and times[2] == min(t6, t2) and times[3] == max(t6, t2)
    assert times[1] == pytest.approx((6 * t6 + 2 * t2) / 8, abs=0.02)


def test_one_colour_runs_the_world_and_prints_it(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """NCCL_TESTS_SPLIT="OR 3" on 4 processes: every colour 3, one communicator: the table of no split, with
    Group 3 on every device line."""
    argv = ["nccl-tests", "all_reduce_perf", "--np", "4", "-b", "1M", "-e", "1M", "-n", "2", "-w", "0"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    monkeypatch.setenv("NCCL_TESTS_SPLIT", "OR 3")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert _rows(out)[0][:13] == _rows(plain)[0][:13]
    assert out.count(" Group  3 ") == 4


def test_per_iteration_reports_of_a_split_are_refused(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("NCCL_TESTS_SPLIT_MASK", "1")
    assert main(["nccl-tests", "all_reduce_perf", "--np", "4", "-b", "1M", "-e", "1M", "-I", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "-I" in err[0] and "NCCL_TESTS_SPLIT" in err[0]


@pytest.mark.parametrize(("split", "root"), [("DIV 6", "-1"), ("DIV 6", "3"), ("MOD 4", "2")])
def test_a_root_not_on_every_communicator_is_refused_before_the_table(
    split: str, root: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """broadcast.cu loops -r -1 over each communicator's own ranks (unequal ones never meet at the world's
    barriers), and NCCL refuses a root a communicator lacks: one line naming -r, nothing on stdout."""
    monkeypatch.setenv("NCCL_TESTS_SPLIT", split)
    assert main(["nccl-tests", "broadcast_perf", "-r", root, "-b", "1K", "-e", "1K", "-n", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "'-r'" in captured.err


def test_the_packet_engine_shares_the_uplink_too(ns3_lib, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """The uplink test through ns-3 (no CC): the 4 pairs' busbw is the uplink's share, 12.5 / 4 GB/s, times the
    goodput of a link carrying data both ways: 1000 B of payload in a 1048-byte packet plus a 48-byte ACK of the
    other direction's packet (docs/nccl-tests.md, the ACK stream)."""
    monkeypatch.setenv("NCCL_TESTS_SPLIT", "MOD 4")
    argv = ["nccl-tests", "all_reduce_perf", "--topology", "twoleaf8", "--network", "ns3", "-b", "16M", "-e", "16M"]
    assert main([*argv, "-n", "2", "-w", "0"]) == 0
    (row,) = _rows(capsys.readouterr().out)
    bound = 12.5 / 4 * 1000 / 1096
    assert 0.95 * bound <= float(row[7]) <= bound


def _line(iters: list[int], inplace: list[int] | None = None) -> nt.SizeResult:
    return nt.SizeResult(size=1024, count=256, nbytes=1024, iter_ns=iters, factor=1.0, inplace_ns=inplace,
                         launch_ns=5, blocking=True)  # fmt: skip


@pytest.mark.parametrize(
    ("average", "want_ns"),
    [(0, 300), (1, (6 * 300 + 2 * 100) / 8), (2, 100), (3, 300), (4, 2 * (6 * 300 + 2 * 100))],
)
def test_average_is_nccl_tests_allreduce_over_every_thread(average: int, want_ns: float) -> None:
    """Two communicators, process 0's of 6 processes (mean call 300 ns) and one of 2 (100 ns), 2 threads each:
    common.cu's Allreduce takes process 0's thread 0's (-a 0), the sum over the 16 threads over 16 (1), the
    minimum (2), the maximum (3), the sum (4); the in-place group alike; -C's host time stays process 0's."""
    six, two = _line([280, 320], [290, 330]), _line([90, 110])
    got = ns.combined([six, two], (6, 2), 2, average)
    assert got.time_ns == pytest.approx(want_ns)
    want_inplace = {0: 310, 1: (6 * 310 + 2 * 100) / 8, 2: 100, 3: 310, 4: 2 * (6 * 310 + 2 * 100)}[average]
    assert got.in_place().time_ns == pytest.approx(want_inplace)
    assert got.cpu_time_us == pytest.approx(0.300) and got.in_place().cpu_time_us == pytest.approx(0.310)
    assert got.iter_us() == six.iter_us() and got.in_place().iter_us() == six.in_place().iter_us()  # -I: its own
    assert got.comm_ns == [300, 100] and (got.size, got.count) == (1024, 256)


@pytest.mark.parametrize("average", [-1, 5])
def test_an_average_nccl_tests_has_no_op_for_is_refused(average: int) -> None:
    with pytest.raises(InputError, match="-a"):
        ns.combine_times([1.0], (1,), 1, average)


def test_a4_sums_every_thread_of_every_process_without_a_split(capsys: pytest.CaptureFixture[str]) -> None:
    """One communicator of 2 processes x 2 threads: -a 0-3 print its time, -a 4 the sum over its 4 threads (4x
    the time, a quarter of the bandwidths); -a 7 is one line naming -a and no table."""
    base = ["nccl-tests", "all_reduce_perf", "--np", "2", "-t", "2", "-b", "1M", "-e", "1M", "-n", "2", "-w", "0"]
    rows = {}
    for a in (1, 3, 4):
        assert main([*base, "-a", str(a)]) == 0
        (rows[a],) = _rows(capsys.readouterr().out)
    assert rows[3][5:8] == rows[1][5:8]
    assert float(rows[4][5]) == pytest.approx(4 * float(rows[1][5]), rel=2e-3)
    assert float(rows[4][7]) == pytest.approx(float(rows[1][7]) / 4, abs=0.02)
    assert main([*base, "-a", "7"]) == 2
    got = capsys.readouterr()
    assert got.out.strip() == "" and len(got.err.strip().splitlines()) == 1 and "-a" in got.err
