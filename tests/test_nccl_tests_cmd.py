"""`phantora nccl-tests`: nccl-tests' flags, sizes, counts and table layout, and timed runs on a DGX-like host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.cli import build_parser, main
from phantora.collectives.spec import DTYPE_BYTES
from phantora.errors import InputError
from phantora.report import nccl_tests as nt
from phantora.report.host_launch import host_launch_us, host_ns_per_call
from phantora.results import schema as S
from phantora.results.read import load_run
from phantora.topology import dgx_host

A100_NVLINK_GBPS = 2400e9 / 8 / 1e9  # the dgx_host NVLink port of an A100, in GB/s (1e9 bytes/s)
# busbw / algbw of each test, as nccl-tests' src/<test>.cu computes it
FACTOR = {
    "all_reduce_perf": lambda n: 2 * (n - 1) / n,
    "all_gather_perf": lambda n: (n - 1) / n,
    "reduce_scatter_perf": lambda n: (n - 1) / n,
    "alltoall_perf": lambda n: (n - 1) / n,
    "broadcast_perf": lambda n: 1.0,
    "reduce_perf": lambda n: 1.0,
    "sendrecv_perf": lambda n: 1.0,
    "gather_perf": lambda n: (n - 1) / n,
    "scatter_perf": lambda n: (n - 1) / n,
    "hypercube_perf": lambda n: 1.0,
}


@pytest.fixture
def dgx4(tmp_path: Path) -> str:
    """A DGX-like H100 server of 4 GPUs on one NVSwitch, as a topology file."""
    path = tmp_path / "dgx4.toml"
    path.write_text('gpu = "h100"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 4\n')
    return str(path)


# ----- flags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("8", 8), ("1K", 1024), ("64k", 65536), ("1M", 2**20), ("8G", 8 * 2**30), ("1.5K", 1536), ("2GB", 2**31),
     ("4MiB", 4 * 2**20), ("0", 0)],
)  # fmt: skip
def test_sizes_take_binary_suffixes_as_nccl_tests(text: str, value: int) -> None:
    assert nt.parse_size(text, "-b") == value


@pytest.mark.parametrize("text", ["8X", "", "-1", "8T", "K", "1e"])
def test_a_bad_size_is_an_error_naming_its_flag(text: str) -> None:
    with pytest.raises(InputError) as err:
        nt.parse_size(text, "-e")
    assert err.value.field == "-e" and repr(text) in str(err.value)


def test_size_steps_multiply_with_f_and_add_with_i() -> None:
    doubling = nt.size_steps(8, 8 * 2**30, 2, None)
    assert doubling[:3] == [8, 16, 32] and doubling[-1] == 8 * 2**30 and len(doubling) == 31
    assert nt.size_steps(2**20, 4 * 2**20, None, 2**20) == [2**20, 2 * 2**20, 3 * 2**20, 4 * 2**20]
    assert nt.size_steps(2**20, 3 * 2**20, None, None) == [2**20, 2 * 2**20, 3 * 2**20]  # default step 1M
    assert nt.size_steps(2**20, 3 * 2**20, 1, None) == [2**20, 2 * 2**20, 3 * 2**20]  # -f 1: the increment
    assert nt.size_steps(100, 1000, 3, None) == [100, 300, 900]  # stops below max
    assert nt.size_steps(64, 64, 2, None) == [64]
    for args, flag in (
        ((8, 64, 2, 8), "-f/-i"),  # -f and -i together
        ((64, 8, 2, None), "-b"),  # min > max
        ((0, 64, 2, None), "-b"),  # 0 never grows
        ((8, 64, 0, None), "-f"),
        ((8, 64, None, 0), "-i"),
    ):
        with pytest.raises(InputError) as err:
            nt.size_steps(*args)
        assert err.value.field == flag, args


def test_the_command_takes_nccl_tests_flags_short_and_long() -> None:
    argv = ["nccl-tests", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8", "-d", "half", "-o", "max"]
    argv += ["-n", "3", "-w", "1", "-r", "2", "-c", "0", "-z", "1", "-a", "3", "-t", "1", "--network", "ns3"]
    args = build_parser().parse_args([*argv, "--cc", "dcqcn", "--set", "pfc=false", "--out", "x"])
    assert (args.test, args.minbytes, args.maxbytes) == ("all_reduce_perf", "8", "8G")
    assert (args.stepfactor, args.stepbytes) == (2, None)
    assert (args.ngpus, args.datatype, args.op, args.iters, args.warmup_iters, args.root) == (8, "half", "max", 3, 1, 2)
    assert (args.check, args.blocking, args.average, args.nthreads) == (0, 1, 3, 1)
    assert (args.network, args.cc, args.set, str(args.out)) == ("ns3", "dcqcn", ["pfc=false"], "x")
    long = ["nccl-tests", "alltoall_perf", "--minbytes", "1K", "--maxbytes", "1M", "--stepbytes", "1K", "--ngpus", "2"]
    args = build_parser().parse_args(
        [*long, "--iters", "4", "--warmup_iters", "0", "--datatype", "bf16", "--op", "avg"]
    )
    assert (args.minbytes, args.stepbytes, args.ngpus, args.iters, args.warmup_iters) == ("1K", "1K", 2, 4, 0)
    defaults = build_parser().parse_args(["nccl-tests", "reduce_perf"])
    assert (defaults.minbytes, defaults.maxbytes, defaults.iters, defaults.warmup_iters) == ("32M", "32M", 20, 1)
    assert (defaults.ngpus, defaults.datatype, defaults.op, defaults.root) == (None, "float", "sum", 0)
    assert defaults.topology is None


def test_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["nccl-tests", "--help"])
    text = capsys.readouterr().out
    flags = ("-b", "--minbytes", "-e", "-f", "-i", "-g", "-d", "-o", "-n", "-w", "-r", "-c", "-z", "-a", "--topology")
    for flag in (*flags, "--network", "--cc", "--set", "--out", *nt.TESTS):
        assert flag in text, flag


def test_datatypes_and_ops() -> None:
    assert [nt.datatype(d) for d in ("float", "bf16", "FP16", "int", "char", "double")] == [
        "float", "bfloat16", "half", "int32", "int8", "double"
    ]  # fmt: skip
    for name, (short, size) in nt.DATATYPES.items():  # the collectives layer agrees on each element size
        assert DTYPE_BYTES[short] == size, name
    with pytest.raises(InputError) as err:
        nt.datatype("int7")
    assert err.value.field == "-d"
    assert nt.redop("avg") == "avg"
    with pytest.raises(InputError) as err:
        nt.redop("xor")
    assert err.value.field == "-o"
    assert nt.find_test("all_reduce").name == "all_reduce_perf"
    with pytest.raises(InputError) as err:
        nt.find_test("allreduce_perf")
    assert err.value.field == "TEST" and "all_reduce_perf" in str(err.value)


# ----- counts and the table ---------------------------------------------------------------------------


def test_count_per_test_follows_nccl_tests() -> None:
    """Full-buffer tests count size / typesize; all_gather, reduce_scatter and alltoall give each rank count /
    nranks elements rounded down to 16 bytes, print that per-rank count, and move nranks times it."""
    t = nt.TESTS
    for name in ("all_reduce_perf", "broadcast_perf", "reduce_perf", "sendrecv_perf"):
        assert nt.counts(t[name], 1024, 4, 8) == (1024, 256, 1024)
        assert nt.counts(t[name], 1023, 4, 8) == (1020, 255, 1020)  # whole elements
    for name in ("all_gather_perf", "reduce_scatter_perf", "alltoall_perf"):
        assert nt.counts(t[name], 1024, 4, 8) == (1024, 32, 1024)
        assert nt.counts(t[name], 8, 4, 8) == (0, 0, 0)  # 2 floats over 8 ranks: nothing
        assert nt.counts(t[name], 1000, 1, 3) == (960, 320, 960)  # 333 int8 per rank, down to 320
        assert nt.counts(t[name], 1 << 20, 2, 16) == (1 << 20, 1 << 15, 1 << 20)
        assert nt.counts(t[name], 100, 8, 3) == (96, 4, 96)  # 4 doubles per rank (16-byte multiple)


def _columns(line: str) -> list[int]:
    """The end index of each whitespace-separated field of `line`."""
    ends, inside = [], False
    for i, ch in enumerate(line + " "):
        if ch != " " and not inside:
            inside = True
        elif ch == " " and inside:
            inside = False
            ends.append(i)
    return ends


def test_the_table_has_nccl_tests_header_and_columns() -> None:
    head = nt.table_header()
    assert head[0] == "#" and "out-of-place" in head[1] and "in-place" in head[1]
    assert head[2].split() == ["#", "size", "count", "type", "redop", "root", *["time", "algbw", "busbw", "#wrong"] * 2]
    assert head[3].split() == ["#", "(B)", "(elements)", *["(us)", "(GB/s)", "(GB/s)"] * 2]
    assert head[1].index("out-of-place") == 63 and head[1].index("in-place") == 98  # over their column groups
    res = nt.SizeResult(size=1 << 30, count=1 << 28, nbytes=1 << 30, iter_ns=[2_386_093] * 2, factor=1.75)
    line = nt.size_line(res, nt.TESTS["all_reduce_perf"], "float", "sum", 0)
    assert line == (
        "  1073741824     268435456     float     sum      -1  2386.09  450.00  787.50    N/A"
        "  2386.09  450.00  787.50    N/A"
    )
    # every field ends under its heading, but for nccl-tests' own quirk: "    N/A" is one character narrower than
    # "  #wrong", so it ends one character early and the in-place group after it one more
    heads = _columns(head[2])[1:]
    assert _columns(line) == [*heads[:8], heads[8] - 1, *(end - 1 for end in heads[9:12]), heads[12] - 2]
    ag = nt.size_line(res, nt.TESTS["all_gather_perf"], "half", "max", 0)
    assert ag.split()[2:5] == ["half", "none", "-1"]  # no op, no root
    bc = nt.size_line(res, nt.TESTS["broadcast_perf"], "int8", "sum", 3)
    assert bc.split()[2:5] == ["int8", "none", "3"]
    rd = nt.size_line(res, nt.TESTS["reduce_perf"], "float", "min", 3)
    assert rd.split()[2:5] == ["float", "min", "3"]
    foot = nt.footer([res, res], nt.TESTS["all_reduce_perf"])
    assert foot == [
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 787.5 ",
        "#",
        "# Collective test concluded: all_reduce_perf",
        "#",
        "",  # nccl-tests' writeErrors: an empty line when NCCL reports no error
    ]
    checked = nt.size_line(res, nt.TESTS["all_reduce_perf"], "float", "sum", 0, check=1)
    assert checked == line.replace("    N/A", "       0")  # -c 1: "%6g" of 0 wrong elements


def test_numbers_shrink_to_their_width_as_nccl_tests_prints_them() -> None:
    assert nt.fit_float(2386.093, 7) == "2386.09"
    assert nt.fit_float(12345.678, 7) == "12345.7"
    assert nt.fit_float(123456.7, 7) == " 123457"
    assert nt.fit_float(12345678.0, 7) == "1.2e+07"
    assert nt.fit_float(1234.5, 6) == "1234.5"
    assert nt.fit_float(0.0, 6) == "  0.00"


# ----- runs ---------------------------------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[list[str], dict[str, Any] | None]:
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    data = None
    if "--out" in argv:
        data = json.loads((Path(argv[argv.index("--out") + 1]) / S.RESULTS_JSON).read_text())
    return out, data


@pytest.mark.parametrize("test", list(nt.TESTS))
def test_busbw_is_algbw_times_the_tests_factor(
    test: str, dgx4: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    argv = ["nccl-tests", test, "--topology", dgx4, "-b", "64K", "-e", "4M", "-f", "8", "-n", "2", "-w", "1"]
    lines, data = _run([*argv, "--out", str(out_dir)], capsys)
    assert data is not None and data["schema"] == S.NCCL_TESTS and data["ranks"] == 4
    rows = [ln for ln in lines if ln and not ln.startswith("#")]
    assert len(rows) == len(data["sizes"]) == 3
    for rec, row in zip(data["sizes"], rows, strict=True):
        assert rec["busbw_factor"] == FACTOR[test](4)
        assert rec["busbw"] == rec["algbw"] * FACTOR[test](4)  # exactly
        assert rec["algbw"] == pytest.approx(rec["nbytes"] / rec["time_ns"], rel=1e-12) and rec["algbw"] > 0
        assert len(rec["iter_ns"]) == 2 and rec["time_us"] == pytest.approx(rec["time_ns"] / 1e3)
        f = row.split()
        assert int(f[0]) == rec["bytes"] and int(f[1]) == rec["count"]
        assert f[5:9] == [nt.fit_float(rec["time_us"], 7).strip(), nt.fit_float(rec["algbw"], 6).strip(),
                          nt.fit_float(rec["busbw"], 6).strip(), "0"]  # fmt: skip
        if test == "hypercube_perf":  # out of place it copies its own block first (test_nccl_tests_gather_scatter.py)
            assert float(f[9]) < float(f[5]) and f[12] == f[8]
        else:
            assert f[9:13] == f[5:9]  # in-place: the same simulation
    # nccl-tests' average: both column groups of every line (common.cu), in place from inplace_time_us where it differs
    inplace = [r["nbytes"] / (r.get("inplace_time_us", r["time_us"]) * 1e3) * r["busbw_factor"] for r in data["sizes"]]
    avg = (sum(r["busbw"] for r in data["sizes"]) + sum(inplace)) / 6
    assert data["avg_busbw"] == pytest.approx(avg) and f"# Avg bus bandwidth    : {avg:g} " in lines
    assert (out_dir / S.NCCL_TESTS_TXT).read_text().splitlines() == lines  # the table as printed
    run = load_run(out_dir)  # phantora compare reads it: one "op" per size
    assert run.kind == "nccl-tests" and run.network == "flow" and run.status == "complete"
    assert run.collectives == {f"{r['bytes']} B": round(r["time_ns"]) for r in data["sizes"]}


def test_a_large_all_reduce_reaches_the_nvlink_rate_and_not_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Closed form: a bandwidth-optimal all-reduce on one NVSwitch moves busbw = a GPU's NVLink rate (300 GB/s for
    an A100). The ideal decomposition reaches it within a few %; a model with latencies, protocols or rate caps may
    stay below it, never above. (An A100: its NVSwitch does not reduce in the switch, as H100 NVLS does, which
    takes busbw past the link rate.)"""
    topo = tmp_path / "dgx_a100.toml"
    topo.write_text('gpu = "a100"\n[generator]\nkind = "dgx_host"\ngpus_per_host = 8\n')
    argv = ["nccl-tests", "all_reduce_perf", "--topology", str(topo), "-b", "1G", "-e", "1G", "-n", "2", "-w", "1"]
    lines, _ = _run([*argv, "-g", "8"], capsys)
    row = next(ln for ln in lines if not ln.startswith("#")).split()
    algbw, busbw = float(row[6]), float(row[7])
    assert 0 < busbw <= A100_NVLINK_GBPS * 1.02
    # as printed, each to 2 decimals: the rounding of algbw (0.005) times 1.75 plus busbw's own 0.005
    assert busbw == pytest.approx(algbw * 2 * 7 / 8, abs=0.005 * 1.75 + 0.005 + 1e-9)


