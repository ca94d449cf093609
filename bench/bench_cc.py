"""Validation of the packet mode's congestion control against the HPCC reference runs.

Runs every reference case (`<topology>-<flows>[-buf1]-<cc>` in reference-runs/fct/) through phantora's
packet engine and prints, per flow, the reference FCT, ours and the relative error; then the same for
the sorted FCTs (which flow of a symmetric set wins is a tie-break, not a mechanism), the mean FCT, and
PFC frames (PAUSE + RESUME, as pfc_frames.txt counts them), with the ACKs that echoed a CE mark (every CC's; the
switches' CE marks and, of the echoes, DCQCN's CNPs beside them). With --seeds N, DCQCN and `none` runs (random
RED marking) are repeated over seeds 1..N and the mean and spread are shown.

    .venv/bin/python bench/bench_cc.py                          # every case, seed 1
    .venv/bin/python bench/bench_cc.py --seeds 5 --only dcqcn   # DCQCN over 5 seeds
    .venv/bin/python bench/bench_cc.py --set header_bytes=38    # the reference's wire packet size
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.hpcc_io import FctLine, read_fct_txt, read_hpcc_flows
from phantora.netsim.packet import Ns3Simulator, load_ns3
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.paths import shared_dir
from phantora.topology.readers import read_hpcc

DEFAULT_REF = shared_dir() / "reference-runs"
Key = tuple[int, int, int, int]  # src, dst, size, start_ns


@dataclass
class Case:
    name: str  # e.g. star8-incast4-buf1-dcqcn
    topology: str
    flows: str
    cc: str
    buffer_bytes: int | None


@dataclass
class Outcome:
    fct: dict[Key, int]
    pauses: int  # PAUSE frames
    frames: int  # PAUSE + RESUME frames (what pfc_frames.txt counts)
    ce_marks: int  # packets the switches marked CE
    ecn_echoes: int  # ACKs and NACKs that echoed a CE mark to the sender, whatever the CC
    cnps: int  # of those, the ones a CC that reacts to CNPs (DCQCN) took as one
    max_queue: int
    wall_s: float


def find_cases(ref: Path) -> list[Case]:
    """Cases named by the reference's fct files."""
    out = []
    for path in sorted((ref / "fct").glob("*.fct.txt")):
        name = path.name.removesuffix(".fct.txt")
        parts = name.split("-")
        buf = 2**20 if "buf1" in parts else None  # HPCC BUFFER_SIZE is in MB of 2^20 bytes
        out.append(Case(name, parts[0], parts[1], parts[-1], buf))
    return out


def read_pauses(ref: Path) -> dict[str, int]:
    path = ref / "pfc_frames.txt"
    if not path.exists():
        return {}
    return {w[0]: int(w[1]) for w in (ln.split() for ln in path.read_text().splitlines()) if len(w) == 2}


def run(case: Case, ref: Path, base: PacketConfig, seed: int) -> Outcome:
    topo = read_hpcc(ref / "inputs" / f"{case.topology}.topo.txt")
    flows = read_hpcc_flows(ref / "inputs" / f"{case.flows}.flows.txt", topo)
    cfg = base.with_updates(cc=case.cc, seed=seed, buffer_bytes=case.buffer_bytes or base.buffer_bytes)
    t0 = min(f.start_ns for f in flows)
    wall = time.perf_counter()
    with Ns3Simulator(topo, cfg) as sim:
        batch = [replace(f.to_flow(), delay_ns=f.start_ns - t0) for f in flows]
        sim.submit(batch, at=t0, dports={f.index: f.dport for f in flows})
        sim.drain()
        sim.finish()
        records: list[FctLine] = sim.fct_records()
        stats = sim.stats()
        maxq = max((u.max_queue_bytes for u in sim.channel_usage()), default=0)
        events = sim.pfc_events()
        pauses = sum(1 for e in events if e.pause)
    fct = {(r.src, r.dst, r.size, r.start_ns): r.fct_ns for r in records}
    marks, echoes, cnps = (int(str(stats[k])) for k in ("ecn_marks", "ecn_echoes", "cnps"))
    return Outcome(fct, pauses, len(events), marks, echoes, cnps, maxq, time.perf_counter() - wall)


