"""What the live scenario tests share: the step script they run and the smallest fabric with two paths."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "compute_steps.py"
# two leaves of one 100G NIC each and two spines (1 us links): a failed leaf uplink leaves the other path
TWO_LEAF_TOPO = """[generator]
kind = "leaf_spine"
leaves = 2
endpoints_per_leaf = 1
spines = 2
nic_rate = "100Gbps"
nvswitch = false
"""
