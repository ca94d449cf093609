"""Wire presets (issue 13): what `--set wire=roce4k` (4096-byte MTU, ACK per 4 packets) does against HPCC's
1000-byte setting on the HPCC reference runs: FCTs, PFC frames, events and wall time. Prints figures only.

    .venv/bin/python bench/bench_wire.py            # every reference case and CC (about a minute)
"""

from __future__ import annotations

import sys
import time
from itertools import groupby
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.netsim.hpcc_io import read_fct_txt, read_hpcc_flows
from phantora.netsim.packet import Ns3Simulator
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.paths import shared_dir
from phantora.topology.readers import read_hpcc

REF = shared_dir() / "reference-runs"
CASES = [("star8", "two_to_one"), ("star8", "incast4"), ("star8", "late_join"), ("twoleaf8", "cross4")]
CCS = ("none", "dcqcn", "hpcc", "dctcp")


def run(topo_name: str, flows_name: str, cc: str, wire: str) -> dict[str, float]:
    topo = read_hpcc(REF / "inputs" / f"{topo_name}.topo.txt")
    flows = read_hpcc_flows(REF / "inputs" / f"{flows_name}.flows.txt", topo)
    cfg = apply_overrides(PacketConfig(cc=cc), [f"wire={wire}"])
    t0 = time.perf_counter()
    with Ns3Simulator(topo, cfg) as sim:
        for start, group in groupby(flows, key=lambda f: f.start_ns):
            sim.submit([f.to_flow() for f in group], start)
        sim.drain()
        sim.finish()
        fcts = sorted(r.fct_ns for r in sim.fct_records())
        frames = len(sim.pfc_events())
        events = int(sim.stats().get("events", 0))  # type: ignore[call-overload]
    return {"p50": median(fcts), "max": fcts[-1], "pfc": frames, "events": events, "wall": time.perf_counter() - t0}


def main() -> None:
    print(f"{'case':<22} {'cc':<6} {'ref p50 µs':>10} {'hpcc p50':>9} {'roce4k p50':>10} {'Δp50':>7} {'Δmax':>7}"
          f" {'PFC h/4k':>9} {'events h/4k':>13} {'wall h/4k':>10}")  # fmt: skip
    ratios = []
    run("star8", "incast4", "none", "hpcc")  # warm-up: the first run pays for importing ns-3
    for topo_name, flows_name in CASES:
        for cc in CCS:
            ref_file = REF / "fct" / f"{topo_name}-{flows_name}-{cc}.fct.txt"
            if not ref_file.exists():
                continue
            ref = median(r.fct_ns for r in read_fct_txt(ref_file))
            h = run(topo_name, flows_name, cc, "hpcc")
            r = run(topo_name, flows_name, cc, "roce4k")
            ratios.append((h["events"] / r["events"], h["wall"] / r["wall"]))
            d50, dmax = 100 * (r["p50"] / h["p50"] - 1), 100 * (r["max"] / h["max"] - 1)
            print(
                f"{topo_name + '/' + flows_name:<22} {cc:<6} {ref / 1e3:>10.1f} {h['p50'] / 1e3:>9.1f}"
                f" {r['p50'] / 1e3:>10.1f} {d50:>6.1f}% {dmax:>6.1f}%"
                f" {h['pfc']:>4}/{r['pfc']:<4} {h['events'] / r['events']:>12.2f}x {h['wall'] / r['wall']:>9.2f}x"
            )
    print(
        f"\nfewer events with roce4k: median {median(e for e, _ in ratios):.2f}x;"
        f" wall: median {median(w for _, w in ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
