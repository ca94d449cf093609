"""Plots: valid PNGs of non-trivial size, SVGs that parse, axis labels with units, nothing drawn without data."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from phantora.report import plots
from phantora.results.read import load_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_pair(paths: list[Path], *labels: str) -> None:
    """A PNG and an SVG; the PNG has its signature and real content, the SVG parses and has the labels."""
    assert sorted(p.suffix for p in paths) == [".png", ".svg"]
    png = next(p for p in paths if p.suffix == ".png")
    svg = next(p for p in paths if p.suffix == ".svg")
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000, f"{png} is only {len(data)} bytes"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 300 and height >= 200
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    texts = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
    for label in labels:
        assert label in texts, f"{label!r} not in the axis texts of {svg.name}"


@pytest.fixture()
def ns3_like(tmp_path: Path) -> Path:
    """A run directory with flows, PFC frames, queue samples and a trace, as an ns-3 live run writes them."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"schema": "phantora.replay/1", "makespan_ns": 2_000_000, "ops": []}))
    rng = np.random.default_rng(1)
    rows = ["flow_id,tag,src,dst,size_bytes,start_ns,end_ns,fct_ns,standalone_fct_ns"]
    for i in range(200):
        fct = int(rng.integers(50_000, 900_000))
        rows.append(f"{i},t,a,b,1000000,0,{fct},{fct},{fct // 2}")
    (d / "flows.csv").write_text("\n".join(rows) + "\n")
    pfc = ["time_ns,node,node_id,node_type,port,prio,pause,from_node,from_node_id"]
    for k in range(40):
        n = k % 4
        pfc += [f"{k * 40_000},gpu{n},{n},0,0,3,1,leaf0,8", f"{k * 40_000 + 15_000},gpu{n},{n},0,0,3,0,leaf0,8"]
    (d / "pfc.csv").write_text("\n".join(pfc) + "\n")
    q = ["time_ns,node,node_id,port,peer,prio,bytes"]
    for i in range(500):
        q += [f"{i * 4000},leaf0,8,0,gpu0,3,{int(300_000 * abs(np.sin(i / 30)))}", f"{i * 4000},leaf0,8,1,gpu1,3,{i}"]
    (d / "queues.csv").write_text("\n".join(q) + "\n")
    ev = []
    for rank in range(4):
        for step in range(3):
            t0 = step * 600.0
            ev.append({"name": f"step {step}", "cat": "step", "ph": "X", "pid": rank, "ts": t0, "dur": 600.0})
            ev.append({"name": "fwd", "cat": "compute", "ph": "X", "pid": rank, "ts": t0, "dur": 350.0 + rank})
            ev.append({"name": "all_reduce", "cat": "comm", "ph": "X", "pid": rank, "ts": t0 + 360, "dur": 230.0})
    (d / "trace.json").write_text(json.dumps({"traceEvents": ev}))
    return d


def test_every_plot_of_a_full_run(ns3_like: Path, tmp_path: Path) -> None:
    run = load_run(ns3_like)
    out = tmp_path / "plots"
    check_pair(plots.fct_cdf([run], out / "fct"), "flow completion time (us)", "fraction of flows (CDF)")
    # ports by the names of the node and of the node beyond the port, as links.csv names links
    check_pair(plots.queue_depth([run], out / "q"), "simulated time (us)", "queue depth (KB)", "leaf0->gpu0")
    check_pair(plots.pfc_timeline([run], out / "pfc"), "simulated time (us)", "paused port", "gpu3->leaf0")
    assert "node " not in (out / "q.svg").read_text() + (out / "pfc.svg").read_text()
    check_pair(plots.step_timeline(run, out / "steps"), "simulated time (us)", "rank 3", "compute", "comm")
    rows = [
        {"cc": cc, "buf": buf, "time_ns": t}
        for cc, buf, t in [("none", 1, 3e6), ("dcqcn", 1, 2e6), ("none", 2, 2.5e6), ("dcqcn", 2, 1.5e6)]
    ]
    paths = plots.metric_vs_param(rows, "cc", "time_ns", out / "t", ylabel="makespan (ms)", series=["buf"], scale=1e6)
    check_pair(paths, "makespan (ms)", "cc", "buf=2")


def test_no_data_no_plot(tmp_path: Path) -> None:
    """A flow-mode run has no PFC or queue data and no trace: those plots are skipped, not drawn empty."""
    d = tmp_path / "flow"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"schema": "phantora.replay/1", "makespan_ns": 5, "ops": []}))
    run = load_run(d)
    assert plots.fct_cdf([run], tmp_path / "a") == []
    assert plots.queue_depth([run], tmp_path / "b") == []
    assert plots.pfc_timeline([run], tmp_path / "c") == []
    assert plots.step_timeline(run, tmp_path / "d") == []
    assert plots.metric_vs_param([{"cc": "none", "time_ns": None}], "cc", "time_ns", tmp_path / "e", ylabel="x") == []
    assert not list(tmp_path.glob("*.png"))


def test_same_input_same_svg(ns3_like: Path, tmp_path: Path) -> None:
    run = load_run(ns3_like)
    a = plots.pfc_timeline([run], tmp_path / "a")
    b = plots.pfc_timeline([run], tmp_path / "b")
    svg = [p for p in a + b if p.suffix == ".svg"]
    assert svg[0].read_bytes() == svg[1].read_bytes()


def test_fct_cdf_takes_a_log_axis_when_fcts_span_decades(ns3_like: Path, tmp_path: Path) -> None:
    """50-900 us (1.3 decades): linear. Add 1 us flows (3 decades): log, so the short flows are not crushed."""
    run = load_run(ns3_like)
    assert run.flows is not None and not plots.spans_decades(run.flows.fct_ns)
    check_pair(plots.fct_cdf([run], tmp_path / "lin"), "flow completion time (us)")
    short = tmp_path / "short"
    short.mkdir()
    rows = ["flow_id,tag,src,dst,size_bytes,start_ns,end_ns,fct_ns,standalone_fct_ns"]
    rows += [f"{i},t,a,b,1000,0,{1000 + i},{1000 + i},900" for i in range(50)]
    (short / "flows.csv").write_text("\n".join(rows) + "\n")
    both = [run, load_run(short)]
    assert plots.spans_decades(np.concatenate([r.flows.fct_ns for r in both if r.flows is not None]))
    check_pair(plots.fct_cdf(both, tmp_path / "log"), "flow completion time (us, log scale)", "short", "run")


def test_pfc_timeline_has_no_empty_panel_and_counts_the_ports_it_shows(ns3_like: Path, tmp_path: Path) -> None:
    calm = tmp_path / "calm"
    calm.mkdir()
    (calm / "pfc.csv").write_text("time_ns,node,node_id,node_type,port,prio,pause,from_node,from_node_id\n")
    runs = [load_run(ns3_like), load_run(calm)]
    paths = plots.pfc_timeline(runs, tmp_path / "pfc", max_ports=2)
    check_pair(paths, "2 of 4 paused ports (most paused first)", "no pauses in calm")
    svg = (tmp_path / "pfc.svg").read_text()
    assert svg.count("paused port") == 2  # one panel's y label and its title: no panel for the calm run
    assert plots.pfc_timeline([runs[1]], tmp_path / "none") == []  # nothing paused: nothing drawn
