"""The standalone runner and `phantora netsim`: same input, same answers; clear errors on bad input."""

from __future__ import annotations

import csv
import json
import subprocess
from itertools import groupby
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.netsim.hpcc_io import format_fct_line, read_hpcc_flows
from phantora.netsim.packet import Ns3Simulator, runner_path
from phantora.netsim.packet_config import read_hpcc_config
from phantora.paths import shared_dir
from phantora.topology.readers import read_hpcc

pytestmark = pytest.mark.ns3

REF = shared_dir() / "reference-runs/inputs"
DCQCN_CONFIG = """\
CC_MODE 1
PACKET_PAYLOAD_SIZE 1000
BUFFER_SIZE 4
ENABLE_QCN 1
ALPHA_RESUME_INTERVAL 1
RATE_DECREASE_INTERVAL 4
RP_TIMER 300
EWMA_GAIN 0.00390625
FAST_RECOVERY_TIMES 1
RATE_AI 20Mb/s
RATE_HAI 200Mb/s
MIN_RATE 1000Mb/s
U_TARGET 0.95
KMAX_MAP 1 100000000000 160
KMIN_MAP 1 100000000000 40
PMAX_MAP 1 100000000000 0.2
L2_ACK_INTERVAL 1
header_bytes 36
"""

needs_ref = pytest.mark.skipif(not REF.exists(), reason="reference inputs not present")


def python_fct_lines(topo_file: Path, flow_file: Path, config_file: Path) -> list[str]:
    topo = read_hpcc(topo_file)
    flows = read_hpcc_flows(flow_file, topo)
    with Ns3Simulator(topo, read_hpcc_config(config_file)) as sim:
        for start, group in groupby(flows, key=lambda f: f.start_ns):
            batch = list(group)
            sim.submit([f.to_flow() for f in batch], start, dports={f.index: f.dport for f in batch})
        sim.drain()
        assert sim.finish()
        return [format_fct_line(r, with_id=True) for r in sim.fct_records()]


def run_runner(script: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(runner_path()), str(script), str(out)], capture_output=True, text=True, timeout=120, check=False
    )


@needs_ref
@pytest.mark.parametrize(("topo", "flows"), [("star8", "two_to_one"), ("twoleaf8", "cross4")])
def test_runner_replays_netsim_calls_identically(ns3_lib, tmp_path: Path, topo: str, flows: str) -> None:
    config = tmp_path / "config.txt"
    config.write_text(DCQCN_CONFIG)
    topo_file, flow_file = REF / f"{topo}.topo.txt", REF / f"{flows}.flows.txt"
    out = tmp_path / "netsim"
    argv = ["netsim", "--network", "ns3", "-t", str(topo_file), "-f", str(flow_file), "-c", str(config)]
    assert main([*argv, "-o", str(out)]) == 0
    script = out / "ns3-calls.txt"
    proc = run_runner(script, tmp_path / "runner")
    assert proc.returncode == 0, proc.stderr
    runner_lines = (tmp_path / "runner" / "fct.txt").read_text().splitlines()
    assert len(runner_lines) == len(read_hpcc_flows(flow_file))
    # The runner makes the calls netsim made: the same FCTs, PFC frames and summary, byte for byte.
    assert runner_lines == (out / "fct.txt").read_text().splitlines()
    assert (tmp_path / "runner" / "pfc.txt").read_text() == (out / "pfc.txt").read_text()
    assert python_fct_lines(topo_file, flow_file, config) == runner_lines
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["completed"] and summary["flows"] == len(runner_lines)
    assert sum(1 for line in script.read_text().splitlines() if line.startswith("AddFlow ")) == len(runner_lines)


@needs_ref
def test_runner_reports_bad_scripts(ns3_lib, tmp_path: Path) -> None:
    good = tmp_path / "netsim"
    argv = ["netsim", "--network", "ns3", "-t", str(REF / "star8.topo.txt"), "-f", str(REF / "incast4.flows.txt")]
    argv += ["-o", str(good)]
    assert main(argv) == 0
    lines = (good / "ns3-calls.txt").read_text().splitlines()
    cases = [  # (after the first line of this call, the bad line, what the error says)
        ("AddFlow", "AddFlow 99 0 42 1000 0 3 99 0 100 0", "is not an endpoint"),  # no node 42
        ("SetParam", "SetParam nic.PayloadSize zero", "attribute 'PayloadSize'"),
        ("Finalize", "Jump 3", "unknown call 'Jump'"),
        ("AddLink", "AddLink 0 1", "AddLink: expected 4 arguments"),
    ]
    for verb, bad, message in cases:
        at = next(i for i, line in enumerate(lines) if line.split()[0] == verb) + 1
        script = tmp_path / "bad.txt"
        script.write_text("\n".join([*lines[:at], bad, *lines[at:]]) + "\n")
        proc = run_runner(script, tmp_path / "o")
        assert proc.returncode == 2, bad
        assert f"{script}:{at + 1}: " in proc.stderr and message in proc.stderr, proc.stderr
    assert run_runner(tmp_path / "missing.txt", tmp_path / "o").returncode == 2


@needs_ref
@pytest.mark.parametrize("network", ["ns3", "flow"])
def test_cli_netsim_writes_traces(ns3_lib, tmp_path: Path, network: str, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / network
    argv = ["netsim", "-t", str(REF / "star8.topo.txt"), "-f", str(REF / "incast4.flows.txt"), "--network", network]
    argv += ["--queue-sample-ns", "5000", "-o", str(out)]
    argv += ["--set", "buffer_bytes=300000"] if network == "ns3" else []  # the flow network has no buffers
    assert main(argv) == 0
    assert "4 flows on star8" in capsys.readouterr().out
    rows = list(csv.DictReader((out / "flows.csv").open()))
    assert sorted(int(r["flow_id"]) for r in rows) == [0, 1, 2, 3]
    # 4 x 1 MB into one 100G port: the last flow ends no earlier than 4000 packets of 1048 B (335.36 us).
    assert max(int(r["fct_ns"]) for r in rows) >= 335_360
    assert len((out / "fct.txt").read_text().splitlines()) == 4
    links = list(csv.DictReader((out / "links.csv").open()))
    down = next(r for r in links if r["from_id"] == "8" and r["to_id"] == "0")
    assert 0.9 < float(down["utilisation"]) <= 1.0
    if network == "ns3":
        assert len(list(csv.DictReader((out / "pfc.csv").open()))) > 0  # 300 KB of buffer: PFC must act
        assert len(list(csv.DictReader((out / "queues.csv").open()))) > 0


def test_cli_netsim_bad_config_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if not REF.exists():
        pytest.skip("reference inputs not present")
    cfg = tmp_path / "config.txt"
    cfg.write_text("CC_MODE 42\n")
    argv = ["netsim", "-t", str(REF / "star8.topo.txt"), "-f", str(REF / "incast4.flows.txt"), "-c", str(cfg)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{cfg}:1: field 'CC_MODE'" in err and "Traceback" not in err
