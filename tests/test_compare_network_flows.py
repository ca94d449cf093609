"""`phantora compare`'s rows over the flows through the network: flows.csv's `nvlink` column tells a flow on its
hosts' NVSwitch alone (1) from one that left through the NICs (0), and the "(network flows)" rows take the latter,
shown only where a run has both kinds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from phantora.cli import main
from phantora.netsim.base import Completion, Flow
from phantora.report.compare import compare_runs, format_table, summarise
from phantora.results import schema as S
from phantora.results.read import load_run
from phantora.results.write import write_flows_csv
from phantora.topology import rail_optimized

# (fct_ns, standalone_ns, nvlink) per flow: NVLink flows of 10-40 ns, network flows of 100-500 ns.
NVLINK = [(10, 10, 1), (20, 10, 1), (30, 10, 1), (40, 10, 1)]
NETWORK = [(100, 100, 0), (200, 100, 0), (300, 100, 0), (400, 100, 0), (500, 100, 0)]


def _run_dir(root: Path, name: str, rows: list[tuple[int, int, int]], *, column: bool = True) -> Path:
    """A run directory holding only a flows.csv of `rows` (each 1,000 B, started at 0)."""
    d = root / name
    d.mkdir()
    head = "size_bytes,start_ns,fct_ns,standalone_fct_ns" + (",nvlink" if column else "")
    lines = [head] + [f"1000,0,{f},{a}" + (f",{n}" if column else "") for f, a, n in rows]
    (d / S.FLOWS_CSV).write_text("\n".join(lines) + "\n")
    return d


def test_network_rows_are_the_percentiles_of_the_flows_through_the_nics(tmp_path: Path) -> None:
    """Closed forms (linear interpolation): network FCTs 100..500 have p50 300 and p99 400 + 0.96 x 100 = 496;
    their slowdowns 1..5, p50 3 and p99 4.96; over all nine flows the p50 is the fifth smallest FCT, 100."""
    run = load_run(_run_dir(tmp_path, "mixed", NVLINK + NETWORK))
    got = summarise(run)
    assert got["fct_p50_ns"] == 100.0
    assert (got["net_flows"], got["nvlink_flows"]) == (5, 4)
    assert got["net_fct_p50_ns"] == pytest.approx(300.0)
    assert got["net_fct_p99_ns"] == pytest.approx(496.0)
    assert got["net_fct_max_ns"] == 500
    assert got["net_slowdown_p50"] == pytest.approx(3.0)
    assert got["net_slowdown_p99"] == pytest.approx(4.96)
    table = format_table(compare_runs([run]))
    row = next(line for line in table.splitlines() if line.startswith("FCT p99 (network flows)"))
    assert row.split()[-1] == "0.50"  # 496 ns in µs, two decimals
    assert "flows on NVLink alone" in table


def test_network_rows_only_where_a_run_has_both_kinds(tmp_path: Path) -> None:
    """A run of network flows alone shows no network rows (they would repeat the rows over all flows), nor does a
    flows.csv without the column (written before it existed); beside a mixed run the network-only run's rows are
    its all-flow figures, the old run's "-"."""
    net_only = load_run(_run_dir(tmp_path, "net", NETWORK))
    old = load_run(_run_dir(tmp_path, "old", NVLINK + NETWORK, column=False))
    assert all(m.key != "net_fct_p50_ns" for m in compare_runs([net_only, old]).metrics)
    assert summarise(old)["net_fct_p50_ns"] is None
    mixed = load_run(_run_dir(tmp_path, "mixed", NVLINK + NETWORK))
    cmp = compare_runs([mixed, net_only, old])
    assert cmp.metric("net_fct_p50_ns").values == pytest.approx([300.0, 300.0, None])  # type: ignore[arg-type]
    assert cmp.metric("nvlink_flows").values == [4, 0, None]
    assert cmp.metric("fct_p50_ns").values == pytest.approx([100.0, 300.0, 100.0])


def test_a_flow_through_the_nics_between_gpus_of_one_host_is_a_network_flow(tmp_path: Path) -> None:
    """GPUs 3 and 4 of `rail_optimized(2, 8, 2)` share host 0's NVSwitch: a flow between them is on NVLink unless it
    goes through the NICs (`Flow.via_nic`, NCCL's NET transport with P2P off); GPU 3 to GPU 11 crosses hosts."""
    topo = rail_optimized(2, 8, 2)
    flows = {0: Flow(0, 3, 4, 1000), 1: Flow(1, 3, 4, 1000, via_nic=True), 2: Flow(2, 3, 11, 1000)}
    done = [Completion(i, 0, 100, 1000, f.src, f.dst) for i, f in flows.items()]
    path = write_flows_csv(tmp_path / S.FLOWS_CSV, topo, done, flows=flows)
    with path.open() as fh:
        assert [r["nvlink"] for r in csv.DictReader(fh)] == ["1", "0", "0"]


def test_a_replay_across_two_hosts_marks_the_flows_whose_ends_are_on_different_hosts(tmp_path: Path) -> None:
    """testbed16 (2 hosts of 8 GPUs, one NVSwitch each): a flow is through the network exactly when its ends are
    on different hosts (gpu i on host i // 8), and compare's network rows are the percentiles of those flows."""
    wl = tmp_path / "wl.toml"
    wl.write_text(
        'name = "mix"\n[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "16MiB"\nranks = "all"\n'
        '[[op]]\nname = "a2a"\nkind = "all_to_all"\nbytes = "4MiB"\nranks = "all"\nafter = ["ar"]\n'
    )
    out = tmp_path / "run"
    assert main(["replay", str(wl), "--topology", "testbed16", "--network", "flow", "--out", str(out)]) == 0
    with (out / S.FLOWS_CSV).open() as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["size_bytes"]) > 0]
    cross = [int(r["src_id"]) // 8 != int(r["dst_id"]) // 8 for r in rows]
    assert [r["nvlink"] == "0" for r in rows] == cross
    assert 0 < sum(cross) < len(rows)
    fct = np.array([int(r["fct_ns"]) for r, c in zip(rows, cross, strict=True) if c], dtype=float)
    got = summarise(load_run(out))
    assert (got["net_flows"], got["nvlink_flows"]) == (sum(cross), len(rows) - sum(cross))
    assert got["net_fct_p50_ns"] == pytest.approx(np.percentile(fct, 50))
    assert got["net_fct_p99_ns"] == pytest.approx(np.percentile(fct, 99))
    assert main(["compare", str(out), "--out", str(tmp_path / "cmp"), "--no-plots"]) == 0
    metrics = {m["key"]: m["values"] for m in json.loads((tmp_path / "cmp" / "compare.json").read_text())["metrics"]}
    assert metrics["net_fct_p99_ns"] == pytest.approx([np.percentile(fct, 99)])
