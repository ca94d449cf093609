"""A live ns-3 run whose scenario has a network event at a step runs its engine in the coordinator (issue 37): the
run still has the fabric traces a network server writes (queues.csv, pfc.csv, drops.csv, ... and engine.json).

Two ranks, one per leaf of a 2-spine leaf-spine fabric, phantom tensors, DCQCN; leaf0-spine0 goes down at step 1.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.netsim.cli_config import QUEUE_SAMPLE_NS
from phantora.results import schema as S
from tests.live_scenario_setup import SCRIPT, TWO_LEAF_TOPO

pytestmark = [pytest.mark.slow, pytest.mark.ns3]

SCENARIO = """reconvergence = "20us"
[[events]]
kind = "link_down"
at_step = 1
link = ["leaf0", "spine0"]
"""
RECONVERGENCE_NS = 20_000
SWITCHES = {"leaf0", "leaf1", "spine0", "spine1"}


def test_step_scenario_run_writes_the_fabric_traces(ns3_lib, tmp_path: Path) -> None:
    """queues.csv holds switch-port samples on the sampling grid within the run, and they show the failure: leaf 0
    queues toward spine 0 in step 0 and, once routing has re-converged in step 1, only toward spine 1 (about 1
    min)."""
    (tmp_path / "ls.toml").write_text(TWO_LEAF_TOPO)
    (tmp_path / "sc.toml").write_text(SCENARIO)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", str(tmp_path / "ls.toml"), "--nproc", "2",
           "--network", "ns3", "--cc", "dcqcn", "--phantom", "--scenario", str(tmp_path / "sc.toml"),
           "--out", str(out), "--no-progress", str(SCRIPT), "--steps", "2", "--grad", str(4 << 20)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    res = json.loads((out / "results.json").read_text())
    step1 = int(res["scenario"]["steps_started"]["1"])  # the failure's time (the engine was in the coordinator)
    for name in (S.QUEUES_CSV, S.PFC_CSV, S.DROPS_CSV, S.CNPS_CSV, S.ECN_CSV, S.ENGINE_JSON, S.LINKS_CSV):
        assert (out / name).is_file(), name
    assert json.loads((out / S.ENGINE_JSON).read_text())["ns3"] is not None
    with open(out / S.QUEUES_CSV) as f:
        rows = list(csv.DictReader(f))
    assert rows and tuple(rows[0]) == S.QUEUE_COLUMNS
    makespan = int(json.loads((out / S.COSIM_JSON).read_text())["makespan_ns"])
    times = sorted({int(r["time_ns"]) for r in rows})
    assert 0 < times[0] and times[-1] <= makespan
    assert all((b - a) % QUEUE_SAMPLE_NS == 0 for a, b in zip(times, times[1:], strict=False))
    assert {r["node"] for r in rows} <= SWITCHES

    def peak(peer: str, before: bool) -> int:
        """leaf 0's largest queue toward `peer` before step 1, or after it and the re-convergence."""
        after = step1 + RECONVERGENCE_NS
        got = [int(r["bytes"]) for r in rows if r["node"] == "leaf0" and r["peer"] == peer
               and (int(r["time_ns"]) < step1 if before else int(r["time_ns"]) > after)]  # fmt: skip
        return max(got, default=0)

    assert peak("spine0", before=True) > 0 and peak("spine0", before=False) == 0
    assert peak("spine1", before=False) > 0