def test_the_default_topology_is_one_dgx_h100_server(capsys: pytest.CaptureFixture[str]) -> None:
    lines, _ = _run(["nccl-tests", "all_reduce_perf", "-b", "1M", "-e", "1M", "-n", "1", "-w", "0"], capsys)
    assert lines[0] == f"# nccl-tests version {nt.FORMAT_VERSION} nccl-headers=23000 nccl-library=23000"
    assert "topology dgx8 (8 GPUs), network flow" in lines[1]
    assert (
        "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1048576 step: 1048576(bytes) warmup iters: 0 iters: 1"
        in lines[4]
    )
    devices = [ln for ln in lines if ln.startswith("#  Rank")]
    assert len(devices) == 8 and devices[7].endswith("on      host0 device  7 [gpu7] NVIDIA H100 80GB HBM3")
    assert len({ln.split("Pid")[1].split()[0] for ln in devices}) == 8  # mpirun's way: a process per GPU


def test_the_loop_is_bound_by_the_slower_of_host_launches_and_gpus() -> None:
    """nccl-tests launches iteration i by (i + 1) host times; the GPUs run the calls one after another."""
    assert nt.launch_bound([10] * 4, 40) == [50, 40, 40, 40]  # host-bound: the mean -> the host time
    assert nt.launch_bound([100] * 4, 40) == [140, 100, 100, 100]  # GPU-bound: one host time up front
    assert nt.launch_bound([], 40) == []