def err(ours: float, ref: float) -> float:
    return (ours - ref) / ref * 100


def report(case: Case, ref: Path, outs: list[Outcome], ref_pauses: int | None) -> dict[str, float]:
    """Print one case; return its summary figures."""
    want = {(r.src, r.dst, r.size, r.start_ns): r.fct_ns for r in read_fct_txt(ref / "fct" / f"{case.name}.fct.txt")}
    first = outs[0]
    print(f"\n== {case.name}  (wall {sum(o.wall_s for o in outs):.1f} s, {len(outs)} seed(s))")
    print(f"   {'flow (src>dst size)':<24}{'reference':>12}{'ours':>12}{'err':>9}")
    for key in sorted(want):
        ours = first.fct.get(key)
        text = f"{ours:>12}{err(ours, want[key]):>+8.1f}%" if ours is not None else f"{'missing':>12}"
        print(f"   {f'{key[0]}>{key[1]} {key[2]}':<24}{want[key]:>12}{text}")
    ref_sorted = sorted(want.values())
    ours_sorted = [sorted(o.fct.values()) for o in outs]
    sorted_errs = [err(mean(col), r) for col, r in zip(zip(*ours_sorted, strict=True), ref_sorted, strict=True)]
    print("   sorted FCT err (mean over seeds): " + " ".join(f"{e:+.1f}%" for e in sorted_errs))
    means = [mean(o.fct.values()) for o in outs]
    lasts = [max(o.fct.values()) for o in outs]
    spread = f" (seeds {err(min(means), mean(ref_sorted)):+.1f}% .. {err(max(means), mean(ref_sorted)):+.1f}%)"
    print(
        f"   mean FCT err {err(mean(means), mean(ref_sorted)):+.1f}%"
        + (spread if len(outs) > 1 else "")
        + f"; last FCT err {err(mean(lasts), ref_sorted[-1]):+.1f}%"
    )
    ours_frames = [o.frames for o in outs]
    ref_text = "?" if ref_pauses is None else str(ref_pauses)
    print(
        f"   PFC frames (PAUSE+RESUME): reference {ref_text}, ours {ours_frames} (PAUSE {[o.pauses for o in outs]}); "
        f"ECN-echo ACKs {first.ecn_echoes} (CE marks {first.ce_marks}, CNPs {first.cnps}); "
        f"max switch queue {first.max_queue} B"
    )
    return {
        "mean": err(mean(means), mean(ref_sorted)),
        "last": err(mean(lasts), ref_sorted[-1]),
        "worst_sorted": max(sorted_errs, key=abs),
        "frames": mean(ours_frames),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, default=DEFAULT_REF, help="reference-runs directory")
    ap.add_argument("--seeds", type=int, default=1, help="seeds for runs with random ECN marking")
    ap.add_argument("--only", default="", help="run the cases whose name contains this text")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="PacketConfig override")
    args = ap.parse_args()
    base = apply_overrides(PacketConfig(), args.set)
    pauses = read_pauses(args.ref)
    cases = [c for c in find_cases(args.ref) if args.only in c.name]
    load_ns3()
    summary = []
    for case in cases:
        random_marks = case.cc in ("dcqcn", "none")
        seeds = range(1, (args.seeds if random_marks else 1) + 1)
        outs = [run(case, args.ref, base, s) for s in seeds]
        summary.append((case.name, report(case, args.ref, outs, pauses.get(case.name))))
    print(f"\n{'case':<30}{'mean FCT':>10}{'last FCT':>10}{'worst sorted':>14}{'PFC frames ours/ref':>21}")
    for name, s in summary:
        both = f"{s['frames']:g}/{pauses.get(name, '?')}"
        print(f"{name:<30}{s['mean']:>+9.1f}%{s['last']:>+9.1f}%{s['worst_sorted']:>+13.1f}%{both:>21}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
