"""`phantora sweep`: grid parsing, command templates, a flow-mode sweep with one failing point, the table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.errors import InputError
from phantora.sweep import SweepSpec, build_runs, command_args, load_grid, parse_param, run_sweep
from phantora.sweep_local import uses_ns3

AR_BYTES = 32 * 2**20
WORKLOAD = f"""
name = "ar"
[[op]]
name = "ar"
kind = "all_reduce"
bytes = {AR_BYTES}
ranks = "all"
"""


def test_grid_file_and_points(tmp_path: Path) -> None:
    g = tmp_path / "g.toml"
    g.write_text(
        'name = "cc"\ncommand = ["replay", "{workload}", "--out", "{out}"]\njobs = 2\n'
        '[fixed]\nworkload = "w.toml"\nnetwork = "ns3"\n"set.buffer_bytes" = 1000000\n'
        '[grid]\ncc = ["none", "dcqcn", "hpcc"]\n"set.pfc" = [true, false]\n'
    )
    spec = load_grid(g)
    points = spec.points()
    assert len(points) == 3 * 2
    assert points[1] == {
        "workload": "w.toml",
        "network": "ns3",
        "set.buffer_bytes": 1000000,
        "cc": "none",
        "set.pfc": False,
    }
    runs = build_runs(spec, tmp_path / "out")
    assert len({r.out for r in runs}) == 6
    assert runs[1].args == [
        "replay", "w.toml", "--out", str(runs[1].out),
        "--network", "ns3", "--set", "buffer_bytes=1000000", "--cc", "none", "--set", "pfc=0",
    ]  # fmt: skip
    assert runs[1].out.name == "001-cc=none_pfc=False"


def test_command_template_rules() -> None:
    spec = SweepSpec(command=("run", "{script}", "-n", "{ranks}", "--out", "{out}/r{index}"))
    spec.fixed = {"script": "gpt.py", "ranks": 16, "window": "10us", "trace": False, "fast_path": True}
    args = command_args(spec, spec.points()[0], Path("/o"), 4)
    assert args == ["run", "gpt.py", "-n", "16", "--out", "/o/r4", "--window", "10us", "--no-trace", "--fast-path"]


def test_flags_placeholder_puts_flags_before_the_script() -> None:
    spec = SweepSpec(command=("run", "{flags}", "--out", "{out}", "{script}", "--steps", "3"))
    spec.fixed = {"script": "gpt.py", "topology": "star8"}
    spec.grid = {"window": ["1us", "10us"]}
    args = command_args(spec, spec.points()[1], Path("/o"), 1)
    assert args == ["run", "--topology", "star8", "--window", "10us", "--out", "/o", "gpt.py", "--steps", "3"]


def test_which_runs_use_ns3() -> None:
    assert uses_ns3(["replay", "w", "--network", "ns3", "--cc", "dcqcn"])
    assert not uses_ns3(["replay", "w", "--network", "flow", "--out", "ns3"])
    assert uses_ns3(["netsim", "-t", "star8", "-f", "x", "--network", "ns3"])
    assert not uses_ns3(["netsim", "-t", "star8", "-f", "x"])  # flow, the default of every command


def test_cli_param_values() -> None:
    assert parse_param("set.pfc=true,false") == ("set.pfc", [True, False])
    assert parse_param("set.buffer_bytes=1000000") == ("set.buffer_bytes", [1000000])
    assert parse_param("window=1us, 10us") == ("window", ["1us", "10us"])
    spec = SweepSpec(fixed={"workload": "w"}, grid=dict([parse_param("set.pfc=true,false")]))
    assert [command_args(spec, p, Path("/o"), 0)[-1] for p in spec.points()] == ["pfc=1", "pfc=0"]
    with pytest.raises(InputError):
        parse_param("cc")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[grid]\ncc = []\n", "grid.cc"),
        ('command = ["replay", "{nope}", "--out", "{out}"]\n[fixed]\nx = 1\n', "command"),
        ('command = ["replay", "w"]\n[fixed]\nx = 1\n', "command"),
        ('[fixed]\ncc = "none"\n[grid]\ncc = ["a", "b"]\n', "cc"),
        ('[fixed]\nout = "x"\n', "fixed.out"),
        ('[grid]\ncc = [["nested"]]\n', "grid.cc"),
        ('colour = "red"\n', "colour"),
        ('jobs = 0\n[fixed]\nworkload = "w"\n', "jobs"),
    ],
)
def test_bad_grids_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    g = tmp_path / "g.toml"
    g.write_text(text)
    with pytest.raises(InputError) as err:
        load_grid(g)
    assert err.value.file == str(g) and err.value.field == field


def test_bad_toml_names_the_line(tmp_path: Path) -> None:
    g = tmp_path / "g.toml"
    g.write_text('[grid]\ncc = ["none",\n  "dcqcn"\nx = = 2\n')
    with pytest.raises(InputError) as err:
        load_grid(g)
    assert err.value.file == str(g) and err.value.line is not None


@pytest.fixture(scope="module")
def flow_sweep(tmp_path_factory: pytest.TempPathFactory):
    """2 topologies that exist and one that does not, x 2 algorithms, in flow mode, 2 jobs."""
    root = tmp_path_factory.mktemp("sweep")
    wl = root / "ar.toml"
    wl.write_text(WORKLOAD)
    spec = SweepSpec(
        name="t",
        # the ideal collective model: the star8 ring is checked against its line-rate closed form
        fixed={"workload": str(wl), "network": "flow", "collective_model": "ideal"},
        grid={"topology": ["star8", "no-such-topology", "twoleaf8"], "algorithm": ["ring", "tree"]},
    )
    messages: list[str] = []
    res = run_sweep(spec, root / "out", jobs=2, progress=False, report=messages.append)
    return spec, res, root / "out", messages


def test_failing_point_is_reported_and_the_others_complete(flow_sweep) -> None:
    _spec, res, _out, messages = flow_sweep
    status = [(r["topology"], r["algorithm"], r["status"]) for r in res.rows]
    assert status == [
        ("star8", "ring", "ok"),
        ("star8", "tree", "ok"),
        ("no-such-topology", "ring", "failed"),
        ("no-such-topology", "tree", "failed"),
        ("twoleaf8", "ring", "ok"),
        ("twoleaf8", "tree", "ok"),
    ]
    bad = [r for r in res.rows if r["status"] == "failed"]
    assert all("no-such-topology" in r["error"] and r["returncode"] == 2 for r in bad)
    assert len(messages) == 2
    assert all("topology=no-such-topology" in m and "algorithm=" in m and "run.log" in m for m in messages)


def test_table_has_a_row_per_point_with_its_configuration(flow_sweep) -> None:
    spec, res, out, _ = flow_sweep
    with (out / "sweep.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(spec.points()) == 6
    for row, point in zip(rows, spec.points(), strict=True):
        for key, value in point.items():
            assert row[key] == str(value)
        if row["status"] == "ok":
            results = json.loads((Path(row["dir"]) / "results.json").read_text())
            assert int(row["time_ns"]) == results["makespan_ns"]
    # The star8 ring all-reduce (ideal model): 2(n-1)/n * S at 100 Gb/s, plus small latencies.
    ring = 2 * 7 / 8 * AR_BYTES * 8 / 100e9 * 1e9
    t = int(rows[0]["time_ns"])
    assert ring <= t <= ring * 1.01
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["grid"] == spec.grid and len(meta["rows"]) == 6


def test_parquet_table_matches_csv(flow_sweep) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is optional (Parquet output)")
    _spec, res, out, _ = flow_sweep
    table = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [r["topology"] for r in table] == [r["topology"] for r in res.rows]
    assert [r["time_ns"] for r in table] == [r["time_ns"] for r in res.rows]


def test_sweep_plots_are_written(flow_sweep) -> None:
    _spec, _res, out, _ = flow_sweep
    for name in ("time_vs_topology", "fct_cdf"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert (out / f"{name}.svg").stat().st_size > 5_000


def test_cli_exit_status_and_dry_run(tmp_path: Path, capsys) -> None:
    wl = tmp_path / "ar.toml"
    wl.write_text(WORKLOAD)
    out = tmp_path / "o"
    argv = ["sweep", "-w", str(wl), "-t", "star8,nowhere", "-p", "network=flow", "--out", str(out), "--no-plots"]
    assert main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "--topology nowhere" in lines[1] and "--network flow" in lines[1]
    assert main(argv) == 1
    cap = capsys.readouterr()
    assert "1 of 2 runs failed" in cap.err and "topology=nowhere" in cap.err
    assert main(["sweep", "--out", str(out)]) == 2
    assert "nothing to sweep" in capsys.readouterr().err


def test_ray_backend_runs_the_same_sweep(tmp_path: Path) -> None:
    """A private local Ray instance (2 CPUs, no dashboard: ~5 s), shut down afterwards."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    wl = tmp_path / "ar.toml"
    wl.write_text(WORKLOAD)
    # the ideal collective model: the ring is checked against its line-rate closed form
    fixed = {"workload": str(wl), "network": "flow", "collective_model": "ideal"}
    spec = SweepSpec(name="r", fixed=fixed, grid={"topology": ["star8", "nowhere"]})
    # Started here, so run_on_ray uses this small instance instead of one sized to the machine.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        res = run_sweep(spec, tmp_path / "out", ray_address="local", progress=False, plots=False, report=lambda m: None)
        assert ray.is_initialized()  # run_on_ray leaves an instance it did not start running
    finally:
        ray.shutdown()
    assert [r["status"] for r in res.rows] == ["ok", "failed"]
    ok = Path(res.rows[0]["dir"])
    assert {"results.json", "flows.csv", "links.csv", "run.log"} <= {p.name for p in ok.iterdir()}
    ring = 2 * 7 / 8 * AR_BYTES * 8 / 100e9 * 1e9
    assert ring <= res.rows[0]["time_ns"] <= ring * 1.01
    assert "nowhere" in res.rows[1]["error"]


