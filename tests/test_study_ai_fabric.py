"""A cut-down AI-fabric study (scripts/study_ai_fabric.py: ECMP vs spray, DCQCN, one seed, one step, a 2-step DLCP
loss curve), checked against closed forms: spraying spreads the spine links' bytes within a few per cent while ECMP
moves whole flows; each loss-tolerant reduce-scatter lost at most its bound of the bytes its ring sends."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.ns3
@pytest.mark.slow
def test_cut_down_study(tmp_path: Path) -> None:
    out = tmp_path / "study"
    cmd = [sys.executable, str(ROOT / "scripts" / "study_ai_fabric.py"), "--out", str(out), "--configs",
           "ecmp/gbn,spray/sack", "--ccs", "dcqcn", "--seeds", "1", "--steps", "1", "--loss-steps", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, env=env, timeout=600, capture_output=True)
    rows = {r["config"]: r for r in csv.DictReader(open(out / "network.csv"))}
    assert set(rows) == {"ecmp/gbn", "spray/sack"}
    # Spraying: ~75 MB per spine link in 1000-byte packets drawn uniformly, so the spread is a fraction of a per
    # cent (binomial); ECMP puts each ring flow (2 MB or more) on one spine, 8 per direction over 2 spines.
    spray, ecmp = (
        float(rows["spray/sack"]["spine_bytes_max_over_min"]),
        float(rows["ecmp/gbn"]["spine_bytes_max_over_min"]),
    )
    assert spray < 1.05 < ecmp
    assert int(rows["ecmp/gbn"]["retx_packets"]) == 0 and float(rows["ecmp/gbn"]["reorder_max_kb"]) == 0
    assert float(rows["spray/sack"]["reorder_max_kb"]) > 0  # sprayed packets overtake one another
    assert (out / "network.md").read_text().count("| ecmp/gbn | dcqcn |") == 2  # the run row and the seed summary
    assert "iteration time" in (out / "compare.md").read_text()
    # DLCP: a ring reduce-scatter of B bytes over n ranks sends (n - 1) B; each flow may lose its bound of it.
    cosim = json.loads((out / "dlcp" / "cosim.json").read_text())
    lossy = [c for c in cosim["collectives"] if "lost_bytes" in c]
    assert lossy and all(c["kind"] == "reduce_scatter" for c in lossy)
    for c in lossy:
        assert c["lost_bytes"] <= 0.05 * (len(c["group"]) - 1) * c["nbytes"]
    curve = list(csv.DictReader(open(out / "loss_curve.csv")))
    zeroed = sum(int(r["zeroed_bytes_rank0"]) for r in curve)
    assert 0 < zeroed <= sum(c["lost_bytes"] for c in lossy)  # rank 0 zeroes lost bytes of its own shard only
    assert curve[0]["loss_lossless"] == curve[0]["loss_dlcp"]  # step 0's loss comes before any gradient is lost
    assert (out / "loss_curve.png").stat().st_size > 0
