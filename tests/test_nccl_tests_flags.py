"""nccl-tests 2.19.6's harness flags on `phantora nccl-tests`: -C -S -J -I -K -M -u -p -y -T -R -x -D -V, checked
against nccl-tests' source (src/common.cu's options and checks, src/util.cu's format strings and JSON keys, quoted
below as the reference) and against closed forms of the host-launch model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from phantora.cli import build_parser, main
from phantora.report import nccl_tests as nt
from phantora.report import nccl_tests_flags as nf
from phantora.report import nccl_tests_json as nj
from phantora.report.host_launch import host_launch_us
from phantora.report.nccl_tests_iters import cpu_time_ns, event_intervals, iter_stats, percentile_index
from phantora.report.nccl_tests_memory import mem_string, memory_line, user_allocated

# common.cu's longopts: every long name and its short letter
LONGOPTS = {
    "nthreads": "t", "ngpus": "g", "minbytes": "b", "maxbytes": "e", "stepbytes": "i", "stepfactor": "f",
    "iters": "n", "agg_iters": "m", "warmup_iters": "w", "run_cycles": "N", "parallel_init": "p", "check": "c",
    "op": "o", "datatype": "d", "root": "r", "blocking": "z", "stream_null": "y", "timeout": "T", "cudagraph": "G",
    "report_cputime": "C", "report_timestamps": "S", "output_file": "J", "average": "a", "local_register": "R",
    "cta_policy": "x", "device_implementation": "D", "device_cta_count": "V", "memory": "M", "unalign": "u",
    "per_iter_timing": "I", "per_iter_skip": "K",
}  # fmt: skip
# util.cu's writeResultHeader, with and without -I (C's %*s is Python's too)
HEAD_GROUPS = "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
HEAD_ROW = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
ITER_GROUPS = (
    "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                in-place "
    "(+ per-iteration)"
)
ITER_ROW = (
    "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s %*s"
)
# util.cu's JSON keys, in the order it writes them
TOP_KEYS = ["version", "start_time", "args", "env", "nccl_version", "config", "results", "out_of_bounds",
            "average_bus_bandwidth", "errors", "end_time"]  # fmt: skip
CONFIG_KEYS = ["nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "step_factor", "warmup_iters", "iterations",
               "aggregated_iterations", "validation", "graph", "blocking_collectives", "per_iter_timing",
               "per_iter_skip", "parallel_init", "devices"]  # fmt: skip
DEVICE_KEYS = ["rank", "group", "pid", "hostname", "device", "device_hex", "device_info"]
RESULT_KEYS = ["size", "count", "type", "redop", "root", "out_of_place", "in_place", "actual_iterations",
               "experiment_name"]  # fmt: skip
BODY_KEYS = ["time", "alg_bw", "bus_bw", "nwrong"]
PER_ITER_KEYS = ["skipped_iterations", "min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us", "stdev_us",
                 "cv_pct", "times_us"]  # fmt: skip
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
H8 = 8 * host_launch_us(24)  # -g 8: one thread launches 8 GPUs' calls of 24 channels (1 MiB all-gather)
GATHER = ["nccl-tests", "all_gather_perf", "-b", "1M", "-e", "1M", "-g", "8", "-n", "4", "-w", "0"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    rc = main(argv)
    got = capsys.readouterr()
    return rc, got.out.splitlines(), got.err


def _rows(lines: list[str]) -> list[list[str]]:
    return [ln.split("  # ")[0].split() for ln in lines if ln and not ln.startswith("#")]


# ----- parsing ------------------------------------------------------------------------------------------


def test_every_long_option_of_nccl_tests_is_taken_with_its_short_letter() -> None:
    p = build_parser()
    for long, short in LONGOPTS.items():
        value = "x.json" if short == "J" else ("8" if short in "bei" else "1")
        value = {"d": "float", "o": "sum"}.get(short, value)
        by_long = p.parse_args(["nccl-tests", "all_reduce_perf", f"--{long}", value])
        by_short = p.parse_args(["nccl-tests", "all_reduce_perf", f"-{short}{value}"])  # getopt's -b8 form too
        assert getattr(by_long, long) == getattr(by_short, long), long


def test_defaults_are_nccl_tests_defaults() -> None:
    args = build_parser().parse_args(["nccl-tests", "all_reduce_perf"])
    assert (args.report_cputime, args.report_timestamps, args.output_file, args.per_iter_timing) == (0, 0, None, 0)
    assert (args.per_iter_skip, args.memory, args.unalign, args.parallel_init, args.stream_null) == (0, 0, 0, 0, 0)
    assert (args.timeout, args.local_register, args.cta_policy, args.device_implementation) == (0, 0, -1, 0)
    assert args.device_cta_count == 16


# ----- -C, -I, -K: closed forms -------------------------------------------------------------------------


def test_cpu_time_is_the_launch_loop_and_events_bracket_each_iteration() -> None:
    """Host-bound (launch h = 10 > GPU g = 4): the loop's CPU time is n x h, the events after the first are h apart
    (the first holds its launch: h + g). GPU-bound (g = 30): the events are g apart after the first. Blocking: each
    iteration is h + g and the CPU waits through all of them. Every case sums to the loop's end."""
    assert cpu_time_ns([14, 10, 10], 10, blocking=False) == 30
    assert event_intervals([4, 4, 4], 10, blocking=False) == [14, 10, 10]
    assert event_intervals([30, 30, 30], 10, blocking=False) == [40, 30, 30]
    assert event_intervals([4, 4], 10, blocking=True) == [14, 14] and cpu_time_ns([14, 14], 10, True) == 28
    bound = nt.launch_bound([4, 30, 4, 4], 10)
    assert sum(event_intervals([4, 30, 4, 4], 10, blocking=False)) == sum(bound) == 10 + 4 + 30 + 4 + 4 + 6


