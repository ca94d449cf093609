"""The main job end to end, at a CI-sized setting: scripts/run_cosim.sh on 4 GPUs, packet and flow mode."""

from __future__ import annotations

import json
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


@pytest.mark.ns3
@pytest.mark.timeout(900)
def test_run_cosim_both_modes_and_compare(tmp_path: Path) -> None:
    topo = tmp_path / "ci4.toml"
    topo.write_text(TOPOLOGY)
    out = tmp_path / "cosim"
    args = ["--topology", str(topo), "--nproc", "4", "--steps", "3", "--out", str(out)]
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "run_cosim.sh"), *args, "--", "--d-model", "128", "--layers", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "report and plots in" in proc.stdout
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
    pngs = list((out / "compare").glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in pngs)