def _time_us(lines: list[str]) -> float:
    return float(next(ln for ln in lines if not ln.startswith("#")).split()[5])


def test_one_thread_driving_eight_gpus_is_bound_by_its_launches_at_small_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`-g 8` (one process): 8 launches per call (host_launch_us of its 24 channels each) bound a 1 MiB all-gather
    from below; one process per GPU (the default, as under mpirun) is not bound so, and 1 GiB is GPU-bound in
    both."""
    small = ["nccl-tests", "all_gather_perf", "-b", "1M", "-e", "1M", "-n", "20", "-w", "1"]
    one_proc = _time_us(_run([*small, "-g", "8"], capsys)[0])
    per_gpu = _time_us(_run(small, capsys)[0])
    h = host_launch_us(24)
    assert one_proc == pytest.approx(8 * h + per_gpu / 20, rel=0.02)
    assert per_gpu < 8 * h / 2
    big = ["nccl-tests", "all_gather_perf", "-b", "1G", "-e", "1G", "-n", "20", "-w", "1"]
    gpu_bound = _time_us(_run(big, capsys)[0])
    assert _time_us(_run([*big, "-g", "8"], capsys)[0]) == pytest.approx(gpu_bound + 7 * h / 20)


def test_processes_threads_and_gpus_multiply_to_the_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    lines, _ = _run(["nccl-tests", "sendrecv_perf", "--np", "2", "-t", "2", "-g", "2", "-n", "1", "-w", "0"], capsys)
    devices = [ln for ln in lines if ln.startswith("#  Rank")]
    assert len(devices) == 8 and len({ln.split("Pid")[1].split()[0] for ln in devices}) == 2
    assert main(["nccl-tests", "sendrecv_perf", "--np", "3", "-g", "4"]) == 2
    assert "field '-g': --np 3 x -t 1 x -g 4 = 12 GPUs asked for" in capsys.readouterr().err
    assert main(["nccl-tests", "sendrecv_perf", "--np", "9"]) == 2  # -g not given: --np is the flag to fix
    assert "field '--np': --np 9 x -t 1 x -g 1 = 9 GPUs asked for, but topology 'dgx8' has 8" in capsys.readouterr().err
    assert main(["nccl-tests", "sendrecv_perf", "-t", "9"]) == 2  # alone: one process of 9 threads
    assert "field '-t': --np 1 x -t 9 x -g 1 = 9 GPUs" in capsys.readouterr().err


def test_iterations_run_back_to_back_on_one_engine(dgx4: str) -> None:
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.topology import load_topology

    topo = load_topology(dgx4)
    bench = nt.Bench(nt.TESTS["all_reduce_perf"], topo, (0, 1, 2, 3), "float", iters=3, warmup=2)
    sim = make_engine(EngineSpec(), topo)
    try:
        res = nt.bench_size(bench, sim, 1 << 20)
        gpu = res.iter_ns[-1]
        assert len(res.iter_ns) == 3 and res.iter_ns[1] == gpu  # the flow network is deterministic
        assert res.iter_ns[0] == gpu + host_ns_per_call("all_reduce", res.choice, 4, 1)  # waits for its launch
        assert sim.now() == 5 * gpu  # 2 warm-ups + 3 iterations, each starting as the last ended
        second = nt.bench_size(bench, sim, 1 << 20)  # ids continue: the engine accepts the next size
        assert second.iter_ns == res.iter_ns
    finally:
        sim.close()


def test_sendrecv_sends_to_the_next_rank_and_receives_from_the_previous() -> None:
    topo = dgx_host(4, gpu="h100")
    it = nt.build_iteration(nt.TESTS["sendrecv_perf"], (0, 1, 2, 3), 4096, "fp32", 0, topo,
                            nt.AlgoOptions(), 100, "t")  # fmt: skip
    pairs = {(topo.endpoints.index(f.src), topo.endpoints.index(f.dst)) for f in it.flows}
    assert pairs == {(0, 1), (1, 2), (2, 3), (3, 0)}
    wire: dict[tuple[int, int], int] = {}
    for f in it.flows:
        wire[f.src, f.dst] = wire.get((f.src, f.dst), 0) + f.size
    assert len(set(wire.values())) == 1 and min(wire.values()) >= 4096  # the buffer each, or more (a protocol's lines)
    assert min(f.id for f in it.flows) == 100
    assert it.last <= {f.id for f in it.flows} and it.next_id == 100 + len(it.flows)
    one = nt.build_iteration(nt.TESTS["sendrecv_perf"], (0,), 4096, "fp32", 0, topo, nt.AlgoOptions(), 7, "t")
    assert one.flows == [] and one.next_id == 7


def test_the_nccl_models_choice_is_shown_and_saved(
    dgx4: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the collectives layer says what it chose (FlowDag.choice), each size line ends with it as a comment
    and results.json keeps it."""
    real = nt.decompose

    def with_choice(*args: Any, **kwargs: Any) -> Any:
        dag = real(*args, **kwargs)
        dag.choice = {"algorithm": "ring", "protocol": "simple", "channels": 4}
        return dag

    monkeypatch.setattr(nt, "decompose", with_choice)
    out_dir = tmp_path / "out"
    argv = ["nccl-tests", "all_reduce_perf", "--topology", dgx4, "-b", "1M", "-e", "1M", "-n", "1", "-w", "0"]
    lines, data = _run([*argv, "--out", str(out_dir)], capsys)
    row = next(ln for ln in lines if not ln.startswith("#"))
    assert row.endswith("       0  # algorithm=ring protocol=simple channels=4")
    assert data is not None and data["sizes"][0]["choice"] == {"algorithm": "ring", "protocol": "simple", "channels": 4}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["all_reduce_perf", "-b", "8X"], "-b"),
        (["all_reduce_perf", "-e", "1Q"], "-e"),
        (["all_reduce_perf", "-g", "16"], "-g"),
        (["all_reduce_perf", "-t", "2", "-g", "8"], "-g"),
        (["allreduce_perf"], "TEST"),
        (["all_reduce_perf", "-f", "2", "-i", "1M"], "-f/-i"),
        (["broadcast_perf", "-r", "8"], "-r"),
        (["all_reduce_perf", "-d", "float128"], "-d"),
        (["all_reduce_perf", "-n", "0"], "-n"),
        (["all_reduce_perf", "--cc", "dcqcn"], "--cc"),
        (["all_reduce_perf", "--set", "pfc=false"], "pfc"),
    ],
)
def test_errors_are_one_line_naming_the_flag(
    extra: list[str], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["nccl-tests", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("phantora nccl-tests: error: ")
    assert f"field '{field}'" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""  # nothing printed before the check


def test_without_out_stdout_holds_only_the_table(capsys: pytest.CaptureFixture[str], dgx4: str) -> None:
    assert main(["nccl-tests", "broadcast_perf", "--topology", dgx4, "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert all(ln.startswith("#") or ln.split()[0].isdigit() for ln in lines[:-1]) and lines[-1] == ""
    assert "nothing saved" in captured.err


@pytest.mark.parametrize(
    ("flags", "labels"),
    [
        (["-o", "all"], ["sum", "prod", "max", "min", "avg", "mulsum"]),  # nccl-tests' op order
        (["-d", "float", "-N", "2"], ["block 1", "block 2"]),  # two cycles alike in every field: numbered
    ],
)
def test_compare_keeps_every_block_of_a_multi_block_table(
    flags: list[str], labels: list[str], dgx4: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`phantora compare` reads one row per size of each block (a block: one -o op, -d type, -r root or -N
    cycle), not just the last block's: 6 ops x 2 sizes give 12 rows, each the time of its own table line, and
    the run's time is their sum."""
    out_dir = tmp_path / "out"
    argv = ["nccl-tests", "all_reduce_perf", "--topology", dgx4, "-b", "64K", "-e", "256K", "-f", "4", "-n", "1"]
    _, data = _run([*argv, "-w", "0", *flags, "--out", str(out_dir)], capsys)
    assert data is not None and len(data["sizes"]) == 2 * len(labels)
    run = load_run(out_dir)
    want = {f"{lab} {r['bytes']} B": round(r["time_ns"]) for lab, r in zip(sorted(labels * 2, key=labels.index),
                                                                           data["sizes"], strict=True)}  # fmt: skip
    assert run.collectives == want
    assert run.time_ns == sum(round(r["time_ns"]) for r in data["sizes"])


def test_granularity_chunked_runs_nccls_steps_in_nccls_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--granularity chunked`: the calls' flows are NCCL's steps (a packet run sees their bursts), and the table's
    times are the coarse flows' (NCCL's closed form), here a 1 MiB LL ring all-reduce on 2 hosts of 2 GPUs."""
    topo = tmp_path / "rail2x2.toml"
    topo.write_text('gpu = "h100"\n[generator]\nkind = "rail_optimized"\nhosts = 2\ngpus_per_host = 2\n')
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_PROTO", "LL")
    argv = ["nccl-tests", "all_reduce_perf", "--topology", str(topo), "-b", "1M", "-e", "1M", "-n", "1", "-w", "0"]
    got = {}
    for gran in ("coarse", "chunked"):
        _, data = _run([*argv, "--granularity", gran, "--out", str(tmp_path / gran)], capsys)
        assert data is not None and data["granularity"] == gran
        got[gran] = data["sizes"][0]
    assert got["chunked"]["choice"] == got["coarse"]["choice"]
    choice = got["chunked"]["choice"]
    assert choice["algorithm"] == "Ring" and choice["protocol"] == "LL"
    assert got["chunked"]["time_us"] == pytest.approx(got["coarse"]["time_us"], rel=1e-3)
    assert got["chunked"]["time_us"] >= choice["model_time_us"]


def test_gpu_on_a_topology_of_another_nvlink_says_the_links_stay(capsys: pytest.CaptureFixture[str]) -> None:
    """testbed16's NVSwitch links are H100's 450 GB/s a direction (3600 Gbps); `--gpu b200` (NVLink 5, 900 GB/s)
    keeps them and says so on stderr; `--gpu h100` (the same rate) says nothing; the table stays on stdout."""
    args = ["nccl-tests", "all_reduce_perf", "-b", "1M", "-e", "1M", "--topology", "testbed16", "-n", "1", "-w", "0"]
    assert main([*args, "--gpu", "b200"]) == 0
    out, err = capsys.readouterr()
    (note,) = [line for line in err.splitlines() if "note:" in line]
    assert "--gpu b200 keeps testbed16's NVLink links of 3600Gbps" in note and "b200's own: 7200Gbps" in note
    assert "note:" not in out and "1048576" in out
    assert main([*args, "--gpu", "h100"]) == 0
    assert "note:" not in capsys.readouterr().err
