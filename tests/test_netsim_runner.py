"""`phantora netsim --network ns3` in phantora-ns3-runner (no Python bindings): every output file identical to the
in-process engine's, a single flow at its closed-form FCT, and a CLI path that never imports ns-3, cppyy or torch."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.errors import InputError
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.runner_engine import ENGINE_ENV, RunnerNetwork
from phantora.topology import load_topology

pytestmark = pytest.mark.ns3

ROOT = Path(__file__).resolve().parent.parent
# (name, netsim arguments): HPCC's incast; DCQCN (CE marks, CNPs); DCQCN with a small buffer (PFC frames); packet
# spraying to a SACK receiver across a leaf-spine (reordering); a workload with marker flows (left out of the outputs)
CASES = {
    "hpcc": ["--cc", "hpcc", "-t", "hpcc/star8", "-f", "incast4"],
    "dcqcn_ecn": ["--cc", "dcqcn", "-t", "star8", "-f", "incast4"],
    "dcqcn_pfc": ["--cc", "dcqcn", "-t", "star8", "-f", "incast4", "--set", "buffer_bytes=300000"],
    "spray_sack": ["--cc", "dcqcn", "-t", "hpcc/leafspine16", "-f", "incast8_cross.flows.txt", "--set", "lb=spray"]
    + ["--set", "rx=sack"],
    "workload": ["--cc", "dctcp", "-t", "star8", "-f", "incast_heavy.toml", "--queue-sample-ns", "5000"],
}
NOT_EMPTY = {"dcqcn_ecn": ("ecn_marks.csv", "cnps.csv", "queues.csv"), "dcqcn_pfc": ("pfc.csv", "pfc.txt")}
VARYING = ("config.json", "status.json")  # the command line, times and pids


@pytest.fixture(scope="module")
def built() -> None:
    """The ns-3 models and the runner, built if a source changed (without loading the Python bindings)."""
    pytest.importorskip("ns3", reason="the ns3 wheel is not installed")
    from phantora.netsim import ns3_build

    if ns3_build.needs_build():
        ns3_build.build()


def netsim(tmp: Path, name: str, args: list[str], monkeypatch: pytest.MonkeyPatch, engine: str) -> Path:
    """Run netsim with `engine` ('runner' or 'inprocess'); its run directory."""
    monkeypatch.setenv(ENGINE_ENV, engine)
    out = tmp / f"{name}-{engine}"
    assert main(["netsim", "--network", "ns3", *args, "-o", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("name", CASES)
def test_runner_writes_what_the_inprocess_engine_writes(
    ns3_lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    runner = netsim(tmp_path, name, CASES[name], monkeypatch, "runner")
    inproc = netsim(tmp_path, name, CASES[name], monkeypatch, "inprocess")
    files = sorted(p.name for p in inproc.iterdir() if p.name not in VARYING)
    assert files == sorted(p.name for p in runner.iterdir() if p.name not in VARYING)
    for f in files:
        if f == "summary.json":
            a, b = (json.loads((d / f).read_text()) for d in (runner, inproc))
            assert a.pop("wall_s") >= 0 and b.pop("wall_s") >= 0
            assert a == b
        elif f == "ns3-calls.txt":  # the in-process engine also lists CC libraries earlier runs of this process loaded
            a, b = (
                [ln for ln in (d / f).read_text().splitlines() if not ln.startswith("LoadLibrary ")]
                for d in (runner, inproc)
            )
            assert a == b, f
        else:
            assert (runner / f).read_bytes() == (inproc / f).read_bytes(), f
    for f in NOT_EMPTY.get(name, ()):  # the traces compared are not empty: PFC, CE marks, CNPs happened
        assert len((runner / f).read_text().splitlines()) > 1, f


def test_progress_display_runs_the_same_events(ns3_lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With progress on, both engines stop at the same watched flows (so the same event count)."""
    args = ["netsim", "--network", "ns3", *CASES["workload"], "--progress"]
    summaries = []
    for engine in ("runner", "inprocess"):
        monkeypatch.setenv(ENGINE_ENV, engine)
        assert main([*args, "-o", str(tmp_path / engine)]) == 0
        summary = json.loads((tmp_path / engine / "summary.json").read_text())
        summary.pop("wall_s")
        summaries.append(summary)
    assert summaries[0] == summaries[1]


