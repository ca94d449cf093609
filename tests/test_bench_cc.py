"""bench/bench_cc.py's report counts the ACKs that echo a CE mark for every CC, and CNPs only for DCQCN's.

A reference directory is made of the HPCC reference runs' star8 topology (topologies/hpcc/star8.topo.txt, the same
file) and their incast4 flows (four 1 MB flows into host 0 at 2 s), with the published FCTs of the two cases, and
the bench is run on it as a user runs it. On one switch with an ACK per packet every CE-marked packet is echoed
once, so the echoes equal the marks; DCQCN's notification point turns each echo into a CNP (cc.CnpInterval 0), no
other CC does (9e1c1bf5). Before, the report printed the CNP count under "CNP-echo ACKs": 0 with no CC.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from script_modules import load

pytestmark = pytest.mark.ns3

ROOT = Path(__file__).resolve().parents[1]
bench_cc = load("bench/bench_cc.py")

FLOWS = "4\n" + "".join(f"{src} 0 3 100 1000000 2.0\n" for src in (1, 2, 3, 4))
# The HPCC reference runs' published FCTs of star8 incast4 (ns), as tests/test_packet_cc_network.py quotes them.
PUBLISHED_FCT_NS = {"none": [335842, 335925, 336008, 336091], "dcqcn": [564837, 572971, 582765, 584674]}
LINE = re.compile(r"ECN-echo ACKs (\d+) \(CE marks (\d+), CNPs (\d+)\)")


def _reference(root: Path) -> Path:
    """A reference-runs directory holding star8 incast4 with no CC and with DCQCN."""
    (root / "inputs").mkdir(parents=True)
    (root / "fct").mkdir()
    shutil.copy(ROOT / "topologies" / "hpcc" / "star8.topo.txt", root / "inputs" / "star8.topo.txt")
    (root / "inputs" / "incast4.flows.txt").write_text(FLOWS)
    for cc, fcts in PUBLISHED_FCT_NS.items():
        # fct.txt: sip dip sport dport size start_ns fct_ns standalone_ns; host n is 11.0.n.1 (0x0b00nn01)
        rows = [f"0b{src:04x}01 0b000001 10000 100 1000000 2000000000 {fct} 88000" for src, fct in enumerate(fcts, 1)]
        (root / "fct" / f"star8-incast4-{cc}.fct.txt").write_text("\n".join(rows) + "\n")
    return root


def test_the_report_counts_every_echo_and_dcqcns_cnps(ns3_lib, tmp_path: Path, monkeypatch, capsys) -> None:
    ref = _reference(tmp_path / "ref")
    monkeypatch.setattr(sys, "argv", ["bench_cc.py", "--ref", str(ref), "--only", "incast4"])
    assert bench_cc.main() == 0
    out = capsys.readouterr().out
    counts = {}
    for case in ("none", "dcqcn"):
        block = out.split(f"== star8-incast4-{case} ", 1)[1].split("\n== ", 1)[0]
        m = LINE.search(block)
        assert m, block
        counts[case] = tuple(int(g) for g in m.groups())
    echoes, marks, cnps = counts["none"]
    assert echoes == marks > 0 and cnps == 0  # 4 MB into one 100G port: the queue crosses Kmin, no CC slows it
    echoes, marks, cnps = counts["dcqcn"]
    assert 0 < echoes == marks == cnps
