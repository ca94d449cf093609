"""`phantora topo`: summary text, JSON, drawing, conversion and clean errors."""

from __future__ import annotations

import json
from pathlib import Path

from phantora.cli import main
from phantora.topology import load_topology


def test_summary_text(capsys) -> None:
    assert main(["topo", "testbed16", "--route", "3", "12", "--key", "5"]) == 0
    out = capsys.readouterr().out
    assert "16 gpu, 2 nvswitch, 6 switch" in out
    assert "16 in 2 hosts (8 per host)" in out
    assert "oversubscription (leaf down:up)  1:1" in out
    assert "route rank 0 -> 1: gpu0 -> nvsw0 -> gpu1" in out
    assert "route rank 3 -> 12: gpu3 -> leaf0 -> spine" in out


def test_summary_names_the_hosts_cpu_when_the_file_gives_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "dgx_a100.toml"
    path.write_text('gpu = "a100"\ncpu = "amd"\n[generator]\nkind = "dgx_host"\n')
    assert main(["topo", str(path)]) == 0
    assert "  cpu          amd" in capsys.readouterr().out
    assert main(["topo", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cpu"] == "amd"
    assert main(["topo", "testbed16", "--json"]) == 0
    assert "cpu" not in json.loads(capsys.readouterr().out)


def test_summary_json(capsys) -> None:
    assert main(["topo", "leafspine1024", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ranks"] == 1024 and info["hosts"] == 128 and info["gpus_per_host"] == [8]
    assert info["nodes_by_kind"] == {"gpu": 1024, "nvswitch": 128, "switch": 40}
    assert info["leaf_oversubscription"] == {"min": 4.0, "max": 4.0}
    assert info["bisection"]["ratio"] == 0.25
    assert info["example_routes"][1]["hops"] == 4
    assert info["decomposition_pieces"] == info["switches_by_tier"]["leaf"]  # a 2-tier leaf-spine: one per leaf


def test_a_rail_fabric_has_one_piece_per_rail(capsys) -> None:
    assert main(["topo", "rail128", "--no-bisection"]) == 0
    out = capsys.readouterr().out
    assert "pieces       8 link-disjoint (nvlink=fluid): --set workers=8" in out  # 8 GPUs per host: 8 rails


def test_draw_and_convert(tmp_path: Path, capsys) -> None:
    png, hpcc, simai = tmp_path / "t.png", tmp_path / "t.topo.txt", tmp_path / "t.simai.txt"
    args = ["topo", "rail128", "--draw", str(png), "--write-hpcc", str(hpcc), "--write-simai", str(simai)]
    assert main([*args, "--no-bisection"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(load_topology(hpcc).links) == 320
    assert load_topology(simai).num_ranks == 128
    assert "wrote" in capsys.readouterr().out


def test_format_option_and_errors(tmp_path: Path, capsys) -> None:
    assert main(["topo", "hpcc/star8", "--format", "hpcc"]) == 0
    assert "8 host, 1 switch" in capsys.readouterr().out
    assert main(["topo", "hpcc/star8", "--format", "simai"]) == 2
    assert "star8.topo.txt:1:" in capsys.readouterr().err
    assert main(["topo", "testbed16", "--route", "0", "99"]) == 2
    assert "rank 99" in capsys.readouterr().err


def test_drawing_labels_never_overlap_and_the_legend_names_kinds_and_rates() -> None:
    from collections import Counter

    from phantora.topology.draw import topology_figure

    for name, all_labelled in (("testbed16", True), ("leafspine1024", False)):
        topo = load_topology(name)
        fig = topology_figure(topo)
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        names = {n.name for n in topo.nodes} | {f"host{n.host}" for n in topo.nodes}
        boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text() in names]
        overlaps = [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])]
        assert boxes and overlaps == [], name
        if all_labelled:  # 16 GPUs, 2 NVSwitches, 2 leaves, 4 spines: room for every name
            assert len(boxes) == len(topo.nodes)
        legend = {t.get_text() for t in fig.legends[0].get_texts()}
        # every link rate drawn (a collapsed server's NVLinks are inside it: links that reach a switch)
        switch = {n.id for n in topo.nodes if n.kind == "switch"}
        shown = [link for link in topo.links if all_labelled or {link.a, link.b} & switch]
        rates = Counter(link.bandwidth_bps for link in shown)
        for bps, count in rates.items():
            assert f"{bps / 1e9:g} Gb/s ({count} links)" in legend or f"{bps / 1e12:g} Tb/s ({count} links)" in legend
        assert {"leaf switch", "spine switch"} <= legend


def test_drawing_legend_fits_the_figure_and_bottom_labels_sit_below_the_links() -> None:
    """rail128's legend is wider than 4 columns allow: it takes fewer columns and stays inside the figure.
    The bottom layer's labels (hosts) sit under their nodes, where no link runs."""
    from phantora.topology.draw import topology_figure

    for name in ("rail128", "testbed16"):
        fig = topology_figure(load_topology(name))
        renderer = fig.canvas.get_renderer()
        box = fig.legends[0].get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (name, box)
        ax = fig.axes[0]
        texts = [t for t in ax.texts if t.get_text().startswith(("host", "nvsw"))]
        assert texts, name
        for t in texts:
            node_y = ax.transData.transform(t.xy)[1]
            assert t.get_window_extent(renderer).y1 < node_y, (name, t.get_text())  # wholly below its node


def test_partition_shows_groups_cut_and_lookahead(capsys) -> None:
    """leafspine1024 (32 leaves x 8 spines, 1 us links) in 4 switch groups: 32 x 8 x 3/4 = 192 links cut."""
    assert main(["topo", "leafspine1024", "--partition", "4", "--no-bisection"]) == 0
    out = capsys.readouterr().out
    assert "partition    4 switch groups, weighed by link capacity" in out
    assert out.count("25.0% of the work, 256 NICs, 8 leaf, 2 spine: ") == 4
    assert "cut links  192; min cut-link latency (lookahead) 1000 ns" in out
    assert main(["topo", "fattree_k4", "--partition", "4", "--no-bisection", "--json"]) == 0
    part = json.loads(capsys.readouterr().out)["partition"]
    assert part["cut_links"] == 12 and part["lookahead_ns"] == 1000 and len(part["cut_link_names"]) == 12
