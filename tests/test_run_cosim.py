"""The main job end to end, at a CI-sized setting: scripts/run_cosim.sh on 4 GPUs, packet and flow mode.

Two settings: an uncongested fabric (the modes agree within 5%) and an oversubscribed one where the ring
all-reduces' two channels meet at a thin leaf uplink (packet mode is no faster than flow mode, and the
packets show the congestion: ECN marks or PFC pauses).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# 2 leaves x 2 GPUs (one per host, so every ring edge between hosts crosses the fabric), 1 spine at
# the NIC rate: rings use one uplink direction per channel, so the fabric is not a bottleneck.
TOPOLOGY = """
name = "ci4"
gpu = "h100"
[generator]
kind = "leaf_spine"
leaves = 2
endpoints_per_leaf = 2
spines = 1
nic_rate = "100Gbps"
uplink_rate = "200Gbps"
latency = "1us"
"""


# The same leaves with a 4:1 leaf uplink (2 x 100G down, 50G up). Each ring edge between leaves carries the
# all-reduce's 2 channels (2 flows) from a 100G NIC into the 50G uplink: a congested egress queue.
CONGESTED = TOPOLOGY.replace('name = "ci4"', 'name = "ci4-thin"').replace("200Gbps", "50Gbps")


def run_cosim(tmp_path: Path, topology: str, steps: int) -> tuple[Path, subprocess.CompletedProcess[str]]:
    topo = tmp_path / "topo.toml"
    topo.write_text(topology)
    out = tmp_path / "cosim"
    args = ["--topology", str(topo), "--nproc", "4", "--steps", str(steps), "--out", str(out)]
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "run_cosim.sh"), *args, "--", "--d-model", "128", "--layers", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PHANTORA_HEARTBEAT": "10"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "report and plots in" in proc.stdout
    # Progress: every step of each mode as it ends, and the per-mode wall time.
    for mode in ("ns3", "flow"):
        assert f"[run_cosim] {mode}: step {steps - 1:3d}" in proc.stdout, proc.stdout[-3000:]
        assert f"[run_cosim] {mode} mode took" in proc.stdout
    return out, proc


@pytest.mark.ns3
@pytest.mark.timeout(900)
def test_run_cosim_both_modes_and_compare(tmp_path: Path) -> None:
    out, _ = run_cosim(tmp_path, TOPOLOGY, steps=3)
    runs = {m: json.loads((out / m / "results.json").read_text()) for m in ("ns3", "flow")}
    for data in runs.values():
        assert data["schema"] == "phantora.run/1" and len(data["steps"]) == 3
    packet, flow = (runs[m]["step_time_ns"]["mean"] for m in ("ns3", "flow"))
    # Uncongested: the two modes agree on the iteration time within 5% ...
    assert abs(packet - flow) / flow < 0.05
    # ... and no collective is faster with packets than the fluid line-rate ideal.
    cmp = json.loads((out / "compare" / "compare.json").read_text())
    ops = [m for m in cmp["metrics"] if m["key"].startswith("op:all_reduce")]
    assert ops, "the comparison lists the gradient all-reduces"
    for m in ops:
        ns3_t, flow_t = m["values"]
        assert ns3_t >= flow_t * 0.999, m
    # Packet traces made it from the network server into the run directory.
    assert (out / "ns3" / "pfc.csv").is_file() and (out / "ns3" / "links.csv").is_file()
    # Both modes write links.csv (the flow engine's from the coordinator): the comparison has link use for both.
    util = next(m for m in cmp["metrics"] if m["key"] == "util_mean")
    assert (out / "flow" / "links.csv").is_file() and all(v is not None and v > 0 for v in util["values"])
    pngs = list((out / "compare").glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in pngs)


# Slow (~45 s, two full packet-mode runs): the default run keeps the uncongested
# packet-mode check; run with -m slow.
@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.timeout(900)
def test_run_cosim_congested_packet_mode_is_not_faster(tmp_path: Path) -> None:
    out, _ = run_cosim(tmp_path, CONGESTED, steps=2)
    runs = {m: json.loads((out / m / "results.json").read_text()) for m in ("ns3", "flow")}
    packet, flow = (runs[m]["step_time_ns"]["mean"] for m in ("ns3", "flow"))
    # The workload is congested: the packets queue at the thin uplink and DCQCN / PFC react ...
    cmp = {m["key"]: m["values"] for m in json.loads((out / "compare" / "compare.json").read_text())["metrics"]}
    ecn, paused = cmp["ecn_marks"][0], cmp["pfc_paused_ns"][0]
    assert (ecn or 0) > 0 or (paused or 0) > 0, (ecn, paused)
    # Live ns-3 runs sample the switch queues (1 us): the hottest port's p99 is there, at most the max.
    qmax, q99 = cmp["queue_max_bytes"][0], cmp["queue_p99_bytes"][0]
    assert q99 is not None and 0 < q99 <= qmax, (q99, qmax)
    assert (out / "compare" / "queue_depth.png").is_file()
    # ... and packet mode cannot beat the fluid max-min share of the bottleneck.
    assert packet >= flow, (packet, flow)


def test_help_lists_the_shipped_ccs() -> None:
    """`run_cosim.sh --help` names every CC the packet network ships with (issue 39: swift was missing)."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "run_cosim.sh"), "--help"], capture_output=True, text=True)
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("--cc"))
    for cc in ("none", "dcqcn", "hpcc", "timely", "dctcp", "swift"):
        assert cc in line