SLOW_STAR8 = """
name = "star8-50g"
[generator]
kind = "leaf_spine"
leaves = 1
endpoints_per_leaf = 8
spines = 0
nic_rate = "50Gbps"
latency = "1us"
"""


def test_sweep_replays_a_recorded_trace(tmp_path: Path, capsys) -> None:
    """--trace: a graph recorded from a (scripted) co-simulated DDP run is the workload of every run of the grid."""
    from test_egraph_replay import MiB, cosim, ddp_script, star

    trace = tmp_path / "trace"
    ends = cosim(star(8), [ddp_script(r, 8, 2, 4 * MiB, 200_000, steps=3) for r in range(8)], record=trace)
    recorded = [b - a for a, b in zip([0, *ends[0]], ends[0], strict=False)]
    slow = tmp_path / "star8-50g.toml"
    slow.write_text(SLOW_STAR8)
    out = tmp_path / "o"
    argv = ["sweep", "--trace", str(trace), "-t", f"star8,{slow}", "-j", "2", "--no-plots", "--out", str(out)]
    assert main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(f"replay {trace} " in line for line in lines)
    assert main(argv) == 0
    with (out / "sweep.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["topology"], r["status"], r["time_kind"]) for r in rows] == [
        ("star8", "ok", "iteration"),
        (str(slow), "ok", "iteration"),
    ]
    assert all(r["workload"] == str(trace) for r in rows)
    # On the network it was recorded on, the replay gives the recorded steady-state step time exactly ...
    assert int(rows[0]["time_ns"]) == round(sum(recorded[1:]) / len(recorded[1:]))
    # ... and half the bandwidth makes the exposed all-reduces slower.
    assert int(rows[1]["time_ns"]) > int(rows[0]["time_ns"]) * 1.1
    # A directory that is no recording is refused before any run starts.
    assert main(["sweep", "--trace", str(tmp_path), "-t", "star8", "--out", str(tmp_path / "x")]) == 2
    assert "not a recorded execution graph" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_grid_file_trace_key(tmp_path: Path) -> None:
    from phantora.egraph import ProgramBuilder, build_graph, save

    bs = [ProgramBuilder(r) for r in range(2)]
    for b in bs:
        b.compute("fwd", 1000)
        b.wait([b.collective("all_reduce", range(2), 1024)])
        b.step()
    for name in ("a", "b"):
        save(build_graph(bs), tmp_path / name)
    g = tmp_path / "g.toml"
    g.write_text(f'trace = ["{tmp_path / "a"}", "{tmp_path / "b"}"]\n[fixed]\ntopology = "star8"\n')
    spec = load_grid(g)
    assert spec.grid == {"workload": [str(tmp_path / "a"), str(tmp_path / "b")]}
    assert spec.command[0] == "replay"
    g.write_text(f'trace = "{tmp_path / "a"}"\n[fixed]\nworkload = "w.toml"\n')
    with pytest.raises(InputError) as err:
        load_grid(g)
    assert err.value.field == "trace" and "not both" in str(err.value)
    g.write_text(f'trace = "{tmp_path / "a"}"\ncommand = ["run", "--out", "{{out}}", "x.py"]\n')
    with pytest.raises(InputError, match="must be `replay"):
        load_grid(g)


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path: Path) -> None:
    """Interrupt a 4-run sweep after 2 runs (^C), run the same command again: only the runs not complete
    run, and the table equals an uninterrupted sweep's."""
    import signal
    import subprocess
    import sys
    import time

    wl = tmp_path / "ar.toml"
    wl.write_text(WORKLOAD)
    argv = ["sweep", "-w", str(wl), "-t", "star8,twoleaf8", "-p", "algorithm=ring,tree"]
    argv += ["-p", "network=flow", "-j", "1", "--no-plots", "--no-progress"]
    cli = [sys.executable, "-m", "phantora.cli"]
    whole = subprocess.run([*cli, *argv, "--out", str(tmp_path / "whole")], capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    out = tmp_path / "cut"
    # a background job of a non-interactive shell (CI) inherits SIGINT ignored, and so would the sweep: the
    # sweep here takes ^C as a terminal's user would (KeyboardInterrupt)
    with_ctrl_c = "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    with_ctrl_c += "sys.argv[0] = 'phantora'; runpy.run_module('phantora.cli', run_name='__main__')"
    cmd = [sys.executable, "-c", with_ctrl_c, *argv, "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while len(list(out.glob("runs/*/sweep-run.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # ^C: the run in progress finishes or is cut, the sweep stops
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and not (out / "sweep.csv").exists()
    done = len(list(out.glob("runs/*/sweep-run.json")))
    assert 2 <= done < 4
    again = subprocess.run([*cli, *argv, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{done} of 4 runs are complete, running the other {4 - done}" in again.stderr

    def table(d: Path) -> list[dict[str, str]]:
        with (d / "sweep.csv").open() as fh:
            return [{k: v for k, v in r.items() if k not in ("wall_s", "dir")} for r in csv.DictReader(fh)]

    assert table(out) == table(tmp_path / "whole") and len(table(out)) == 4
    assert len(json.loads((out / "sweep.json").read_text())["resumed"]) == done
    other = subprocess.run(
        [*cli, "sweep", "-w", str(wl), "-t", "star8", "-p", "network=flow", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert other.returncode == 2 and "holds another sweep" in other.stderr and "--no-resume" in other.stderr


def test_a_runs_warning_is_handed_on_while_the_run_still_runs(tmp_path: Path) -> None:
    """`run_local_one` reads the run's stderr as it comes: its "phantora: warning: " line reaches `on_warning`, tagged
    with the run, while the process runs (this one waits for the file the callback writes: were stderr read only at
    its end, it would time out); its output still goes to run.log."""
    import os
    import stat
    import sys

    from phantora.sweep_local import RunSpec, run_local_one

    seen = tmp_path / "seen"
    child = tmp_path / "child.py"
    child.write_text(
        "import os, sys, time\n"
        "print('phantora: warning: buffer_bytes=300,000 leaves switch8 no shared buffer', file=sys.stderr)\n"
        "sys.stderr.flush()\n"
        f"while not os.path.exists({str(seen)!r}):\n    time.sleep(0.01)\n"
        "print('ran on')\n"
    )
    python = tmp_path / "python"  # stands for the interpreter: runs the child whatever its arguments
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {child}\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    run = RunSpec(3, {"set.buffer_bytes": 300_000}, [], tmp_path / "run", {})
    told: list[tuple[int, str]] = []

    def on_warning(r: RunSpec, text: str) -> None:
        told.append((r.index, text))
        seen.write_text("")

    res = run_local_one(run, 60, python=str(python), on_warning=on_warning)
    assert res.status == "ok" and res.returncode == 0, res.error
    assert told == [(3, "buffer_bytes=300,000 leaves switch8 no shared buffer")]
    log = (run.out / "run.log").read_text()
    assert "ran on" in log and "phantora: warning: buffer_bytes=300,000" in log
    assert os.path.exists(seen)


def test_a_runs_progress_lines_are_handed_on_while_it_runs(tmp_path: Path) -> None:
    """A live run's own progress lines ("[phantora] step 0 done ..." on stdout, "[phantora] network: ..." on stderr)
    reach `on_progress` as it prints them (the child waits for the file the callback writes once both came), so a
    sweep of minute-long runs shows more than its count of runs done (before: nothing between two runs' ends, 2 to 3
    min apart for the 16-rank packet runs of the CC user trial of 2026-12-05)."""
    import stat
    import sys

    from phantora.sweep_local import RunSpec, run_local_one

    seen = tmp_path / "seen"
    child = tmp_path / "child.py"
    child.write_text(
        "import os, sys, time\n"
        "print('[phantora] step 0 done: 4.639 ms', flush=True)\n"
        "print('[phantora] network: simulated 8.240 ms', file=sys.stderr, flush=True)\n"
        f"while not os.path.exists({str(seen)!r}):\n    time.sleep(0.01)\n"
    )
    python = tmp_path / "python"  # stands for the interpreter: runs the child whatever its arguments
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {child}\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    told: list[tuple[int, str]] = []

    def on_progress(r: RunSpec, text: str) -> None:
        told.append((r.index, text))
        if len(told) == 2:
            seen.write_text("")

    res = run_local_one(RunSpec(5, {}, [], tmp_path / "run", {}), 60, python=str(python), on_progress=on_progress)
    assert res.status == "ok", res.error
    assert sorted(told) == [(5, "network: simulated 8.240 ms"), (5, "step 0 done: 4.639 ms")]


def test_a_failing_line_callback_leaves_the_pipes_read_and_its_error_raised(tmp_path: Path) -> None:
    """A progress callback that raises on a run's first line: the run's 1 MiB of stdout after it is still read (a
    pipe no one reads holds a child at 64 KiB: before, it waited there until the timeout killed it) and the error
    reaches the caller once the run ended, the callback not called again."""
    import stat
    import sys

    from phantora.sweep_local import RunSpec, run_local_one

    child = tmp_path / "child.py"
    child.write_text("import sys\nprint('[phantora] step 0 done', flush=True)\nsys.stdout.write('x' * (1 << 20))\n")
    python = tmp_path / "python"  # stands for the interpreter: runs the child whatever its arguments
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {child}\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    calls: list[str] = []

    def on_progress(r: RunSpec, text: str) -> None:
        calls.append(text)
        raise RuntimeError("the display broke")

    with pytest.raises(RuntimeError, match="the display broke"):
        run_local_one(RunSpec(6, {}, [], tmp_path / "run", {}), 5, python=str(python), on_progress=on_progress)
    assert calls == ["step 0 done"]


def test_a_running_runs_elapsed_time_is_named_as_the_runs() -> None:
    """`run_note`: the network line's own `M:SS elapsed` moves beside the run's number, so the sweep's line (which
    ends with the sweep's elapsed time) does not show two bare "elapsed" figures; a step line is left as it is."""
    import io

    from phantora.progress import Progress
    from phantora.sweep import run_note

    net = "network: simulated 5.823 ms, 9,768,650 events (2.9 M per CPU s, 3.3 CPU s), 1:53 elapsed"
    figures = "simulated 5.823 ms, 9,768,650 events (2.9 M per CPU s, 3.3 CPU s)"
    assert run_note(0, net) == f"run 0 (1:53 in): network: {figures}"
    hours = "network: simulated 1.000 ms, 1:02:03 elapsed"
    assert run_note(2, hours) == "run 2 (1:02:03 in): network: simulated 1.000 ms"
    step = "step 0 done: 7.137 ms (simulated time 7.137 ms, wall 80.6 s)"
    assert run_note(1, step) == f"run 1: {step}"
    out = io.StringIO()
    bar = Progress("lines", "sweep cc", 2, "run", every_s=0, file=out)
    bar.show(run_note(0, net))
    assert out.getvalue().count("elapsed") == 1 and out.getvalue().rstrip().endswith("0:00 elapsed")


def test_the_sweep_line_shows_the_running_runs_last_word() -> None:
    """`Progress.show`: the plain line carries the note after the counts, printed though no run ended."""
    import io

    from phantora.progress import Progress

    out = io.StringIO()
    bar = Progress("lines", "sweep cc", 4, "run", every_s=0, file=out)
    bar.show("run 3: step 1 done: 4.639 ms")
    assert out.getvalue().startswith("[phantora] sweep cc: 0/4 runs (0%), run 3: step 1 done: 4.639 ms, 0:00 elapsed")