def test_iteration_stats_are_computeiterstats() -> None:
    """Nearest-rank percentiles: ceil(n p / 100) - 1, capped at n - 1 (p99 of 10 samples is the max); p50 the upper
    median; the population standard deviation."""
    st = iter_stats([float(t) for t in range(100, 0, -1)])
    assert (st.min, st.max, st.p50, st.p95, st.p99, st.avg) == (1, 100, 51, 95, 99, 50.5)
    assert st.stdev == pytest.approx(math.sqrt((100**2 - 1) / 12))
    assert st.cv_pct == pytest.approx(st.stdev / 50.5 * 100)
    assert percentile_index(10, 99) == 9 and iter_stats([1.0] * 10).cv_pct == 0


def test_c_1_prints_the_hosts_launch_time_and_keeps_the_bandwidths(capsys: pytest.CaptureFixture[str]) -> None:
    """-g 8 at 1 MiB is launch-bound: nccl-tests' -C time is the 8 launches per call (8 x 5.028 us), its
    bandwidths those of the measured time; under -z 1 the host waits in the loop, so -C prints the time itself."""
    _, base, _ = _run(GATHER, capsys)
    _, cpu, _ = _run([*GATHER, "-C", "1"], capsys)
    assert HEAD_ROW % ("size", "count", "type", "redop", "root", "cputime", "algbw", "busbw", "#wrong", "cputime",
                       "algbw", "busbw", "#wrong", 0, "") in cpu  # fmt: skip
    (b,), (c,) = _rows(base), _rows(cpu)
    assert float(c[5]) == pytest.approx(H8, abs=0.006) and float(c[9]) == float(c[5])
    assert c[6:9] == b[6:9] and float(b[5]) > H8
    _, blocking, _ = _run([*GATHER, "-z", "1", "-C", "1"], capsys)
    _, blocking_time, _ = _run([*GATHER, "-z", "1"], capsys)
    assert _rows(blocking)[0][5] == _rows(blocking_time)[0][5]


