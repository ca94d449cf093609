"""`phantora nccl-tests` output read as a researcher reads a cluster's: the same column rules parse a published
nccl-tests output (tests/data/nccl_tests/, SOURCES.md) and ours; nccl-tests' -c, -d all, -o all, -r -1, -m, -z,
-G and -N; one-line errors with the nearest valid name."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import main
from phantora.collectives.nccl.empty_call import EMPTY_CALL_US
from phantora.errors import InputError
from phantora.report import nccl_tests as nt
from phantora.report.host_launch import host_launch_us
from phantora.results import schema as S

PUBLISHED = Path(__file__).parent / "data" / "nccl_tests" / "h100_16gpu_2node_gcp_a3mega_all_reduce_a3megafork.txt"
# the parameter line and a device line as nccl-tests writes them (util.cu: writeDeviceReport, parseRankInfo)
PARAMS = re.compile(
    r"^# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\) warmup iters: (\d+) "
    r"iters: (\d+) agg iters: (\d+) validation: (\d+) graph: (\d+)"
)
DEVICE = re.compile(r"^#  Rank\s+(\d+) Group\s+(\d+) Pid\s+(\d+) on\s+(\S+) device\s+(\d+) \[([^\]]+)\] (.+)$")
ELT = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
       "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}  # fmt: skip


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str
    root: int
    groups: list[tuple[float, float, float, str]]  # (time, algbw, busbw, #wrong): out-of-place, in-place


@dataclass
class Table:
    params: tuple[str, ...]
    devices: list[tuple[str, ...]]
    heading: list[str]
    rows: list[Row]
    avg_busbw: float


def parse(text: str) -> Table:
    """What a user's script does with nccl-tests output: '#' lines are comments, except the parameter line, the
    device lines, the column heading and the bus-bandwidth trailer; every other non-empty line is a row of 13
    whitespace-separated fields (anything after them must be a '#' comment)."""
    params, devices, heading, rows, avg = None, [], [], [], None
    for line in text.splitlines():
        if m := PARAMS.match(line):
            params = m.groups()
        elif m := DEVICE.match(line):
            devices.append(m.groups())
        elif line.startswith("#") and "size" in line.split() and "count" in line.split():
            heading = line.split()
        elif line.startswith("# Avg bus bandwidth"):
            avg = float(line.split(":")[1].split()[0])  # then OK or FAILED under NCCL_TESTS_MIN_BW
        elif line.strip() and not line.startswith("#"):
            f = line.split()
            assert len(f) == 13 or f[13].startswith("#"), line
            groups = [(float(f[i]), float(f[i + 1]), float(f[i + 2]), f[i + 3]) for i in (5, 9)]
            rows.append(Row(int(f[0]), int(f[1]), f[2], f[3], int(f[4]), groups))
    assert params is not None and avg is not None
    return Table(params, devices, heading, rows, avg)


def _busbw_mean(rows: list[Row]) -> float:
    vals = [g[2] for r in rows for g in r.groups]
    return sum(vals) / len(vals)


def test_a_published_output_parses_and_its_trailer_is_the_mean_of_both_groups() -> None:
    """The rules hold on a real output: 16 ranks, 31 rows of 13 fields; its busbw is algbw x 2(n-1)/n and its
    "Avg bus bandwidth" the mean busbw over both column groups (each to the printed rounding)."""
    t = parse(PUBLISHED.read_text())
    assert len(t.devices) == 16 and len(t.rows) == 31 and t.params[:2] == ("1", "1")
    assert t.avg_busbw == pytest.approx(_busbw_mean(t.rows), abs=0.001)
    for r in t.rows:
        for _time, algbw, busbw, wrong in r.groups:
            assert wrong == "0"
            if algbw >= 10:
                assert busbw == pytest.approx(algbw * 2 * 15 / 16, rel=0.005 / 10 + 0.005 / busbw)


def test_our_output_parses_with_the_same_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Our table through the same parser: the published heading tokens, 13 fields (the NCCL choice after them as a
    '#' comment), busbw = algbw x 2(n-1)/n, the trailer the mean of both groups, nccl-tests' closing lines."""
    out = tmp_path / "out"
    argv = ["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1M", "-f", "32", "-g", "4", "-n", "2", "-w", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    t, published = parse(text), parse(PUBLISHED.read_text())
    assert t.heading == published.heading
    assert t.params == ("1", "4", "1024", "1048576", "32", "factor", "1", "2", "1", "1", "0")
    assert [d[0] for d in t.devices] == ["0", "1", "2", "3"] and {d[2] for d in t.devices} == {t.devices[0][2]}
    assert [r.size for r in t.rows] == [1024, 32768, 1048576] and [r.count for r in t.rows] == [256, 8192, 262144]
    for r in t.rows:
        assert (r.type, r.redop, r.root) == ("float", "sum", -1) and r.groups[0] == r.groups[1]
        time_us, algbw, busbw, wrong = r.groups[0]
        assert wrong == "0" and algbw == pytest.approx(r.size / time_us / 1e3, abs=0.006)
        assert busbw == pytest.approx(algbw * 1.5, abs=0.005 * 1.5 + 0.005)
    assert t.avg_busbw == pytest.approx(_busbw_mean(t.rows), abs=0.01)
    lines = text.splitlines()
    assert lines[0].startswith("# nccl-tests version 2.19.6 nccl-headers=")
    assert lines[-3:] == ["# Collective test concluded: all_reduce_perf", "#", ""]
    choice = [ln.split("  # ", 1)[1] for ln in lines if ln and not ln.startswith("#")]
    assert all(c.startswith("algorithm=") and " protocol=" in c and " channels=" in c for c in choice)
    data = json.loads((out / S.RESULTS_JSON).read_text())
    assert [rec["choice"]["algorithm"] for rec in data["sizes"]] == [c.split()[0].split("=")[1] for c in choice]


def test_check_zero_prints_na_and_validation_zero(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["nccl-tests", "alltoall_perf", "-b", "64K", "-e", "64K", "-g", "2", "-n", "1", "-w", "0", "-c", "0"]
    assert main(argv) == 0
    t = parse(capsys.readouterr().out)
    assert t.params[9] == "0" and [g[3] for g in t.rows[0].groups] == ["N/A", "N/A"]


def test_all_types_ops_and_roots_follow_run_test_loops() -> None:
    """-d all: nccl-tests' 12 types on Hopper, without the two fp8 ones below compute capability 9.0; -o all: its
    6 ops, for tests with an op only; -r -1: every root, for rooted tests only; types outer, then ops, then roots."""
    ar, ag, bc, rd = (nt.TESTS[f"{n}_perf"] for n in ("all_reduce", "all_gather", "broadcast", "reduce"))
    assert nt.datatypes("all", 90) == list(ELT) and nt.datatypes("all", 80) == list(ELT)[:10]
    ops = nt.redops("all")
    assert ops == ["sum", "prod", "max", "min", "avg", "mulsum"]
    assert [(r.datatype, r.op, r.root) for r in nt.runs(ar, ["half", "float"], ops, 0, 8)] == [
        (t, o, -1) for t in ("half", "float") for o in ops
    ]
    assert [(r.op, r.root) for r in nt.runs(ag, ["float"], ops, 0, 8)] == [("none", -1)]
    assert [r.root for r in nt.runs(bc, ["float"], ops, -1, 4)] == [0, 1, 2, 3]
    assert [(r.op, r.root) for r in nt.runs(rd, ["float"], ["min", "max"], -1, 2)] == [
        ("min", 0), ("min", 1), ("max", 0), ("max", 1)
    ]  # fmt: skip
    for root in (-2, 4):
        with pytest.raises(InputError) as err:
            nt.runs(bc, ["float"], ["sum"], root, 4)
        assert err.value.field == "-r"


def test_every_datatype_and_op_prints_its_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """reduce_scatter_perf -d all -o all: a line per type and op, in that order; 1 KiB over 4 ranks is 256 bytes a
    rank, so the count printed is 256 / the type's size; busbw = algbw x 3/4 on each."""
    argv = ["nccl-tests", "reduce_scatter_perf", "-b", "1K", "-e", "1K", "-g", "4", "-n", "1", "-w", "0"]
    assert main([*argv, "-d", "all", "-o", "all"]) == 0
    t = parse(capsys.readouterr().out)
    assert [(r.type, r.redop) for r in t.rows] == [(d, o) for d in ELT for o in nt.REDOPS]
    for r in t.rows:
        assert (r.size, r.count) == (1024, 256 // ELT[r.type])
        _time, algbw, busbw, _wrong = r.groups[0]
        assert busbw == pytest.approx(algbw * 0.75, abs=0.005 * 0.75 + 0.005)


def _time(argv: list[str], capsys: pytest.CaptureFixture[str]) -> float:
    assert main(argv) == 0
    return parse(capsys.readouterr().out).rows[0].groups[0][0]


def test_blocking_graphs_and_groups_change_the_host_launch_as_nccl_tests_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """-g 8 puts 8 host launches (host_launch_us of the call's 24 channels each: h = 40.2 us) before each call.
    -G replays a graph: the GPU time g alone. -z 1: the host waits for each call, so each costs h + g. -m 4: one
    launch for 4 calls (h4: host_launch_us of the group's channels), which NCCL runs as one kernel on their
    aggregate (G, less than 4g: one latency; tests/test_nccl_coll_group.py): over 20 iterations
    (h4 + G + 19 max(h4, G)) / 20 / 4 a call."""
    base = ["nccl-tests", "all_gather_perf", "-b", "1M", "-e", "1M", "-g", "8", "-n", "20", "-w", "1"]
    h = 8 * host_launch_us(24)
    g = _time([*base, "-G", "1"], capsys)
    assert _time([*base, "-z", "1"], capsys) == pytest.approx(h + g, abs=0.02)
    assert main([*base, "-m", "4", "-G", "1"]) == 0
    out = capsys.readouterr().out
    big = 4 * parse(out).rows[0].groups[0][0]
    assert big < 4 * g
    h4 = 8 * host_launch_us(int(re.search(r" channels=(\d+)", out).group(1)))
    grouped = (h4 + big + 19 * max(h4, big)) / 20 / 4
    assert _time([*base, "-m", "4"], capsys) == pytest.approx(grouped, abs=0.02)


def test_run_cycles_repeat_the_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["nccl-tests", "sendrecv_perf", "-b", "4K", "-e", "16K", "-f", "4", "-g", "2", "-n", "2", "-N", "2"]
    assert main(argv) == 0
    rows = parse(capsys.readouterr().out).rows
    assert [r.size for r in rows] == [4096, 16384, 4096, 16384] and rows[:2] == rows[2:]


def test_warm_up_visits_doubling_sizes() -> None:
    assert nt.warmup_sizes(1000, 5000) == [1000, 2000, 4000]
    assert nt.warmup_sizes(8, 8) == [8] and nt.warmup_sizes(0, 64) == [0]


@pytest.mark.parametrize(
    ("extra", "field", "hint"),
    [
        (["all_reduce_perf", "-d", "flaot"], "-d", "did you mean float?"),
        (["all_reduce_perf", "-o", "summ"], "-o", "did you mean sum?"),
        (["allreduce"], "TEST", "did you mean all_reduce_perf?"),
        (["all_reduce_perf", "-z", "4"], "-z", "must be 0, 1, 2 or 3"),
        (["broadcast_perf", "-r", "-2"], "-r", "or -1: every root"),
        (["all_reduce_perf", "-m", "0"], "-m", "must be >= 1"),
        (["all_reduce_perf", "-N", "0"], "-N", "must be >= 1"),
    ],
)
def test_a_bad_value_is_one_line_with_the_nearest_valid_one(
    extra: list[str], field: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["nccl-tests", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"field '{field}'" in err and hint in err


@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        (["--report_cputme", "1"], "unknown option --report_cputme; did you mean --report_cputime?"),
        (["--maxbtyes", "1M"], "unknown option --maxbtyes; did you mean --maxbytes?"),
        (["-q", "3"], "unknown option -q"),
        (["-n", "x"], "argument -n/--iters: invalid int value: 'x'"),
        (["stray"], "unexpected argument 'stray'"),
    ],
)
def test_an_unknown_or_unsimulated_option_is_one_line(
    extra: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["nccl-tests", "all_reduce_perf", *extra])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == f"phantora nccl-tests: error: {err.split(': error: ')[1]}"
    assert err.count("\n") == 1 and hint in err


@pytest.mark.slow
@pytest.mark.parametrize("test", list(nt.TESTS))
def test_every_program_runs_on_ns3_as_on_the_flow_network_in_one_host(
    test: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Inside one NVSwitch host both engines carry the same flows on the same NVLink rates: each program prints
    the same table through ns-3 as through the flow network, to 5% (measured: equal on 8 GPUs, 1-64 KiB)."""
    pytest.importorskip("ns3", reason="the ns3 wheel is not installed")
    argv = ["nccl-tests", test, "-b", "64K", "-e", "64K", "-g", "4", "-n", "1", "-w", "0"]
    flow = parse(_run_text(argv, capsys)).rows
    packet = parse(_run_text([*argv, "--network", "ns3"], capsys)).rows
    assert [(r.size, r.count) for r in packet] == [(r.size, r.count) for r in flow]
    assert packet[0].groups[0][0] == pytest.approx(flow[0].groups[0][0], rel=0.05)


def _run_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_max_bytes_is_reduced_to_the_gpu_memory_as_nccl_tests_does(capsys: pytest.CaptureFixture[str]) -> None:
    """nccl-tests keeps (memory - min(ceil(memory / 16 GiB) GiB, 4 GiB) - 1 GiB) / 3 (/ 2 with -c 0) as maxBytes,
    and says so after the devices; its parameter line keeps the sizes asked for. An 80 GB H100: 24877096960."""
    gib = 1 << 30
    h100 = parse_topology_gpu("h100")
    assert nt.max_bytes_limit(h100, 1) == (80_000_000_000 - 4 * gib - gib) // 3 == 24877096960
    assert nt.max_bytes_limit(h100, 0) == (80_000_000_000 - 5 * gib) // 2
    argv = ["nccl-tests", "broadcast_perf", "-b", "16G", "-e", "64G", "-f", "4", "-g", "8", "-n", "1", "-w", "0"]
    text = _run_text(argv, capsys)
    assert "#\n# Reducing maxBytes to 24877096960 due to memory limitation\n#\n" in text
    t = parse(text)
    assert t.params[2:4] == (str(16 * gib), str(64 * gib)) and [r.size for r in t.rows] == [16 * gib]


def parse_topology_gpu(gpu: str) -> Any:
    from phantora.topology import dgx_host

    return dgx_host(8, gpu=gpu)


def test_an_empty_call_launches_nothing_as_nccl_discards_it(capsys: pytest.CaptureFixture[str]) -> None:
    """8 and 64 bytes of all_gather over 8 ranks round to 0 elements a rank: NCCL returns before it launches
    anything (enqueue.cc taskAppend), so the line is 0 bytes in the -g 8 thread's 8 empty calls, no launch
    (tests/test_nccl_tests_empty.py)."""
    argv = ["nccl-tests", "all_gather_perf", "-b", "8", "-e", "64", "-f", "8", "-g", "8", "-n", "2", "-w", "1"]
    rows = parse(_run_text(argv, capsys)).rows
    empty = round(8 * EMPTY_CALL_US, 2)
    assert [(r.size, r.count, r.groups[0][:3]) for r in rows] == [(0, 0, (empty, 0.0, 0.0))] * 2


def test_fp8_reductions_need_compute_capability_9(capsys: pytest.CaptureFixture[str]) -> None:
    """NCCL refuses fp8 reductions below sm90; fp8 all-gather is fine there."""
    base = ["-d", "f8e5m2", "--gpu", "a100", "-b", "1K", "-e", "1K", "-g", "2", "-n", "1", "-w", "0"]
    assert main(["nccl-tests", "reduce_scatter_perf", *base]) == 2
    err = capsys.readouterr().err
    assert "field '-d'" in err and "compute capability 9.0" in err and "8.0" in err
    assert [r.type for r in parse(_run_text(["nccl-tests", "all_gather_perf", *base], capsys)).rows] == ["f8e5m2"]
