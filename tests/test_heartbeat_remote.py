"""The network's progress from another process (issue 38): a network server behind `phantora run`, decomposition
workers. Their ns-3 calls run in chunks (`phantora.netsim.heartbeat`) and `progress` messages come out between two
(`bridge.netserver`), passed on by the coordinator to the launcher or, for workers, merged by their pool
(`bridge.workers`). The results are the ones without the display.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.protocol import decode, encode
from phantora.progress import Beat, NetworkLine


def test_a_beat_crosses_the_wire_and_the_network_line_shows_it() -> None:
    beat = Beat(4_210_000, 2_171_842, 7.0, workers=2, slowest=1)
    msg = decode(encode("progress", beat.sim_ns, **beat.fields()))
    assert msg.type == "progress" and Beat.from_fields(msg.fields) == beat
    assert beat.text() == "simulated 4.210 ms, 2,171,842 events (310.3 k per CPU s, 7.0 CPU s), 2 workers (slowest: 1)"
    out = io.StringIO()
    lines = NetworkLine("lines", every_s=3600, file=out)
    lines.show(beat)  # the first one is shown, the next not before an hour
    lines.show(Beat(5_000_000, 3_000_000, 8.0))
    assert out.getvalue().startswith("[phantora] network: simulated 4.210 ms, 2,171,842 events") and lines.shown == 1
    assert out.getvalue().endswith(" elapsed\n") and out.getvalue().count("\n") == 1
    out = io.StringIO()
    bar = NetworkLine("bar", every_s=0, file=out)
    bar.show(beat)
    bar.clear()
    bar.clear()  # nothing drawn: nothing to clear
    assert out.getvalue().startswith("\r[phantora] network: ") and out.getvalue().endswith("\x1b[K\r\x1b[K")
    assert "\n" not in out.getvalue()
    NetworkLine("off", every_s=0, file=out).show(beat)
    with pytest.raises(ValueError, match="progress mode"):
        NetworkLine("loud")


def test_phantora_run_shows_the_network_line_with_ns3_only_and_clears_it_before_a_step_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from phantora.commands.run import network_line, step_printer
    from phantora.netsim.engine_spec import EngineSpec

    args = argparse.Namespace(progress=None, quiet=False)
    line = network_line(args, EngineSpec("ns3"))
    assert line is not None and line.mode == "lines"  # (stderr is not a terminal here)
    assert network_line(args, EngineSpec("flow")) is None  # the flow engine runs in the coordinator: no beat
    assert network_line(argparse.Namespace(progress=None, quiet=True), EngineSpec("ns3")) is None
    assert network_line(argparse.Namespace(progress=False, quiet=False), EngineSpec("ns3")) is None
    cleared: list[int] = []
    show = step_printer(every_step=True, before=lambda: cleared.append(1))
    show({"step": 0, "time_ns": 1_500_000, "end_ns": 1_500_000})
    assert cleared == [1] and capsys.readouterr().out.startswith("[phantora] step 0 done: 1.500 ms")


def _live(
    tmp_path: Path, progress: bool, out: Path | None = None, in_coordinator: bool = False
) -> tuple[Any, list[Beat]]:
    """tests/test_bridge_ns3.py's small mix of collectives, live (a replay rank per GPU) on an ns-3 network server
    (`in_coordinator`: in the coordinator), with or without its progress (chunks of about 1 CPU ms, a message at most
    every 1 ms); files written to `out`."""
    from bridge.run import CosimRun
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.packet_config import PacketConfig
    from phantora.topology.generators import leaf_spine
    from tests.test_bridge_ns3 import WORKLOAD

    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", latency="1us")
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(WORKLOAD))
    beats: list[Beat] = []
    res = CosimRun(
        topo,
        EngineSpec("ns3", PacketConfig(cc="dcqcn")),
        rank_cmd=[sys.executable, "-m", "phantora.egraph.replay_rank", str(path)],
        timeout_s=600,
        on_progress=beats.append if progress else None,
        progress_s=0.001,
        out_dir=out,
        engine_in_coordinator=in_coordinator,
    ).run()
    return res, beats


@pytest.mark.ns3
def test_a_network_server_behind_a_live_run_reports_its_progress(tmp_path: Path, ns3_lib: Any) -> None:
    res, beats = _live(tmp_path, True)
    assert len(beats) >= 3
    clocks = [b.sim_ns for b in beats]
    assert clocks == sorted(clocks) and clocks[-1] > clocks[0] > 0 and clocks[-1] <= res.makespan_ns
    events = [b.events for b in beats]
    assert events == sorted(events) and events[-1] <= res.engine_stats["events"]
    assert all(b.cpu_s > 0 and b.workers == 0 and b.slowest == -1 for b in beats)


@pytest.mark.ns3
@pytest.mark.slow
def test_an_ns3_engine_in_the_coordinator_reports_its_progress_too(tmp_path: Path, ns3_lib: Any) -> None:
    res, beats = _live(tmp_path, True, in_coordinator=True)
    assert len(beats) >= 3 and all(b.cpu_s > 0 and b.workers == 0 for b in beats)
    clocks = [b.sim_ns for b in beats]
    assert clocks == sorted(clocks) and clocks[-1] > clocks[0] > 0 and clocks[-1] <= res.makespan_ns


NOT_SIMULATED = {"events", "server_cpu_s"}  # ns-3's counter counts the chunks' stops too; the server's CPU


@pytest.mark.ns3
@pytest.mark.slow
def test_a_live_run_writes_the_same_files_with_the_network_progress(tmp_path: Path, ns3_lib: Any) -> None:
    """The same live run without and with the server's progress: every file the network writes byte for byte,
    every collective's times and the engine's counters but its events the same."""
    runs = {}
    for progress in (False, True):
        out = tmp_path / f"progress-{progress}"
        out.mkdir()
        res, beats = _live(tmp_path, progress, out)
        assert bool(beats) == progress
        runs[progress] = (res, out)
    (quiet, qdir), (shown, sdir) = runs[False], runs[True]
    files = sorted(f.name for f in qdir.iterdir() if f.suffix == ".csv")
    assert {"flows.csv", "links.csv", "pfc.csv"} <= set(files)
    assert files == sorted(f.name for f in sdir.iterdir() if f.suffix == ".csv")
    for name in files:
        assert (qdir / name).read_bytes() == (sdir / name).read_bytes(), name
    assert quiet.collectives == shown.collectives and quiet.makespan_ns == shown.makespan_ns
    stats = {k: v for k, v in quiet.engine_stats.items() if k not in NOT_SIMULATED}
    assert stats == {k: v for k, v in shown.engine_stats.items() if k not in NOT_SIMULATED}


@pytest.mark.ns3
def test_decomposition_workers_beats_reach_the_driver(ns3_lib: Any) -> None:
    """tests/test_decompose.py's rail DAG on workers=2 with the display's beats (chunks of about 1 CPU ms): they
    come merged from both workers (the slowest one's clock, which only grows), and every completion is one
    engine's."""
    from bridge.workers import spawn_workers
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.heartbeat import attach_beats, detach_beats
    from phantora.netsim.packet_config import PacketConfig
    from tests.test_decompose import SETTINGS, one_engine_ends, rail_dag, tiny

    topo = tiny()
    flows = rail_dag(topo, stages=2)
    want = one_engine_ends(topo, flows)
    sim = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)), topo, spawner=spawn_workers)
    beats: list[Beat] = []
    try:
        found = attach_beats(sim, beats.append, every_s=0.001)
        assert len(found) == 1 and found[0].on_beat is not None  # the pool (no ns-3 engine in this process)
        sim.submit(flows, 0)
        got = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
        detach_beats(found)
        assert found[0].on_beat is None
    finally:
        sim.close()
    assert got == want
    assert beats, "no beat from the workers"
    assert all(b.workers == 2 and b.slowest in (0, 1) and b.events > 0 and b.cpu_s > 0 for b in beats)
    clocks = [b.sim_ns for b in beats]
    assert clocks == sorted(clocks) and clocks[-1] <= max(end for _, _, end in want)


