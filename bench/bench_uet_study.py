"""UET against RoCE on ML traffic (issue 37): one workload replayed over an oversubscribed fabric under
`--set transport=uet` (RUD, NSCC, REPS, trimming, lossy), RoCE with DCQCN and RoCE with HPCC (go-back-N, PFC,
ECMP), with and without a link failure; per run the makespan, the collectives' times, the FCT median and tail,
drops, trims, retransmissions, timeouts, PFC pauses and the switch queues. Prints a table, asserts nothing.

The default is the tutorial's study (workloads/rail128_study.toml on rail128_os4: 128 H100s in two pods, 4:1 to
2 spines; DDP-like 2 MiB bucket all-reduces over all ranks overlapping an MoE dispatch of four 16-rank cross-pod
all-to-alls, 8 MiB per rank). `--fail` adds a scenario: the uplink rail0.0-spine0 goes down at 100 us (routing
re-converges 20 us later), so pod 0's rail-0 leaf has one spine left for the rest of the run. Each run is
`phantora replay W -t T --network ns3 --set nvlink=fluid ...` in a temporary run directory.

    .venv/bin/python bench/bench_uet_study.py                 # the three transports, healthy and with the failure
    .venv/bin/python bench/bench_uet_study.py --workload workloads/fsdp_layers.toml --topology T --no-fail
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = {
    "uet": ["--set", "transport=uet"],
    "roce+dcqcn": ["--set", "transport=roce", "--cc", "dcqcn"],
    "roce+hpcc": ["--set", "transport=roce", "--cc", "hpcc"],
}
FAILURE = """name = "uplink-down"
reconvergence = "20us"

[[events]]
kind = "link_down"
at = "100us"
link = ["rail0.0", "spine0"]
"""


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


@dataclass
class Figures:
    makespan_us: float
    ops: dict[str, tuple[float, float]]  # op family -> (mean, max) time, us
    fct_us: tuple[float, float]  # median, p99
    counts: list[int]  # drops, trims, retransmitted packets, timeouts, PFC pauses
    queue_kb: tuple[float, float]  # p99 of the queue samples, the largest switch buffer use


def run(workload: str, topology: str, transport: str, scenario: Path | None, out: Path) -> Figures:
    """One replay; its figures."""
    cmd = [str(ROOT / ".venv/bin/phantora"), "replay", workload, "-t", topology, "--network", "ns3",
           "--set", "nvlink=fluid", *TRANSPORTS[transport], "-o", str(out)]  # fmt: skip
    if scenario is not None:
        cmd += ["--scenario", str(scenario)]
    subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    res = json.loads((out / "results.json").read_text())
    eng = res["engine"]
    with open(out / "flows.csv") as f:
        fcts = [float(r["fct_ns"]) for r in csv.DictReader(f) if r["fct_ns"]]
    with open(out / "queues.csv") as f:
        queues = [float(r["bytes"]) for r in csv.DictReader(f)]
    ops: dict[str, list[float]] = {}
    for op in res["ops"]:
        ops.setdefault(op["name"].split(".")[0].rstrip("0123456789"), []).append(op["time_ns"])
    return Figures(
        res["makespan_ns"] / 1e3,
        {k: (statistics.mean(v) / 1e3, max(v) / 1e3) for k, v in ops.items()},
        (statistics.median(fcts) / 1e3, pct(fcts, 0.99) / 1e3),
        [int(eng.get(k, 0)) for k in ("drops", "trims", "retx_packets", "timeouts", "pfc_pause")],
        (pct(queues, 0.99) / 1e3 if queues else 0.0, eng.get("max_switch_buffer_bytes", 0) / 1e3),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="workloads/rail128_study.toml")
    ap.add_argument("--topology", default="rail128_os4")
    ap.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=list(TRANSPORTS))
    ap.add_argument("--no-fail", action="store_true", help="only the healthy fabric")
    args = ap.parse_args()
    head = ["transport", "fabric", "makespan", "ops: mean / max", "FCT p50 / p99", "drops", "trims", "retx"]
    print("| " + " | ".join([*head, "timeouts", "PFC pauses", "queue p99 / switch buffer max"]) + " |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "uplink_down.toml"
        scenario.write_text(FAILURE)
        for fail in [False] if args.no_fail else [False, True]:
            for t in args.transports:
                r = run(args.workload, args.topology, t, scenario if fail else None, Path(tmp) / f"{t}-{fail}")
                ops = ", ".join(f"{k} {m:.0f} / {x:.0f} us" for k, (m, x) in r.ops.items())
                fct = f"{r.fct_us[0]:.1f} / {r.fct_us[1]:.1f} us"
                queue = f"{r.queue_kb[0]:.0f} / {r.queue_kb[1]:.0f} KB"
                fabric = "rail0.0-spine0 down at 100 us" if fail else "healthy"
                cells = [t, fabric, f"{r.makespan_us:.1f} us", ops, fct, *(f"{c:,}" for c in r.counts), queue]
                print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
