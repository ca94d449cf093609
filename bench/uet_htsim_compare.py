"""UET against htsim (issue 37): the same incast, permutation and ring all-reduce on the same 2-tier fat tree at
400 Gb/s, run by htsim's `htsim_uec` (NSCC sender CC, REPS, trimming) and by phantora's ns-3 model with
`--set transport=uet`, FCT median, p99 and max side by side (docs/validation.md), and the incast again under
receiver credits (htsim's -receiver_cc_only, our --cc rccc), and the permutation over a degraded fabric (htsim's
only failure on 2 tiers, `-failed 1`: every ToR's link to spine 0 at 25% of its speed, both ways, its queue and ECN
thresholds scaled by 0.25 too; phantora: a scenario degrading those 8 links to 100 Gb/s from time 0, with
`--set thresholds_follow_rate=true` scaling the slowed ports' trim and ECN thresholds by the same 0.25;
`--fixed-thresholds` leaves them at the fabric's). Asserts nothing.

The ring all-reduce is htsim's own traffic matrix (`connection_matrices/gen_allreduce.py 32 nodes, 32
connections, rings of 8, RING_CHUNK bytes, seed 1`): 4 rings of 8 hosts drawn at random over the racks; each host
starts a chain of 2 x 8 - 1 transfers round its ring, each starting when the one before it in the chain has
finished at its sender (htsim's send_done trigger: the last ACK). phantora runs the same file in-process: a
chain's next flow is submitted when the FCT record of the one before appears, stepping the engine 100 ns at a
time (so a step starts at most 100 ns late; the mean lateness is printed). Besides the per-flow FCTs it prints the
all-reduce's completion time.

Build htsim first, from its public sources (plain C++; cmake), e.g. in /tmp:
    git clone https://github.com/ultraethernet/uet-htsim /tmp/uet-htsim
    cd /tmp/uet-htsim/htsim/sim && mkdir build && cd build && cmake .. && make htsim_uec
then
    .venv/bin/python bench/uet_htsim_compare.py --htsim /tmp/uet-htsim/htsim/sim/build/datacenter/htsim_uec
htsim's receiver ACKs once per 16 KiB received (-sack_threshold 16384: every 4th of these packets, 13,786 ACKs
for 32,864 packets on the degraded permutation); phantora's RUD receiver ACKs every packet, and each ACK returns
one entropy to REPS. `--sack-threshold 1` makes htsim ACK every packet too (`--perm-only`: just the permutations).

The fabric is htsim's `-tiers 2 -nodes 32`: 8 ToRs of 4 hosts, 4 spines, 1:1, 1 us per link, no switch latency.
Both sides send htsim's packets (4150 bytes: 4086 payload + 64 header; ACKs 64 bytes) and use htsim's switch
queue (one BDP at the fabric's largest unloaded RTT, 419,150 bytes at 400G, trimmed past it) and ECN marking
(87,150 to 336,150 bytes). FCTs are start to the sender's last ACK in both.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install


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


# The CC on each side: htsim's flag, phantora's --set items (after SETS).
CCS = {"nscc": ("-sender_cc_only", []), "rccc": ("-receiver_cc_only", ["cc=rccc"])}


# phantora's side of htsim's -failed 1: every leaf's link to spine 0 at a quarter of 400 Gb/s from the start
DEGRADED = "".join(
    f'[[events]]\nkind = "link_degrade"\nat = "0ns"\nlink = ["leaf{i}", "spine0"]\nrate = "100Gbps"\n\n'
    for i in range(8)
)


def htsim(binary: str, pairs: list[tuple[int, int]], work: Path, cc: str = "nscc", degraded: bool = False,
          sack_threshold: int | None = None) -> list[float]:  # fmt: skip
    """htsim's per-flow FCTs (ns). `sack_threshold`: its receiver's -sack_threshold (bytes received before it
    ACKs; htsim's default 16,384, 4 of these packets; 1: an ACK per packet, as phantora's RUD receiver)."""
    cm = work / "flows.cm"
    lines = ["Nodes 32", f"Connections {len(pairs)}"]
    lines += [f"{a}->{b} id {i + 1} start 0 size {SIZE}" for i, (a, b) in enumerate(pairs)]
    cm.write_text("\n".join(lines) + "\n")
    args = [binary, "-tm", str(cm), "-tiers", "2", "-nodes", "32", "-linkspeed", "400000", CCS[cc][0]]
    args += ["-failed", "1"] if degraded else []
    args += ["-sack_threshold", str(sack_threshold)] if sack_threshold is not None else []
    out = subprocess.run([*args, "-load_balancing_algo", "reps", "-end", "5000", "-seed", "1"],
                         capture_output=True, text=True, check=True, cwd=work).stdout  # fmt: skip
    return [float(m.group(1)) * 1000 for m in re.finditer(r"finished at ([0-9.]+)", out)]


def phantora(pairs: list[tuple[int, int]], work: Path, cc: str = "nscc", degraded: bool = False,
             follow_rate: bool = True) -> tuple[list[float], dict[str, Any]]:  # fmt: skip
    """phantora's per-flow FCTs (ns) and its run's summary.json (the transport's counters). `degraded`: the
    leaf-spine0 links at 100 Gb/s, their ports' trim and ECN thresholds scaled with the rate if `follow_rate`
    (htsim's -failed), else left at the fabric's."""
    (work / "ft32.toml").write_text(TOPOLOGY)
    flows = work / "flows.txt"
    flows.write_text(f"{len(pairs)}\n" + "".join(f"{a} {b} 3 100 {SIZE} 0.0\n" for a, b in pairs))
    cmd = [str(ROOT / ".venv/bin/phantora"), "netsim", "--network", "ns3", "--topology", str(work / "ft32.toml"),
           "--flows", str(flows), "-o", str(work / "out")]  # fmt: skip
    cmd += [x for s in SETS + CCS[cc][1] for x in ("--set", s)]
    if degraded:
        (work / "degraded.toml").write_text(DEGRADED)
        cmd += ["--scenario", str(work / "degraded.toml")]
        cmd += ["--set", "thresholds_follow_rate=true"] if follow_rate else []
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    with open(work / "out" / "flows.csv") as f:
        fcts = [float(r["fct_ns"]) for r in csv.DictReader(f)]
    return fcts, json.loads((work / "out" / "summary.json").read_text())


def counters(summary: dict[str, Any]) -> str:
    """phantora's transport counters of one run: trims, packets resent, data packets sent on a recycled entropy."""
    return (
        f"{summary['trims']:,} trims, {summary['retx_packets']:,} resent, {summary['entropies_recycled']:,} of "
        f"{summary['data_packets']:,} data packets on a recycled entropy"
    )


RING_CHUNK = 128 * MSS  # 512 KiB, whole packets


def ring_matrix(binary: str, work: Path) -> Path:
    """htsim's ring all-reduce traffic matrix, made by its own generator beside the binary's sources."""
    gen = Path(binary).resolve().parents[2] / "datacenter" / "connection_matrices" / "gen_allreduce.py"
    cm = work / "ring.cm"
    subprocess.run([sys.executable, str(gen), str(cm), "32", "32", "8", str(RING_CHUNK), "0", "1"],
                   capture_output=True, text=True, check=True)  # fmt: skip
    return cm


def htsim_ring(binary: str, cm: Path, work: Path) -> tuple[list[float], float]:
    """Per-flow FCTs (ns, start to the sender's last ACK) and the last finish (ns) of htsim on `cm`."""
    args = [binary, "-tm", str(cm), "-tiers", "2", "-nodes", "32", "-linkspeed", "400000", "-sender_cc_only"]
    out = subprocess.run([*args, "-load_balancing_algo", "reps", "-end", "20000", "-seed", "1"],
                         capture_output=True, text=True, check=True, cwd=work).stdout  # fmt: skip
    start = {m.group(1): float(m.group(2)) for m in re.finditer(r"flowId (\d+) \S+ \d+ starting at ([0-9.]+)", out)}
    end = {m.group(1): float(m.group(2)) for m in re.finditer(r"flowId (\d+) \S+ \d+ finished at ([0-9.]+)", out)}
    return [(end[f] - start[f]) * 1000 for f in end], max(end.values()) * 1000


def phantora_ring(cm: Path) -> tuple[list[float], float, float]:
    """Per-flow FCTs (ns), the last finish (ns) and the mean lateness of a triggered start (ns) of `cm` under
    transport=uet, a chain's next flow submitted once the FCT record of the one before it appears."""
    from phantora.netsim.base import Flow
    from phantora.netsim.cli_config import packet_config_from_flags
    from phantora.netsim.packet import Ns3Simulator
    from phantora.topology.loader import load_topology

    line = re.compile(r"(\d+)->(\d+) id (\d+) (?:start 0|trigger (\d+)) size (\d+)(?: send_done_trigger (\d+))?")
    first, waiting, fires = [], {}, {}
    for m in line.finditer(cm.read_text()):
        flow = Flow(int(m.group(3)), int(m.group(1)), int(m.group(2)), int(m.group(5)))
        if m.group(4) is None:
            first.append(flow)
        else:
            waiting[int(m.group(4))] = flow
        if m.group(6) is not None:
            fires[flow.id] = int(m.group(6))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ft32.toml").write_text(TOPOLOGY)
        topo = load_topology(Path(tmp) / "ft32.toml")
    late: list[int] = []
    with Ns3Simulator(topo, packet_config_from_flags(sets=SETS, queue_sample_ns=0)) as sim:
        sim.submit(first, at=0)
        seen, total, t = 0, len(first) + len(waiting), 0
        while seen < total:
            t += 100
            sim.advance(t)
            records = sim.fct_records()
            for r in records[seen:]:
                trigger = fires.get(r.flow_id)  # type: ignore[arg-type]
                if trigger is not None:
                    late.append(t - (r.start_ns + r.fct_ns))
                    sim.submit([waiting.pop(trigger)], at=t)
            seen = len(records)
        fcts = [float(r.fct_ns) for r in records]
        last = max(r.start_ns + r.fct_ns for r in records)
    return fcts, float(last), statistics.mean(late)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--htsim", required=True, help="path of the htsim_uec binary")
    p.add_argument("--ring-only", action="store_true", help="only the ring all-reduce")
    p.add_argument("--degraded-only", action="store_true", help="only the permutation over the degraded fabric")
    p.add_argument("--perm-only", action="store_true", help="only the permutation, healthy and degraded")
    p.add_argument(
        "--sack-threshold",
        type=int,
        default=None,
        help="htsim's -sack_threshold in bytes (its default 16384; 1: an ACK per packet, as ours)",
    )
    p.add_argument(
        "--fixed-thresholds",
        action="store_true",
        help="the degraded ports keep the fabric's trim and ECN thresholds (htsim scales them)",
    )
    args = p.parse_args()
    print(f"{'scenario':<16}{'side':<10}{'median us':>11}{'p99 us':>9}{'max us':>9}")
    runs = [(name, pairs, "nscc", False) for name, pairs in SCENARIOS.items()]
    runs.append(("incast, rccc", SCENARIOS["incast 8-to-1"], "rccc", False))
    runs.append(("perm., degraded", SCENARIOS["permutation"], "nscc", True))
    if args.degraded_only:
        runs = runs[-1:]
    elif args.perm_only:
        runs = [r for r in runs if r[1] is SCENARIOS["permutation"]]
    for name, pairs, cc, degraded in [] if args.ring_only else runs:
        with tempfile.TemporaryDirectory() as tmp:
            ht = quantiles(htsim(args.htsim, pairs, Path(tmp), cc, degraded, args.sack_threshold))
            ph_fcts, summary = phantora(pairs, Path(tmp), cc, degraded, not args.fixed_thresholds)
            ph = quantiles(ph_fcts)
        for side, q in (("htsim", ht), ("phantora", ph)):
            print(f"{name:<16}{side:<10}{q[0] / 1e3:>11.1f}{q[1] / 1e3:>9.1f}{q[2] / 1e3:>9.1f}")
        print(f"{'':<16}{'diff':<10}{ph[0] / ht[0] - 1:>+11.1%}{ph[1] / ht[1] - 1:>+9.1%}{ph[2] / ht[2] - 1:>+9.1%}")
        print(f"{'':<16}phantora: {counters(summary)}")
    if args.degraded_only or args.perm_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        cm = ring_matrix(args.htsim, Path(tmp))
        ht_fcts, ht_end = htsim_ring(args.htsim, cm, Path(tmp))
        ph_fcts, ph_end, late = phantora_ring(cm)
    ht, ph = quantiles(ht_fcts), quantiles(ph_fcts)
    name = "ring all-reduce"
    for side, q, end in (("htsim", ht, ht_end), ("phantora", ph, ph_end)):
        cells = f"{q[0] / 1e3:>11.1f}{q[1] / 1e3:>9.1f}{q[2] / 1e3:>9.1f}"
        print(f"{name:<16}{side:<10}{cells}   done at {end / 1e3:.1f} us")
    diffs = f"{ph[0] / ht[0] - 1:>+11.1%}{ph[1] / ht[1] - 1:>+9.1%}{ph[2] / ht[2] - 1:>+9.1%}"
    print(f"{'':<16}{'diff':<10}{diffs}   done {ph_end / ht_end - 1:+.1%}; {len(ph_fcts)} / {len(ht_fcts)} flows")
    print(f"(phantora's triggered starts were {late:.0f} ns late on average)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