@pytest.mark.ns3
@pytest.mark.slow
@pytest.mark.parametrize("every_s", [0.0, 0.001])
def test_stepped_partition_workers_beat_between_and_inside_rounds(tmp_path: Path, every_s: float) -> None:
    """tests/test_partition_fluid.py's all-to-all + all-reduce on the small rail fabric, fluid NVLink, 2 stepped
    partition workers, with a beat asked at every round (`beat_s` 0) or every 1 ms, from inside the rounds too (their
    C++ window loops): beats with both workers' events and the busiest of them, their clock and events growing, more
    beats than rounds when they come from inside, and every completion the run's without them."""
    import dataclasses

    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.heartbeat import attach_beats
    from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig
    from phantora.replay import replay_inprocess
    from phantora.workload import load_workload
    from tests.test_partition_fluid import RAIL, tiny_workload

    wl = load_workload(tiny_workload(tmp_path / "tiny.toml"), world=RAIL.num_ranks)
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", queue_sample_ns=0, partition=2)
    runs = {}
    for beat in (False, True):
        sim = make_engine(EngineSpec("ns3", cfg), RAIL, partitioner=run_partitioned_batches, stepper=spawn_stepped)
        beats: list[Beat] = []
        try:
            if beat:
                assert len(attach_beats(sim, beats.append, every_s=every_s)) == 1  # the stepped pool
            res = replay_inprocess(wl, RAIL, sim)
            rounds = sim.stats()["partition"]["rounds"]
        finally:
            sim.close()
        runs[beat] = (sorted(dataclasses.astuple(c) for c in res.completions), beats)
    (quiet, none), (shown, beats) = runs[False], runs[True]
    assert shown == quiet and not none
    assert (len(beats) > rounds) == (every_s > 0)  # (with none from inside: at most one a round)
    assert len(beats) > 1 and all(b.workers == 2 and b.slowest in (0, 1) and b.cpu_s > 0 for b in beats)
    for field in ("sim_ns", "events"):
        seq = [getattr(b, field) for b in beats]
        assert seq == sorted(seq) and seq[-1] > seq[0]


