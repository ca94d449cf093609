"""Progress of replay, netsim and sweep: what it shows, and that showing it changes no simulated result."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from phantora import progress as P
from phantora.cli import main
from phantora.collectives.spec import AlgoOptions
from phantora.netsim.base import drain_observed
from phantora.netsim.flow import FlowSimulator
from phantora.replay import plan_workload
from phantora.topology import load_topology
from phantora.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
MOE = ROOT / "workloads" / "moe_alltoall.toml"


def test_the_progress_line_gives_done_rate_and_a_linear_eta() -> None:
    out = io.StringIO()
    p = P.Progress("lines", "replay", 100, "flow", file=out, every_s=0)
    p.t0 -= 10  # ten seconds ago
    p.update(25)
    assert p.line(p.t0 + 10) == "[phantora] replay: 25/100 flows (25%), 0:10 elapsed, ETA 0:30"
    p.update(50, sim_ns=2_500_000, events=1_000_000)
    line = p.line(p.t0 + 10)
    assert re.search(r"50/100 flows \(50%\), simulated 2\.500 ms, 1,000,000 events \(100\.0 k/s\), [0-9.]+ CPU s, "
                     r"0:10 elapsed, ETA 0:10", line)  # fmt: skip
    p.update(add=1, failed=1)
    assert "51/100 flows (51%), 1 failed" in p.line()
    assert len(out.getvalue().splitlines()) == 3 and out.getvalue().startswith("[phantora] replay: 25/100 flows")
    rare = P.Progress("lines", "sweep", 6, "run", file=out, every_s=3600)
    rare.update(add=1)
    assert len(out.getvalue().splitlines()) == 3  # at most one line an hour


def test_the_engines_counter_is_wanted_only_when_a_line_or_the_bars_figures_show_it() -> None:
    """A caller reads the engine's events (partition workers answer with their records) only when `update` would
    show them: a line every `every_s`, never when off."""
    out = io.StringIO()
    p = P.Progress("lines", "replay", 10, "flow", file=out, every_s=3600)
    assert not p.shows_extras()  # the first line is due an hour after the start
    p.t0 -= 3600
    p._last_line -= 3600
    assert p.shows_extras()
    p.update(1, events=5)
    assert not p.shows_extras() and len(out.getvalue().splitlines()) == 1
    assert not P.Progress("off", "replay", 10, "flow").shows_extras()


def test_modes_follow_the_flags() -> None:
    assert P.auto_mode(None, quiet=True) == "off" and P.auto_mode(False) == "off" and P.auto_mode(True) == "bar"
    assert P.auto_mode(None) == "lines"  # pytest's stderr is not a terminal


@pytest.mark.parametrize("model", ["ideal", "nccl"])
def test_observed_drain_runs_the_very_events_of_a_drain(model: str) -> None:
    """The flow engine stopped ~200 times for the display ends in the state one drain() leaves. Under the NCCL
    model many watched flows end together (NCCL's rate caps), so the ideal model's plan gives the > 100 stops."""
    topo = load_topology("testbed16")
    wl = load_workload(MOE, world=topo.num_ranks)
    plan = plan_workload(wl, topo, AlgoOptions(granularity="chunked", model=model))
    ticks: list[int] = []
    states = []
    for observed in (False, True):
        sim = FlowSimulator(topo)
        sim.submit(plan.flows, at=0)
        if observed:
            done = drain_observed(sim, [f.id for f in plan.flows], lambda got: ticks.append(len(got)))
        else:
            done = sim.drain()
        states.append(([(c.flow_id, c.start_ns, c.end_ns) for c in done], sim.now(), sim.stats(), sim.channel_bytes()))
    assert states[0] == states[1]
    assert len(ticks) > (100 if model == "ideal" else 50) and sum(ticks) == len(plan.flows)


def _outputs(d: Path) -> dict[str, str]:
    """Every output but status.json (wall times) and config.json (the command line, which differs by design)."""
    return {p.name: p.read_text() for p in sorted(d.iterdir()) if p.name not in ("status.json", "config.json")}


def test_replay_and_netsim_results_are_the_same_with_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(P, "LINE_EVERY_S", 0.0)  # a line at every update
    for cmd in (["replay", str(MOE)], ["netsim", "-f", str(MOE)]):
        outs = {}
        for mode in ("--quiet", "--no-progress", "--progress", None):  # None: not a terminal, plain lines
            out = tmp_path / f"{cmd[0]}{mode}"
            assert main([*cmd, "-t", "testbed16", "--out", str(out), *([mode] if mode else [])]) == 0
            err = capsys.readouterr().err
            if mode in ("--quiet", "--no-progress"):
                assert "[phantora]" not in err and "flows/s" not in err
            elif mode is None:
                assert f"[phantora] {cmd[0]}: " in err and "flows (100%)" in err
            docs = _outputs(out)
            if "summary.json" in docs:  # netsim's: all but the wall time
                summary = json.loads(docs["summary.json"])
                assert summary.pop("wall_s") > 0
                docs["summary.json"] = json.dumps(summary)
            assert {"results.json", "flows.csv"} <= set(docs) or {"summary.json", "flows.csv"} <= set(docs)
            outs[mode] = docs
        assert outs["--quiet"] == outs["--progress"] == outs[None] == outs["--no-progress"], cmd[0]


@pytest.mark.ns3
def test_ns3_results_are_the_same_with_progress(ns3_lib, tmp_path: Path) -> None:
    """Every trace byte for byte; only ns-3's own event count grows by the simulator's stop events."""
    argv = ["netsim", "--network", "ns3", "--cc", "dcqcn", "-t", "hpcc/star8", "-f", "incast4"]
    assert main([*argv, "-q", "--out", str(tmp_path / "quiet")]) == 0
    assert main([*argv, "--progress", "--out", str(tmp_path / "shown")]) == 0
    quiet, shown = _outputs(tmp_path / "quiet"), _outputs(tmp_path / "shown")
    sq, ss = (json.loads(d.pop("summary.json")) for d in (quiet, shown))
    assert quiet == shown and len(quiet) >= 10  # fct.csv, pfc.csv, queues.csv, links.csv, ...
    extra = ss.pop("events") - sq.pop("events")
    ss.pop("wall_s"), sq.pop("wall_s")
    assert ss == sq and 0 <= extra <= 2 * 200


def test_a_sweep_shows_configurations_done_and_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phantora.sweep import SweepSpec, run_sweep

    monkeypatch.setattr(P, "LINE_EVERY_S", 0.0)
    spec = SweepSpec(name="p", fixed={"workload": str(MOE)}, grid={"topology": ["testbed16", "no_such_topology"]})
    res = run_sweep(spec, tmp_path / "s", jobs=1, progress="lines", plots=False)
    assert [r["status"] for r in res.rows] == ["ok", "failed"]
    err = capsys.readouterr().err
    assert "[phantora] sweep p: 2/2 runs (100%), 1 failed" in err and "run 1 failed" in err
