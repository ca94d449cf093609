"""HPCC and SimAI readers/writers: reference files, round trips, and one test per malformed-file error."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.paths import shared_dir
from phantora.topology import load_topology, rail_optimized, read_hpcc, read_simai, write_hpcc, write_simai
from phantora.topology.describe import rank_bisection_bps

REF = shared_dir() / "reference-runs/inputs"
SHIPPED = Path(__file__).resolve().parents[1] / "topologies"
G = 10**9


def links(t) -> list[tuple[int, int, int, int]]:
    return [(lk.a, lk.b, lk.bandwidth_bps, lk.latency_ns) for lk in t.links]


def hpcc_files() -> list[Path]:
    found = sorted(REF.glob("*.topo.txt")) if REF.is_dir() else []
    return found or sorted((SHIPPED / "hpcc").glob("*.topo.txt"))


@pytest.mark.parametrize("path", hpcc_files(), ids=lambda p: p.name)
def test_reference_hpcc_files(path: Path) -> None:
    t = read_hpcc(path)
    assert t.num_ranks == 8
    assert all(t.nodes[e].kind == "host" for e in t.endpoints)
    assert {(lk.bandwidth_bps, lk.latency_ns) for lk in t.links} == {(100 * G, 1000)}  # 100Gbps, 1000ns
    again = read_hpcc(io.StringIO(write_hpcc(t)))
    assert links(again) == links(t) and [n.kind for n in again.nodes] == [n.kind for n in t.nodes]


def test_star8_and_twoleaf8_match_their_toml_equivalents() -> None:
    for name in ("star8", "twoleaf8"):
        hpcc, toml = load_topology(f"hpcc/{name}"), load_topology(name)
        assert links(hpcc) == links(toml)
    twoleaf = load_topology("hpcc/twoleaf8")
    assert [n.tier for n in twoleaf.nodes[8:]] == [1, 1, 2]  # two leaves, one spine
    assert rank_bisection_bps(twoleaf) == 100 * G  # one 100G uplink per leaf: 4:1 for 4 x 100G hosts
    assert len(twoleaf.route(0, 7)) == 4 and len(twoleaf.route(0, 3)) == 2


def test_real_simai_style_file() -> None:
    # SimAI's own layout: ids on one line with a trailing space, delays in ms, 2 NVSwitches
    # 8 GPUs (2 servers x 4), NVSwitches 8-9, leaves 10-11 (GPUs 0-1, 4-5 on 10; 2-3, 6-7 on 11), spine 12
    lines = ["13 4 2 3 18 H20", "8 9 10 11 12 "]
    lines += [f"{g} {8 + g // 4} 900Gbps 0.000025ms 0" for g in range(8)]
    lines += [f"{g} {10 + g % 4 // 2} 200Gbps 0.001ms 0" for g in range(8)]
    lines += ["10 12 400Gbps 0.001ms 0", "11 12 400Gbps 0.001ms 0"]
    t = read_simai(io.StringIO("\n".join(lines)))
    assert t.gpu_model == "h20"
    assert [t.nodes[i].kind for i in range(13)] == ["gpu"] * 8 + ["nvswitch"] * 2 + ["switch"] * 3
    assert [t.nodes[e].host for e in t.endpoints] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.nodes[8].host == 0 and t.nodes[9].host == 1
    assert [t.nodes[i].tier for i in (10, 11, 12)] == [1, 1, 2]
    assert {lk.latency_ns for lk in t.links} == {25, 1000}
    assert len(t.route(0, 3)) == 2 and t.nodes[t.channel_ends(t.route(0, 3)[0])[1]].kind == "nvswitch"
    assert len(t.route(0, 6)) == 4  # gpu0 on leaf 10, gpu6 on leaf 11, via spine 12


def test_shipped_simai_sample_round_trips() -> None:
    t = load_topology("rail16_h100")
    assert t.meta["format"] == "simai" and t.num_ranks == 16 and t.gpu_model == "h100"
    again = read_simai(io.StringIO(write_simai(t)))
    assert links(again) == links(t)
    assert [(n.kind, n.host, n.tier) for n in again.nodes] == [(n.kind, n.host, n.tier) for n in t.nodes]


@pytest.mark.parametrize("name", ["testbed16", "rail128", "leafspine1024"])
def test_generated_topologies_round_trip_through_simai(name: str) -> None:
    t = load_topology(name)
    again = read_simai(io.StringIO(write_simai(t)))
    assert links(again) == links(t)  # generators already number nodes the SimAI way
    assert [(n.kind, n.host, n.tier) for n in again.nodes] == [(n.kind, n.host, n.tier) for n in t.nodes]
    assert again.gpu_model == "h100"


def test_simai_writer_renumbers_gpus_first() -> None:
    t = load_topology("hpcc/twoleaf8")
    text = write_simai(t)
    assert text.splitlines()[0] == "11 1 0 3 10 UNKNOWN"
    back = read_simai(io.StringIO(text))
    assert links(back) == links(t)


def test_hpcc_writer_keeps_ids_and_makes_nvswitches_switches() -> None:
    t = rail_optimized(2, 4, 2)
    back = read_hpcc(io.StringIO(write_hpcc(t)))
    assert links(back) == links(t)
    assert [n.kind for n in back.nodes] == ["host" if n.kind == "gpu" else "switch" for n in t.nodes]


GOOD_HPCC = ["5 1 4", "4", "0 4 100Gbps 1000ns 0", "1 4 100Gbps 1000ns 0", "2 4 100Gbps 1000ns 0", "3 4 100Gbps 1us 0"]


def bad_hpcc(tmp_path: Path, line: int, new: str | None) -> Path:
    lines = list(GOOD_HPCC)
    if new is None:
        del lines[line - 1]
    else:
        lines[line - 1] = new
    path = tmp_path / "bad.topo.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("line", "new", "where", "what"),
    [
        (1, "5 1", 1, "header"),
        (1, "5 x 4", 1, "switch count"),
        (1, "5 1 5", 1, "announces 5 links"),
        (1, "5 5 4", 1, "leave no endpoint"),
        (2, "7", 2, "not a node"),
        (2, "4 4", 2, "brings the count"),
        (3, "0 9 100Gbps 1000ns 0", 3, "unknown node id 9"),
        (3, "0 0 100Gbps 1000ns 0", 3, "itself"),
        (4, "1 4 0Gbps 1000ns 0", 4, "positive"),
        (4, "1 4 -100Gbps 1000ns 0", 4, "cannot parse rate"),
        (4, "1 4 100Gbs 1000ns 0", 4, "unknown rate unit"),
        (5, "2 4 100Gbps soon 0", 5, "cannot parse time"),
        (5, "2 4 100Gbps 1000ns 2", 5, "error rate"),
        (6, "3 4 100Gbps", 6, "fields"),
        (6, "3 4 100Gbps 1us 0\n3 4 100Gbps 1us 0", 7, "more link lines"),
    ],
)
def test_malformed_hpcc_names_file_and_line(tmp_path: Path, line: int, new: str, where: int, what: str) -> None:
    path = bad_hpcc(tmp_path, line, new)
    with pytest.raises(InputError, match=what) as err:
        read_hpcc(path)
    assert f"{path}:{where}:" in str(err.value)


def test_missing_link_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="announces 4 links, the file has 3") as err:
        read_hpcc(bad_hpcc(tmp_path, 6, None))
    assert ":1:" in str(err.value)


def test_disconnected_hpcc_file(tmp_path: Path) -> None:
    path = tmp_path / "split.topo.txt"
    path.write_text("6 2 4\n4 5\n0 4 100Gbps 1us 0\n1 4 100Gbps 1us 0\n2 5 100Gbps 1us 0\n3 5 100Gbps 1us 0\n")
    with pytest.raises(InputError, match="disconnected") as err:
        read_hpcc(path)
    assert str(path) in str(err.value)


def test_empty_and_unreadable_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(InputError, match="empty"):
        read_hpcc(empty)
    with pytest.raises(InputError, match="cannot read"):
        read_hpcc(tmp_path / "missing.txt")


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("4 2 1 0 3", 1, "SimAI header"),
        ("4 2 2 2 3 H100\n0 1 2 3", 1, "leave no GPU"),
        ("4 2 1 0 3 H100\n4\n0 4 1Gbps 1ns 0", 2, "not a node"),
        (
            "5 2 1 1 3 H100\n2 3\n0 2 1Gbps 1ns 0\n1 4 1Gbps 1ns 0\n2 3 1Gbps 1ns 0",
            5,
            "NVSwitch 2 is linked to switch 3",
        ),
    ],
)
def test_malformed_simai_names_file_and_line(tmp_path: Path, text: str, where: int, what: str) -> None:
    path = tmp_path / "bad.simai"
    path.write_text(text + "\n")
    with pytest.raises(InputError, match=what) as err:
        read_simai(path)
    assert f"{path}:{where}:" in str(err.value)


def test_format_sniffing_and_override(tmp_path: Path) -> None:
    assert load_topology(SHIPPED / "hpcc" / "star8.topo.txt").meta["format"] == "hpcc"
    assert load_topology(SHIPPED / "simai" / "rail16_h100.txt").meta["format"] == "simai"
    with pytest.raises(InputError, match="SimAI header"):
        load_topology(SHIPPED / "hpcc" / "star8.topo.txt", fmt="simai")
    odd = tmp_path / "odd.txt"
    odd.write_text("1 2 3 4\n")
    with pytest.raises(InputError, match="--format"):
        load_topology(odd)


def test_hpcc_without_switches() -> None:
    t = read_hpcc(io.StringIO("2 0 1\n\n0 1 100Gbps 1000ns 0\n"))  # empty switch line
    assert t.num_ranks == 2 and t.route(0, 1) == [0]
