"""NCCL's ring search fallback on a PCIe host, recorded where a researcher looks: NCCL_P2P_DISABLE=1 under one Intel
Gen4 switch leaves no ring at any speed (each of the 8 SHM hops climbs the switch's x16 uplink and comes down it at
Intel's 6/5, 24 / 9.6 = 2.5 GB/s, below ampere's slowest search speed, 3), so search.cc (v2.30.7-1) logs "Could
not find a path for pattern 4, falling back to simple order" and rates one channel of 0.1 GB/s. NCCL's tuner
chooses by that figure; the kernel copies at the uplink's rate (2f80609). The choice record says so
(`search_fallback`), carries NCCL's own estimate (`nccl_model_time_us`) next to the simulated time, and `phantora
nccl-tests` prints NCCL's INFO line once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.report.nccl_tests import fallback_note
from phantora.results import schema as S
from phantora.results.run_dir import nccl_args
from phantora.topology import pcie_host
from tests.engine_pair import flow_and_ns3_end_ns

N = 8
LAT_US = 8.4 + 2 * (N - 1) * 5.7  # tuning.cc: ring Simple base + 2 (n - 1) PCI hops
ALG_PER_BUS = N / (2 * (N - 1))  # all-reduce: algbw = busbw x n / 2 (n - 1)
UPLINK_BUS = 16 * 120 / 80.0 / (N * 6 / 5)  # the Gen4 x16 uplink (24 GB/s) over 8 hops at INTEL_P2P_OVERHEAD
FALLBACK_BW = 0.1  # search.cc: graph->bwIntra = 0.1
ONE_SWITCH = 'name = "pcie8_1s"\ngpu = "a100-pcie"\ncpu = "intel"\n[generator]\nkind = "pcie_host"\ngpus_per_host = 8\n'


def _us(size: int, bus_gbs: float) -> float:
    """A ring all-reduce's time at bus bandwidth `bus_gbs`, with NCCL's Simple latency."""
    return LAT_US + size / (1000 * bus_gbs * ALG_PER_BUS)


def _opts(**env: str) -> AlgoOptions:
    return AlgoOptions(nccl_env=nccl_env(env))


def _planned(env: dict[str, str], size: int, **kw: object) -> dict[str, object]:
    """The choice a run records for an 8-GPU all-reduce (what cosim.json and the trace carry)."""
    planner = CollectivePlanner(pcie_host(N, **kw), _opts(**env), Mirrors(N, N))
    plan = planner.plan(CallSpec("all_reduce", tuple(range(N)), size, "fp32"), "ar")
    assert plan.choice is not None
    return plan.choice


def test_a_runs_choice_record_says_the_search_fell_back_with_nccls_own_estimate() -> None:
    size = 64 << 20
    got = _planned({"NCCL_P2P_DISABLE": "1"}, size)
    assert (got["algorithm"], got["protocol"], got["search_fallback"]) == ("Ring", "Simple", True)
    assert got["nccl_model_time_us"] == pytest.approx(_us(size, FALLBACK_BW), rel=1e-6)  # 1.17 s, NCCL's estimate
    assert got["model_time_us"] == pytest.approx(_us(size, UPLINK_BUS), rel=0.005)  # what the links allow
    trace = nccl_args([{"nccl": got, "group": list(range(N)), "name": "all_reduce#0"}])
    assert trace[(3, "all_reduce#0", tuple(range(N)))]["nccl"]["search_fallback"] is True  # rank 3's span
    for env, kw in (({}, {}), ({"NCCL_P2P_DISABLE": "1"}, {"sockets": 2})):  # a ring fits: 4 x 24 P2P, 1 x 5 SHM
        other = _planned(env, size, **kw)
        assert "search_fallback" not in other and "nccl_model_time_us" not in other


def test_nccl_tests_prints_nccls_info_line_once_and_results_json_keeps_both_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = tmp_path / "pcie8_1s.toml"
    topo.write_text(ONE_SWITCH)
    argv = ["nccl-tests", "all_reduce_perf", "-b", "4M", "-e", "16M", "-f", "4", "-n", "1", "-w", "0"]
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert main([*argv, "--topology", str(topo), "--out", str(tmp_path / "off")]) == 0
    lines = capsys.readouterr().out.splitlines()
    notes = [i for i, ln in enumerate(lines) if "falling back to simple order" in ln]
    rows = [i for i, ln in enumerate(lines) if ln and not ln.startswith("#")]
    assert len(notes) == 1 and notes[0] < rows[0] and lines[notes[0]].startswith("# NCCL INFO Could not find a path")
    assert len(rows) == 2 and all("search_fallback=True" in lines[i] for i in rows)
    data = json.loads((tmp_path / "off" / S.RESULTS_JSON).read_text())
    for rec in data["sizes"]:
        assert rec["choice"]["nccl_model_time_us"] == pytest.approx(_us(rec["bytes"], FALLBACK_BW), rel=1e-6)
        assert rec["time_us"] == pytest.approx(_us(rec["bytes"], UPLINK_BUS), rel=0.01)  # simulated, at the uplink
    monkeypatch.setenv("NCCL_P2P_DISABLE", "0")
    assert main([*argv, "--topology", str(topo)]) == 0
    assert "falling back" not in capsys.readouterr().out


def test_the_note_is_for_fallback_choices_only() -> None:
    assert fallback_note(None) is None and fallback_note({"algorithm": "Ring"}) is None
    note = fallback_note({"algorithm": "Ring", "search_fallback": True})
    assert note is not None and note.startswith("# ") and "\n" not in note


@pytest.mark.ns3
@pytest.mark.parametrize("mib", [4, pytest.param(64, marks=pytest.mark.slow)])
def test_packet_mode_runs_the_fallback_ring_at_the_uplinks_rate(ns3_lib, mib: int) -> None:  # type: ignore[no-untyped-def]
    """The fallback's all-reduce through ns-3 ends within 2% of the flow network at the packets' goodput, and both
    at the uplink's closed form, not at NCCL's 0.1 GB/s (40x longer). The pace is the ring's per-channel rate
    (`Flow.rate_bps`), as a SHM hop under one switch is routed GPU-switch-GPU in the simulated topology."""
    size = mib << 20
    topo = pcie_host(N)
    dag = decompose(Collective("all_reduce", tuple(range(N)), size, "fp32"), topo, _opts(NCCL_P2P_DISABLE="1"))
    assert (dag.choice or {}).get("search_fallback") is True
    ends = flow_and_ns3_end_ns(topo, dag.flows)
    assert ends["ns3"] == pytest.approx(ends["flow"], rel=0.02)
    for t_ns in ends.values():
        assert t_ns / 1000 == pytest.approx(_us(size, UPLINK_BUS), rel=0.02)
