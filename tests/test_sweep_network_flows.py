"""`phantora sweep` and a seed group's summary carry compare's network-flow figures (flows.csv `nvlink` 0) beside
the all-flow ones, shown where a run has flows on NVLink alone too."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from phantora.commands.seeds import format_spread
from phantora.results import schema as S
from phantora.sweep import SweepSpec, format_rows, run_sweep, seed_rows, table_rows
from phantora.sweep_local import RunOutcome, RunSpec
from tests.test_compare_network_flows import NETWORK, NVLINK, _run_dir

# A second mixed run: its network flows twice as slow (200..1000 ns, slowdowns 2..10), its NVLink flows the same.
SLOWER = NVLINK + [(2 * f, a, n) for f, a, n in NETWORK]
OLD_HEAD = "run  status  cc  time µs  fct p99 µs  slow p99  paused µs  qmax KB  ecn"


def _rows(spec: SweepSpec, dirs: list[Path]) -> list[dict]:
    """The sweep table of run directories made by hand, each run ended ok."""
    runs = [
        RunSpec(i, p, [], d, {k: p[k] for k in spec.grid})
        for i, (p, d) in enumerate(zip(spec.points(), dirs, strict=True))
    ]
    return table_rows(spec, runs, [RunOutcome(i, "ok", 0, "", 0.0) for i in range(len(runs))])


def _seed_group(group: Path, seeds: list[list]) -> Path:
    """A seed group's directory by hand: seed i + 1's run of flows `seeds[i]`, and its seeds.json."""
    group.mkdir()
    for seed, rows in enumerate(seeds, 1):
        _run_dir(group, f"seed{seed}", rows)
    runs = [{"seed": s, "dir": f"seed{s}"} for s in range(1, len(seeds) + 1)]
    doc = {"schema": S.SEEDS, "command": "replay", "state": "complete", "seeds": [r["seed"] for r in runs]}
    (group / S.SEEDS_JSON).write_text(json.dumps({**doc, "runs": runs}))
    return group


def test_the_sweep_table_shows_the_network_flows_percentiles(tmp_path: Path) -> None:
    """Closed forms (linear interpolation): network FCTs 100..500 ns have p50 300 and p99 496 (slowdowns 1..5:
    p99 4.96); doubled, 600 and 992 (9.92). Over all nine flows (NVLink slowdowns 1..4) the FCT p99 is
    400 + 0.92 x 100 = 492 and the slowdown p99 4 + 0.92 x 1 = 4.92; doubled, 984 and 8 + 0.92 x 2 = 9.84."""
    spec = SweepSpec(name="t", grid={"cc": ["a", "b"]})
    rows = _rows(spec, [_run_dir(tmp_path, "a", NVLINK + NETWORK), _run_dir(tmp_path, "b", SLOWER)])
    assert [(r["net_flows"], r["nvlink_flows"]) for r in rows] == [(5, 4), (5, 4)]
    assert [r["net_fct_p50_ns"] for r in rows] == pytest.approx([300.0, 600.0])
    assert [r["net_fct_p99_ns"] for r in rows] == pytest.approx([496.0, 992.0])
    assert [r["net_slowdown_p99"] for r in rows] == pytest.approx([4.96, 9.92])
    assert [r["fct_p99_ns"] for r in rows] == pytest.approx([492.0, 984.0])
    assert [r["slowdown_p99"] for r in rows] == pytest.approx([4.92, 9.84])
    table = format_rows(spec, rows).splitlines()
    head = (
        "run  status  cc  time µs  fct p99 µs  slow p99  net p50 µs  net p99 µs  net slow p99  paused µs  qmax KB  ecn"
    )
    assert table[0] == head
    assert table[2].split() == ["0", "ok", "a", "-", "0.49", "4.920", "0.30", "0.50", "4.960", "-", "-", "-"]
    assert table[3].split() == ["1", "ok", "b", "-", "0.98", "9.840", "0.60", "0.99", "9.920", "-", "-", "-"]


def test_runs_of_one_kind_of_flows_keep_the_old_table(tmp_path: Path) -> None:
    """Network flows alone (the network columns would repeat the all-flow ones) and a flows.csv without the
    `nvlink` column: the table as before, no network columns."""
    spec = SweepSpec(name="t", grid={"cc": ["a", "b"]})
    dirs = [_run_dir(tmp_path, "net", NETWORK), _run_dir(tmp_path, "old", NVLINK + NETWORK, column=False)]
    assert format_rows(spec, _rows(spec, dirs)).splitlines()[0] == OLD_HEAD


def test_a_seed_group_shows_the_mean_of_its_network_flows_figures(tmp_path: Path) -> None:
    """Two seeds, the mixed run and its slower twin: the network FCT p50 is the mean of 300 and 600 ns, 450 ns;
    its spread, the sample standard deviation of the two, 150 x sqrt(2) = 212.13 ns."""
    spec = SweepSpec(name="t", grid={"cc": ["a"], "seed": [1, 2]})
    groups = seed_rows(
        spec, _rows(spec, [_run_dir(tmp_path, "s1", NVLINK + NETWORK), _run_dir(tmp_path, "s2", SLOWER)])
    )
    assert groups[0]["net_fct_p50_ns"] == pytest.approx(450.0)
    assert groups[0]["net_fct_p50_ns_std"] == pytest.approx(150 * 2**0.5)
    group = _seed_group(tmp_path / "group", [NVLINK + NETWORK, SLOWER])
    lines = format_spread(group).splitlines()
    assert next(ln for ln in lines if "FCT p50 (network flows)" in ln).split()[-3:] == ["0.45", "±0.21", "[0.30-0.60]"]
    assert any("slowdown p99 (network flows)" in ln for ln in lines)


def test_a_flow_sweep_on_two_hosts_carries_the_network_flows_figures(tmp_path: Path) -> None:
    """testbed16 (2 hosts of 8 GPUs), a 16 MiB all-reduce then a 4 MiB all-to-all, two NCCL protocols: each row's
    network figures are the percentiles of its flows.csv's flows with `nvlink` 0, and the sweep draws their FCT
    p99 against the protocol and their CDF."""
    wl = tmp_path / "wl.toml"
    wl.write_text(
        'name = "mix"\n[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "16MiB"\nranks = "all"\n'
        '[[op]]\nname = "a2a"\nkind = "all_to_all"\nbytes = "4MiB"\nranks = "all"\nafter = ["ar"]\n'
    )
    spec = SweepSpec(
        name="p",
        fixed={"workload": str(wl), "topology": "testbed16", "network": "flow"},
        grid={"protocol": ["LL128", "Simple"]},
    )
    out = tmp_path / "out"
    res = run_sweep(spec, out, jobs=2, progress=False, report=lambda _m: None)
    assert [r["status"] for r in res.rows] == ["ok", "ok"]
    for row in res.rows:
        with (Path(row["dir"]) / S.FLOWS_CSV).open() as fh:
            flows = [r for r in csv.DictReader(fh) if int(r["size_bytes"]) > 0]
        net = np.array([int(r["fct_ns"]) for r in flows if r["nvlink"] == "0"], dtype=float)
        assert 0 < net.size < len(flows)
        assert (row["net_flows"], row["nvlink_flows"]) == (net.size, len(flows) - net.size)
        assert row["net_fct_p50_ns"] == pytest.approx(np.percentile(net, 50))
        assert row["net_fct_p99_ns"] == pytest.approx(np.percentile(net, 99))
    with (out / "sweep.csv").open() as fh:
        assert [float(r["net_fct_p99_ns"]) for r in csv.DictReader(fh)] == pytest.approx(
            [r["net_fct_p99_ns"] for r in res.rows]
        )
    assert "net p50 µs" in format_rows(spec, res.rows).splitlines()[0]
    for name in ("net_fct_p99_vs_protocol", "fct_cdf_network"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_plots_a_seed_groups_network_fct_p99_with_its_range(tmp_path: Path) -> None:
    """A seed group (the mixed run and its slower twin) beside one mixed run: compare's per-run bars gain the
    network flows' FCT p99, the mean of 496 and 992 ns (744) with the range 496-992, the single run's 496 for all
    three; beside a run of network flows alone (no NVLink flows anywhere) the key is left out."""
    from phantora.report.compare import load_and_compare, spread_rows, write_report

    group = _seed_group(tmp_path / "group", [NVLINK + NETWORK, SLOWER])
    single = _run_dir(tmp_path, "one", NVLINK + NETWORK)
    loaded, cmp = load_and_compare([group, single])
    rows = spread_rows(cmp)
    got = [r[k] for r in rows for k in ("net_fct_p99_ns", "net_fct_p99_ns_min", "net_fct_p99_ns_max")]
    assert got == pytest.approx([744.0, 496.0, 992.0, 496.0, 496.0, 496.0])
    written = write_report(tmp_path / "rep", loaded, cmp)
    assert tmp_path / "rep" / "net_fct_p99_by_run.png" in written
    net_group = _seed_group(tmp_path / "netgroup", [NETWORK, NETWORK])
    _, alone = load_and_compare([net_group, _run_dir(tmp_path, "net", NETWORK)])
    assert all("net_fct_p99_ns" not in r and "fct_p99_ns" in r for r in spread_rows(alone))