def test_single_flow_runs_at_line_rate(built, tmp_path: Path) -> None:
    """One 1 MB flow alone on hpcc/star8 (100 Gb/s, 1 us links, host -> switch -> host), no CC, in the runner: its
    bytes leave at line rate, so the last byte arrives after every packet (1000 B payload + 48 B header) at 100 Gb/s,
    the last one again on the second hop, and 1 us per link; the sender's last ACK (a bare 48 B header) comes back
    over both links. Times in ps, events on the next whole ns."""
    flows = tmp_path / "one.flows.txt"
    flows.write_text("1\n1 0 3 100 1000000 0\n")
    out = tmp_path / "one"
    argv = ["netsim", "--network", "ns3", "--cc", "none", "-t", "hpcc/star8", "-f", str(flows), "-o", str(out)]
    assert main(argv) == 0
    (row,) = csv.DictReader((out / "flows.csv").open())
    ps_per_byte, link_ps, payload, header, size = 80, 1_000_000, 1000, 48, 1_000_000
    wire = (size + size // payload * header) * ps_per_byte  # every packet through the first hop
    last_byte = wire + (payload + header) * ps_per_byte + 2 * link_ps
    last_ack = last_byte + 2 * header * ps_per_byte + 2 * link_ps
    assert int(row["end_ns"]) == -(-last_byte // 1000)
    assert int(row["fct_ns"]) == -(-last_ack // 1000)
    # HPCC's standalone FCT counts a payload's serialisation per hop both ways: the flow beats it by 68 ns
    assert int(row["standalone_fct_ns"]) == 4 * link_ps // 1000 + 2 * payload * 8 // 100 + (size + 48_000) * 8 // 100


def test_netsim_cli_imports_no_bindings(built, tmp_path: Path) -> None:
    """The netsim CLI path in packet mode imports neither ns-3's bindings (cppyy) nor torch; nor numpy, zmq or the
    other commands (the start-up budget: issue 39 item 6)."""
    code = (
        "import sys\n"
        "from phantora.cli import main\n"
        f"rc = main(['netsim', '--network', 'ns3', '--cc', 'hpcc', '-t', 'hpcc/star8', '-f', 'incast4', "
        f"'-o', {str(tmp_path / 'out')!r}])\n"
        "heavy = ('ns', 'ns3', 'cppyy', 'torch', 'numpy', 'zmq', 'bridge.workers', 'phantora.commands.replay')\n"
        "loaded = sorted(m for m in heavy if m in sys.modules)\n"
        "print('LOADED', loaded)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout, proc.stdout


def test_a_bad_call_names_its_field(built, tmp_path: Path) -> None:
    """A call the runner refuses comes back as the in-process engine raises it: InputError naming the field."""
    topo = load_topology("hpcc/star8")
    net = RunnerNetwork(topo, PacketConfig(), tmp_path / "calls.txt")
    net._net.SetParam("nic.PayloadSize", "1000")  # after Finalize: the runner refuses it
    with pytest.raises(InputError) as err:
        net.run()
    assert err.value.field == "payload_bytes" and "after Finalize" in str(err.value)


def test_runner_rejects_a_bad_watch_list(built, tmp_path: Path) -> None:
    from phantora.netsim.ns3_build import runner_path

    script = tmp_path / "empty.txt"
    script.write_text("")
    proc = subprocess.run([str(runner_path()), "--records", "--watch", "1,x", str(script)], capture_output=True)
    assert proc.returncode == 2 and b"--watch" in proc.stderr