def test_i_prints_per_iteration_columns_and_k_skips_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    """-I 1 -K 1 on the launch-bound run: after the first iteration (its launch plus the GPU's time) every
    iteration is one launch period h apart, so i_min = i_max = i_p99 = h and i_cv% = 0; the header is util.cu's."""
    rc, lines, _ = _run([*GATHER, "-I", "1", "-K", "1"], capsys)
    assert rc == 0
    assert "# Per-Iteration Report: CUDA event timing; i_* uses max over process rows; summary skips first 1 " \
        "iterations " in lines  # fmt: skip
    assert ITER_GROUPS % ("", "", "", "", "") in lines
    names = ("time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%")
    assert ITER_ROW % ("size", "count", "type", "redop", "root", *names, *names, 0, "") in lines
    units = ("(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)")
    assert ITER_ROW % ("(B)", "(elements)", "", "", "", *units, *units, 0, "") in lines
    (row,) = _rows(lines)
    assert len(row) == 21
    for at in (9, 17):
        assert [float(v) for v in row[at : at + 3]] == pytest.approx([H8] * 3, abs=0.006) and row[at + 3] == "0.00"
    _, unskipped, _ = _run([*GATHER, "-I", "1"], capsys)
    assert float(_rows(unskipped)[0][10]) > H8 + 1  # i_max: the first iteration, h + the GPU's time


