"""UET against htsim (issue 37): the same incast and permutation on the same 2-tier fat tree at 400 Gb/s, run by
htsim's `htsim_uec` (NSCC sender CC, REPS, trimming) and by `phantora netsim --set transport=uet`, FCT median,
p99 and max side by side (docs/validation.md). Asserts nothing.

Build htsim first, from its public sources (plain C++; cmake), e.g. in /tmp:
    git clone https://github.com/ultraethernet/uet-htsim /tmp/uet-htsim
    cd /tmp/uet-htsim/htsim/sim && mkdir build && cd build && cmake .. && make htsim_uec
then
    .venv/bin/python bench/uet_htsim_compare.py --htsim /tmp/uet-htsim/htsim/sim/build/datacenter/htsim_uec

The fabric is htsim's `-tiers 2 -nodes 32`: 8 ToRs of 4 hosts, 4 spines, 1:1, 1 us per link, no switch latency.
Both sides send htsim's packets (4150 bytes: 4086 payload + 64 header; ACKs 64 bytes) and use htsim's switch
queue (one BDP at the fabric's largest unloaded RTT, 419,150 bytes at 400G, trimmed past it) and ECN marking
(87,150 to 336,150 bytes). FCTs are start to the sender's last ACK in both.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MSS, MiB = 4086, 1 << 20
SIZE = 4 * MiB // MSS * MSS  # whole packets on both sides
SCENARIOS = {
    "incast 8-to-1": [(s, 0) for s in (4, 5, 8, 9, 12, 13, 16, 17)],  # from 4 other racks into host 0
    "permutation": [(i, (i + 16) % 32) for i in range(32)],  # every flow crosses a spine
}
TOPOLOGY = """[generator]
kind = "leaf_spine"
leaves = 8
endpoints_per_leaf = 4
spines = 4
nic_rate = "400Gbps"
uplink_rate = "400Gbps"
latency = "1us"
nvswitch = false
"""
SETS = ["transport=uet", f"payload_bytes={MSS}", "header_bytes=64", "trim_bytes=419150",
        "kmin_map=400000000000 87150", "kmax_map=400000000000 336150"]  # fmt: skip


def quantiles(fcts: list[float]) -> tuple[float, float, float]:
    xs = sorted(fcts)
    return statistics.median(xs), xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))], xs[-1]


def htsim(binary: str, pairs: list[tuple[int, int]], work: Path) -> list[float]:
    cm = work / "flows.cm"
    lines = ["Nodes 32", f"Connections {len(pairs)}"]
    lines += [f"{a}->{b} id {i + 1} start 0 size {SIZE}" for i, (a, b) in enumerate(pairs)]
    cm.write_text("\n".join(lines) + "\n")
    args = [binary, "-tm", str(cm), "-tiers", "2", "-nodes", "32", "-linkspeed", "400000", "-sender_cc_only"]
    out = subprocess.run([*args, "-load_balancing_algo", "reps", "-end", "5000", "-seed", "1"],
                         capture_output=True, text=True, check=True, cwd=work).stdout  # fmt: skip
    return [float(m.group(1)) * 1000 for m in re.finditer(r"finished at ([0-9.]+)", out)]


def phantora(pairs: list[tuple[int, int]], work: Path) -> list[float]:
    (work / "ft32.toml").write_text(TOPOLOGY)
    flows = work / "flows.txt"
    flows.write_text(f"{len(pairs)}\n" + "".join(f"{a} {b} 3 100 {SIZE} 0.0\n" for a, b in pairs))
    cmd = [str(ROOT / ".venv/bin/phantora"), "netsim", "--network", "ns3", "--topology", str(work / "ft32.toml"),
           "--flows", str(flows), "-o", str(work / "out")] + [x for s in SETS for x in ("--set", s)]  # fmt: skip
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    with open(work / "out" / "flows.csv") as f:
        return [float(r["fct_ns"]) for r in csv.DictReader(f)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--htsim", required=True, help="path of the htsim_uec binary")
    args = p.parse_args()
    print(f"{'scenario':<16}{'side':<10}{'median us':>11}{'p99 us':>9}{'max us':>9}")
    for name, pairs in SCENARIOS.items():
        with tempfile.TemporaryDirectory() as tmp:
            ht = quantiles(htsim(args.htsim, pairs, Path(tmp)))
            ph = quantiles(phantora(pairs, Path(tmp)))
        for side, q in (("htsim", ht), ("phantora", ph)):
            print(f"{name:<16}{side:<10}{q[0] / 1e3:>11.1f}{q[1] / 1e3:>9.1f}{q[2] / 1e3:>9.1f}")
        print(f"{'':<16}{'diff':<10}{ph[0] / ht[0] - 1:>+11.1%}{ph[1] / ht[1] - 1:>+9.1%}{ph[2] / ht[2] - 1:>+9.1%}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
