"""`phantora compare` shows load balancing and traffic classes side by side with per-flow ECMP (two tiny runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.cli import main
from phantora.report.compare import class_figures, load_and_compare
from phantora.results.read import RunData

pytestmark = pytest.mark.ns3

TOPO = """[generator]
kind = "leaf_spine"
leaves = 2
endpoints_per_leaf = 2
spines = 2
nic_rate = "100Gbps"
uplink_rate = "100Gbps"
latency = "1us"
nvswitch = false
"""
# <src> <dst> <priority group> <dport> <bytes> <start s>: cross-leaf flows both ways, two classes, all at t = 0
ONE_WAY = [(0, 2, 1, 100, 400_000), (1, 3, 1, 100, 400_000), (0, 3, 3, 100, 300_000), (1, 2, 3, 100, 200_000)]
FLOWS = ONE_WAY + [(d, s, p, q, n) for s, d, p, q, n in ONE_WAY]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("cmp_lb")
    (root / "ls.toml").write_text(TOPO)
    (root / "flows.txt").write_text(f"{len(FLOWS)}\n" + "".join(f"{s} {d} {p} {q} {n} 0\n" for s, d, p, q, n in FLOWS))
    out = []
    for name, sets in (("ecmp", []), ("spray", ["lb=spray", "rx=sack", "sched=strict"])):
        args = ["netsim", "-t", str(root / "ls.toml"), "-f", str(root / "flows.txt"), "--network", "ns3"]
        args += [x for s in sets for x in ("--set", s)] + ["-o", str(root / name), "--no-progress"]
        assert main(args) == 0
        out.append(root / name)
    return out


def test_compare_shows_spread_reordering_and_bytes_per_class(runs: list[Path]) -> None:
    _, cmp = load_and_compare(runs)
    assert cmp.runs[1]["settings"]["lb"] == "spray" and cmp.runs[0]["settings"]["lb"] == "ecmp"
    spread = cmp.metric("switch_link_spread").values
    assert all(v is not None for v in spread)
    assert spread[1] <= 1.2  # random spraying of ~2,600 packets (and their ACKs) evens the spine links
    for prio in (1, 3):  # bytes per class: the flow file's sizes, in both runs
        want = sum(n for _, _, p, _, n in FLOWS if p == prio)
        assert cmp.metric(f"class:bytes:{prio}").values == [want, want]
    ooo = cmp.metric("ooo_packets").values
    assert ooo[0] == 0 and ooo[1] is not None


def test_compare_table_prints_the_class_rows(runs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *map(str, runs)]) == 0
    text = capsys.readouterr().out
    assert "flow bytes, class 1" in text and "flow bytes, class 3" in text
    assert "switch links idle" in text


def test_class_figures_read_the_engine_counters_by_class() -> None:
    run = RunData(path=Path("."), label="x", engine={"drops_class2": 5, "trimmed_bytes_class2": 4096, "drops": 5})
    assert class_figures(run) == {"class:drops:2": 5, "class:trimmed:2": 4096}