@pytest.mark.parametrize(
    ("extra", "warning", "per_iter"),
    [
        (["-I", "2"], "per-iteration timing (-I) only supports 0=off or 1=on. Disabling.", None),
        (["-I", "1", "-G", "1"], "per-iteration timing (-I) is incompatible with CUDA graph mode (-G). Disabling.",
         None),
        (["-z", "3", "-G", "1"], "blocking mode (-z 3) is incompatible with CUDA graph mode (-G). Disabling.", None),
        (["-I", "1", "-K", "4"], "per-iteration skip (-K) must be between 0 and 3. Disabling.",
         "# Per-Iteration Report: CUDA event timing; i_* uses max over process rows "),
        (["-K", "1"], "per-iteration skip (-K) requires per-iteration timing (-I 1). Disabling.", None),
        (["-V", "0"], "device_cta_count (-V) must be positive and less than 128, got 0. Using default value 16.",
         None),
    ],
)  # fmt: skip
def test_values_nccl_tests_disables_warn_as_it_does_and_run(
    extra: list[str], warning: str, per_iter: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, err = _run([*GATHER, *extra], capsys)
    assert rc == 0 and warning in err.splitlines()
    assert [ln for ln in lines if ln.startswith(("# Per-Iteration", "# Blocking"))] == ([per_iter] if per_iter else [])
    assert len(_rows(lines)[0]) == (21 if per_iter else 13)


@pytest.mark.parametrize(
    ("extra", "field", "text"),
    [
        (["-D", "1"], "-D", "device implementation (-D > 0) requires enabling symmetric memory registration (-R 2)"),
        (["-D", "1", "-R", "2"], "-D", "device API kernels (NCCL's device communicators) are not modelled"),
        (["-y", "1", "-G", "1"], "-y", "cannot capture a graph (-G) on the NULL stream (-y 1)"),
        (["-C", "1", "-G", "1"], "-C", "graph launch (-G) is not modelled"),
        (["-u", "-1"], "-u", "must be >= 0"),
    ],
)
def test_what_nccl_tests_stops_on_or_phantora_does_not_model_is_one_line(
    extra: list[str], field: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, err = _run([*GATHER, *extra], capsys)
    assert rc == 2 and not lines and err.count("\n") == 1
    assert text in err and f"field '{field}'" in err


def test_p_y_t_and_the_default_cta_policy_change_no_time(capsys: pytest.CaptureFixture[str]) -> None:
    """-p adds nccl-tests' line only; -y, -T, -x 0 (NCCL's default policy) and -x -1 (not set) nothing."""
    _, base, _ = _run(GATHER, capsys)
    _, other, _ = _run([*GATHER, "-p", "1", "-y", "1", "-T", "5", "-x", "0", "-V", "32"], capsys)
    assert "# Parallel Init Enabled: threads call into NcclInitRank concurrently " in other
    assert _rows(other) == _rows(base)


def test_s_adds_a_timestamp_column(capsys: pytest.CaptureFixture[str]) -> None:
    _, lines, _ = _run([*GATHER, "-S", "1"], capsys)
    names = ("time", "algbw", "busbw", "#wrong")
    assert HEAD_ROW % ("size", "count", "type", "redop", "root", *names, *names, 19, "timestamp") in lines
    units = ("(us)", "(GB/s)", "(GB/s)", "")
    assert HEAD_ROW % ("(B)", "(elements)", "", "", "", *units, *units, 19, "%Y-%m-%d %H:%M:%S") in lines
    (line,) = [ln for ln in lines if ln and not ln.startswith("#")]
    table = line.split("  # ")[0]
    assert table[-21:-19] == "  " and STAMP.match(table[-19:])


# ----- -M, -u -------------------------------------------------------------------------------------------


def test_memory_line_is_writememinfo_of_the_buffers_nccl_tests_allocates() -> None:
    """Send and receive buffers of maxBytes + 8 x unalign and the expected buffer (with -c), each rounded to 2 MiB:
    32 MiB all-reduce 3 x 32 MiB = 96 MiB; -c 0 64 MiB; -u 1 2 x 34 + 32 = 100 MiB; an all-gather of 1000 B on 8
    ranks 3 x 2 MiB (its receive buffer is 8 x 112 B)."""
    mib = 1 << 20
    assert user_allocated("full", "all_reduce", 32 * mib, 8, 0, 1) == 96 * mib
    assert user_allocated("full", "all_reduce", 32 * mib, 8, 0, 0) == 64 * mib
    assert user_allocated("full", "all_reduce", 32 * mib, 8, 1, 1) == 100 * mib
    assert user_allocated("per_rank", "all_gather", 1000, 8, 0, 1) == 6 * mib
    assert [mem_string(v) for v in (0, 1536, 96 * mib, 100 * mib, 10 << 30)] == [
        "0.00 B", "1.50 KB", "96.0 MB", "100 MB", "10.0 GB"]  # fmt: skip
    assert memory_line(96 * mib) == (
        "# GPU memory usage     : Initialization N/A | User-Allocated 96.0 MB | Collective N/A | Total  N/A"
    )


def test_m_and_u_in_the_output(capsys: pytest.CaptureFixture[str]) -> None:
    """-M prints its line after "Collective test concluded"; -u prints in the parameter line and changes no time."""
    argv = ["nccl-tests", "all_reduce_perf", "-b", "32M", "-e", "32M", "-g", "2", "-n", "2", "-w", "0"]
    _, base, _ = _run(argv, capsys)
    _, lines, _ = _run([*argv, "-M", "1", "-u", "1"], capsys)
    assert lines[-3:] == [memory_line(100 << 20), "#", ""] and lines[-4].startswith("# Collective test concluded")
    assert any(ln.startswith("# nThread 1 nGpus 2") and ln.endswith("unalign: 1") for ln in lines)
    assert _rows(lines) == _rows(base)


# ----- -J -----------------------------------------------------------------------------------------------


def test_j_writes_nccl_tests_json_with_its_keys_and_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text("taken")
    argv = [*GATHER, "--np", "2", "-g", "4", "-I", "1", "-C", "1", "-J", "r.json"]
    rc, lines, _ = _run(argv, capsys)
    assert rc == 0 and lines[0] == "# Writing JSON output to r.json.0"  # fopen "wx": an existing file is kept
    assert (tmp_path / "r.json").read_text() == "taken"
    text = (tmp_path / "r.json.0").read_text()
    doc = json.loads(text)
    assert list(doc) == TOP_KEYS and doc["version"] == 3 and doc["nccl_version"] == nt.NCCL_VERSION_CODE
    assert doc["args"][-2:] == ["-J", "r.json"] and STAMP.match(doc["start_time"]) and doc["errors"] == [""]
    conf = doc["config"]
    assert list(conf) == [k if k != "step_factor" else "step_bytes" for k in CONFIG_KEYS]
    assert (conf["blocking_collectives"], conf["per_iter_timing"], conf["ngpus"]) == ("false", "true", 4)
    assert [list(d) for d in conf["devices"]] == [DEVICE_KEYS] * 2  # a process's first GPU each: ranks 0 and 4
    assert [d["rank"] for d in conf["devices"]] == [0, 4] and conf["devices"][0]["device_info"].startswith("NVIDIA")
    (res,) = doc["results"]
    order = ["out_of_place", "out_of_place_per_iter", "in_place", "in_place_per_iter"]
    assert list(res) == RESULT_KEYS[:5] + order + RESULT_KEYS[7:] and res["root"] == "    -1"
    assert list(res["out_of_place"]) == ["cpu_time", *BODY_KEYS[1:]]
    per_iter = res["in_place_per_iter"]
    assert list(per_iter) == [*PER_ITER_KEYS, "per_process_max_times_us"] and len(per_iter["times_us"]) == 4
    assert per_iter["per_process_max_times_us"] == [per_iter["times_us"]] * 2  # a row per mpirun process
    row = _rows(lines)[0]
    assert res["size"] == int(row[0]) and f"{res['out_of_place']['alg_bw']:.2f}" == row[6]
    assert doc["out_of_bounds"] == {"count": 0, "okay": "true"}
    assert doc["average_bus_bandwidth"]["okay"] == "unchecked"
    assert not re.search(r'[]}"\d], "|": ', text) and re.search(r'"alg_bw":\d+\.\d{6},', text)  # no spaces; %lf


def test_j_writes_only_json_names_and_says_when_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, lines, err = _run([*GATHER, "-c", "0", "-J", "out.txt"], capsys)
    assert rc == 0 and not (tmp_path / "out.txt").exists() and "nothing written" in err
    assert lines[0].startswith("# nccl-tests version")
    _, lines, _ = _run([*GATHER, "-c", "0", "-J", "no/such/dir/x.json"], capsys)
    assert lines[0] == "# skipping json output; no/such/dir/x.json not accessible"
    _, lines, _ = _run([*GATHER, "-c", "0", "--output_file", "c.json"], capsys)
    res = json.loads((tmp_path / "c.json").read_text())["results"][0]
    assert res["in_place"]["nwrong"] is None and list(res["in_place"]) == BODY_KEYS  # -c 0: null


def test_json_text_is_the_writers() -> None:
    assert nj.encode({"a/b": [1, nj.Double(0.5), None, True, "x\ty"]}) == '{"a\\/b":[1,0.500000,null,"true","x\\ty"]}'
    assert nj.encode(float("nan")) == '"nan"'
    assert nj.is_json_name("a.JSON") and not nj.is_json_name("a.json/b") and not nj.is_json_name("x.")


@pytest.mark.parametrize(
    ("text", "value"),
    [("8", 8), ("010", 8), ("0x10", 16), ("0X1f", 31), ("0", 0), ("-1", -1), ("+3", 3), (" 7 ", 7)],
)
def test_integer_flags_read_as_strtol_base_0(text: str, value: int) -> None:
    """nccl-tests reads every integer flag with strtol(optarg, NULL, 0): hex, and octal after a leading 0."""
    assert nf.c_int(text) == value


@pytest.mark.parametrize("text", ["3x", "abc", "", "1.5", "08"])
def test_an_integer_flag_strtol_would_read_in_part_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        nf.c_int(text)


def test_an_octal_warm_up_count_is_nccl_tests_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nccl-tests", "all_reduce_perf", "--np", "2", "-b", "8", "-e", "8", "-n", "0x3", "-w", "010"]) == 0
    assert "warmup iters: 8 iters: 3 " in capsys.readouterr().out
