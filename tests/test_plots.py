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
    check_pair(plots.fct_cdf([run], out / "fct"), "flow completion time (µs)", "fraction of flows (CDF)")
    # ports by the names of the node and of the node beyond the port, as links.csv names links
    check_pair(plots.queue_depth([run], out / "q"), "simulated time (µs)", "queue depth (KB)", "leaf0->gpu0")
    check_pair(plots.pfc_timeline([run], out / "pfc"), "simulated time (µs)", "paused port", "gpu3->leaf0")
    assert "node " not in (out / "q.svg").read_text() + (out / "pfc.svg").read_text()
    check_pair(plots.step_timeline(run, out / "steps"), "simulated time (µs)", "rank 3", "compute", "comm")
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
    check_pair(plots.fct_cdf([run], tmp_path / "lin"), "flow completion time (µs)")
    short = tmp_path / "short"
    short.mkdir()
    rows = ["flow_id,tag,src,dst,size_bytes,start_ns,end_ns,fct_ns,standalone_fct_ns"]
    rows += [f"{i},t,a,b,1000,0,{1000 + i},{1000 + i},900" for i in range(50)]
    (short / "flows.csv").write_text("\n".join(rows) + "\n")
    both = [run, load_run(short)]
    assert plots.spans_decades(np.concatenate([r.flows.fct_ns for r in both if r.flows is not None]))
    check_pair(plots.fct_cdf(both, tmp_path / "log"), "flow completion time (µs, log scale)", "short", "run")


def test_pfc_timeline_has_no_empty_panel_and_counts_the_ports_it_shows(ns3_like: Path, tmp_path: Path) -> None:
    calm = tmp_path / "calm"
    calm.mkdir()
    (calm / "pfc.csv").write_text("time_ns,node,node_id,node_type,port,prio,pause,from_node,from_node_id\n")
    runs = [load_run(ns3_like), load_run(calm)]
    paths = plots.pfc_timeline(runs, tmp_path / "pfc", max_ports=2)
    check_pair(paths, "2 of 4 paused ports (most paused first)", "no pauses in calm")
    svg = (tmp_path / "pfc.svg").read_text()
    assert svg.count("paused port") == 2  # one panel's y label and its title: no panel for the calm run
    # nothing paused anywhere: a card that says so, not an empty axis
    card = plots.pfc_timeline([runs[1]], tmp_path / "none")
    assert sorted(p.suffix for p in card) == [".png", ".svg"]
    assert "no PFC pauses in any run" in (tmp_path / "none.svg").read_text()


def svg_texts(path: Path) -> list[str]:
    return [t.text or "" for t in ET.parse(path).getroot().iter() if t.tag.endswith("text")]


def test_a_chart_with_nothing_to_show_says_so(tmp_path: Path) -> None:
    """A sweep without a single pause: pfc_paused_vs_cc is a card naming that, with no axis (it was a y axis
    from -0.04 to 0.04 around bars of 0)."""
    rows = [{"cc": cc, "pfc_paused_ns": 0} for cc in ("none", "dcqcn", "hpcc")]
    paths = plots.metric_vs_param(
        rows, "cc", "pfc_paused_ns", tmp_path / "p", ylabel="PFC paused time (µs)", empty="no PFC pauses in any run"
    )
    texts = svg_texts(next(p for p in paths if p.suffix == ".svg"))
    assert "no PFC pauses in any run" in texts and "PFC paused time vs cc" in texts
    assert not any(t.strip() in ("0.00", "0.04", "−0.04", "dcqcn") for t in texts)  # no ticks, no bars
    rows[1]["pfc_paused_ns"] = 5000
    bars = plots.metric_vs_param(rows, "cc", "pfc_paused_ns", tmp_path / "q", ylabel="PFC paused time (µs)")
    texts = svg_texts(next(p for p in bars if p.suffix == ".svg"))
    assert "dcqcn" in texts and "no PFC pauses in any run" not in texts


def test_identical_series_stay_visible(ns3_like: Path, tmp_path: Path) -> None:
    """Two runs with the same FCTs: the second is named "same as" the first, and drawn with other dashes
    and markers, so it does not vanish under it."""
    import shutil

    twin = tmp_path / "twin"
    shutil.copytree(ns3_like, twin)
    runs = [load_run(ns3_like), load_run(twin)]
    fig_paths = plots.fct_cdf(runs, tmp_path / "cdf")
    assert "twin (same as run)" in svg_texts(next(p for p in fig_paths if p.suffix == ".svg"))
    assert plots.same_as(["a", "b", "c"], [(np.arange(3),), (np.arange(3),), (np.arange(4),)]) == [
        "a",
        "b (same as a)",
        "c",
    ]
    assert plots.line_style(0)["ls"] != plots.line_style(1)["ls"]
    assert plots.line_style(0)["marker"] != plots.line_style(1)["marker"]


def test_a_dense_timeline_is_rasterised_and_stays_small(tmp_path: Path) -> None:
    """16 ranks x 3 steps x 1600 spans (77k bars; 14 MB of SVG paths before): the bars are one image inside
    the SVG, whose text (labels, ticks) stays text."""
    d = tmp_path / "dense"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"schema": "phantora.replay/1", "makespan_ns": 3_000_000, "ops": []}))
    ev = []
    for rank in range(16):
        for step in range(3):
            t0 = step * 1000.0
            ev.append({"name": f"step {step}", "cat": "step", "ph": "X", "pid": rank, "ts": t0, "dur": 1000.0})
            ev += [{"name": "op", "cat": "compute", "ph": "X", "pid": rank, "ts": t0 + k * 0.6, "dur": 0.4}
                   for k in range(1500)]  # fmt: skip
            ev += [{"name": "ar", "cat": "comm", "ph": "X", "pid": rank, "ts": t0 + 900 + k * 0.9, "dur": 0.5}
                   for k in range(100)]  # fmt: skip
    (d / "trace.json").write_text(json.dumps({"traceEvents": ev}))
    paths = plots.step_timeline(load_run(d), tmp_path / "steps")
    check_pair(paths, "simulated time (µs)", "rank 15", "compute", "comm")
    svg = tmp_path / "steps.svg"
    assert svg.stat().st_size < 1_000_000
    assert "<image" in svg.read_text()


def test_paper_style_is_one_column_wide(ns3_like: Path, tmp_path: Path) -> None:
    run = load_run(ns3_like)
    with plots.plot_style("paper"):
        paths = plots.fct_cdf([run], tmp_path / "paper")
    png = next(p for p in paths if p.suffix == ".png").read_bytes()
    assert int.from_bytes(png[16:20], "big") == round(3.5 * 300)  # 3.5 in at 300 dpi
    default = next(p for p in plots.fct_cdf([run], tmp_path / "plain") if p.suffix == ".png").read_bytes()
    assert int.from_bytes(default[16:20], "big") == 7 * 120  # and the style does not outlive its block


def test_the_plot_style_option_offers_every_style() -> None:
    from phantora.commands.options import PLOT_STYLES

    assert PLOT_STYLES == tuple(plots.PLOT_STYLES)