@pytest.mark.ns3
@pytest.mark.slow
def test_whole_dag_partition_workers_beat_from_inside_their_window_loop(tmp_path: Path) -> None:
    """The same workload on the small rail fabric with packet NVLink, keyed, on 2 partition workers that run it
    whole (their C++ window loop, `bridge.cut_worker`), with beats every 1 CPU ms: they come from inside the one
    run call (before any completion is handed out), with both workers' events, and every completion is the run's
    without them."""
    import dataclasses

    from bridge.cut_pool import run_partitioned_batches
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.heartbeat import attach_beats
    from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig
    from phantora.replay import replay_inprocess
    from phantora.workload import load_workload
    from tests.test_partition_fluid import RAIL, tiny_workload

    wl = load_workload(tiny_workload(tmp_path / "tiny.toml"), world=RAIL.num_ranks)
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, queue_sample_ns=0, partition=2)
    runs = {}
    for beat in (False, True):
        sim = make_engine(EngineSpec("ns3", cfg), RAIL, partitioner=run_partitioned_batches)
        beats: list[Beat] = []
        try:
            if beat:
                assert len(attach_beats(sim, beats.append, every_s=0.001)) == 1  # the engine, its own beat source
            res = replay_inprocess(wl, RAIL, sim)
        finally:
            sim.close()
        runs[beat] = (sorted(dataclasses.astuple(c) for c in res.completions), beats)
    (quiet, none), (shown, beats) = runs[False], runs[True]
    assert shown == quiet and not none
    assert len(beats) > 1 and all(b.workers == 2 and b.slowest in (0, 1) and b.cpu_s > 0 for b in beats)
    for field in ("sim_ns", "events"):
        seq = [getattr(b, field) for b in beats]
        assert seq == sorted(seq) and seq[-1] > seq[0]
    assert beats[-1].sim_ns <= max(c[2] for c in shown)  # (their ends)


@pytest.mark.ns3
@pytest.mark.slow
def test_a_live_run_on_decomposition_workers_reports_their_merged_progress(tmp_path: Path) -> None:
    """`phantora run`'s path with workers=2 (tests/test_decompose.py's rail fabric and settings, hierarchical
    all-reduces that stay on their rails): the network server hosts the driver, whose pool merges its workers' beats
    and sends them on to the coordinator, which passes them to the launcher."""
    from bridge.run import CosimRun
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.packet_config import PacketConfig
    from tests.test_decompose import SETTINGS, tiny

    wl = tmp_path / "wl.toml"
    wl.write_text(
        'name = "rails"\n[defaults]\nranks = "all"\ndtype = "bf16"\n[[op]]\nname = "ar"\nkind = "all_reduce"\n'
        'bytes = "32MiB"\nalgorithm = "hierarchical"\nrepeat = 2\nevery = "1us"\n'
    )
    beats: list[Beat] = []
    res = CosimRun(
        tiny(),
        EngineSpec("ns3", PacketConfig(**SETTINGS, workers=2)),
        rank_cmd=[sys.executable, "-m", "phantora.egraph.replay_rank", str(wl)],
        timeout_s=600,
        on_progress=beats.append,
        progress_s=0.01,
    ).run()
    assert len(beats) >= 3 and all(b.workers == 2 and b.slowest in (0, 1) and b.cpu_s > 0 for b in beats)
    for field in ("sim_ns", "events"):
        seq = [getattr(b, field) for b in beats]
        assert seq == sorted(seq) and seq[-1] > seq[0]
    assert res.makespan_ns > 0 and res.late_collectives == 0
