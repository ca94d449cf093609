"""UET against RoCE on live training jobs (issue 37, item 7): a live FSDP job and a live MoE job, each under
`--set transport=uet` (RUD, NSCC, REPS, trimming, lossy), RoCE + DCQCN and RoCE + HPCC (go-back-N, PFC, ECMP),
on an oversubscribed 2-tier fat tree, healthy, with an uplink down from step 1 and with it failing mid-step.
Prints a table, asserts nothing.

The fabric: 8 H100s with their own 100G NICs (no NVLink, so every byte crosses a switch), 4 leaves of 2, 2 spines
over 50G uplinks: 200G down, 100G up per leaf (2:1). The failure (`--scenario`, `at_step = 1`): leaf0-spine0
goes down when the first rank starts step 1 and routing re-converges 20 us later, so leaf 0 has 50G up (4:1) for
the rest of the run. The mid-step failure (`at`): leaf0-spine0 goes down 2 ms into step 1 (step 1 starts where
the healthy run of the same job and transport ends step 0, so the healthy run comes first), with packets on the
wire, and stays down. The jobs, 2 steps each in phantom mode (meta tensors: timing only), 8 live ranks:
- fsdp: examples/gpt_fsdp.py, a 2-layer GPT (d 512, seq 128, batch 4): FSDP2's all-gathers and reduce-scatters as
  NCCL rings over 2 channels, a quarter of each ring's hops crossing leaves;
- moe: bench/uet_moe_job.py, one Mixtral-style layer (d 1024, 8 experts top-2, one per rank; seq 512, batch 4):
  4 all-to-alls of 8 MiB per rank per step, 6/7 of their bytes across leaves, and a small all-reduce.
Per run: the step-1 time (step 0 includes start-up), the FCT median and p99 of every network flow, drops, trims,
retransmitted packets, timeouts, PFC pauses, the p99 of the switch-queue samples and the largest shared-buffer use,
and the ns-3 events, with the network server's CPU seconds and events per CPU second (not for the failure at a
step: a scenario at a step runs the engine in the coordinator's process, which does not count its CPU apart).

`--cpu N` instead runs the healthy jobs N times per transport, interleaved, keeps each transport's least CPU, and
prints the CPU per event against RoCE + DCQCN (issue 37's goal: UET at most 15% more).

    .venv/bin/python bench/bench_uet_live.py --jobs fsdp --out runs/uet-live      # the nine fsdp runs (~6 min)
    .venv/bin/python bench/bench_uet_live.py --jobs moe --out runs/uet-live       # the nine moe runs (~12 min)
    .venv/bin/python bench/bench_uet_live.py --states healthy mid --skip-done     # add the mid-step failure
    .venv/bin/python bench/bench_uet_live.py --jobs fsdp moe --cpu 3 --out runs/uet-cpu
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = {
    "uet": ["--set", "transport=uet"],
    "roce+dcqcn": ["--set", "transport=roce", "--cc", "dcqcn"],
    "roce+hpcc": ["--set", "transport=roce", "--cc", "hpcc"],
}
FABRIC = """name = "uet_live8"
description = "8 GPUs with own 100G NICs, 4 leaves x 2, 2 spines over 50G uplinks (2:1)"
gpu = "h100"

[generator]
kind = "leaf_spine"
leaves = 4
endpoints_per_leaf = 2
spines = 2
gpus_per_host = 1
nvswitch = false
nic_rate = "100Gbps"
uplink_rate = "50Gbps"
latency = "1us"
"""
FAILURE = """name = "uplink-down"
reconvergence = "20us"

[[events]]
kind = "link_down"
at_step = 1
link = ["leaf0", "spine0"]
"""
MID_STEP = """name = "uplink-down-mid-step"
reconvergence = "20us"

[[events]]
kind = "link_down"
at = "{at_ns}ns"
link = ["leaf0", "spine0"]
"""
MID_OFFSET_NS = 2_000_000  # into step 1
STATES = {"healthy": "healthy", "down": "leaf0-spine0 down", "mid": "leaf0-spine0 down 2 ms into step 1"}
JOBS = {
    "fsdp": "examples/gpt_fsdp.py --steps 2 --layers 2 --d-model 512 --heads 8 --seq 128 --batch 4".split(),
    "moe": "bench/uet_moe_job.py --model uet-study --seq 512 --batch 4 --steps 2".split(),
}
COUNTS = ("drops", "trims", "retx_packets", "timeouts", "pfc_pause")


def pct(xs: list[float], q: float) -> float:
    """The q-quantile by nearest rank (0 for no samples)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else 0.0


@dataclass
class Figures:
    step_ms: float  # the last step's time
    fct_us: tuple[float, float]  # median, p99 of the network flows
    counts: dict[str, int]  # COUNTS
    queue_kb: tuple[float | None, float]  # p99 of the queue samples (None: not sampled), the largest buffer use
    events: int
    cpu_s: float | None  # the network server's CPU seconds (None: engine in the coordinator)


def figures(out: Path) -> Figures:
    """One run directory's figures."""
    res = json.loads((out / "results.json").read_text())
    eng = res["network"]["engine_stats"]
    with open(out / "flows.csv") as f:
        fcts = [float(r["fct_ns"]) for r in csv.DictReader(f) if r["fct_ns"] and int(r["size_bytes"]) > 0]
    queues: list[float] | None = None  # a run from before the coordinator wrote its engine's traces has none
    if (out / "queues.csv").exists():
        with open(out / "queues.csv") as f:
            queues = [float(r["bytes"]) for r in csv.DictReader(f)]
    cpu = eng.get("server_cpu_s")
    return Figures(
        res["steps"][-1]["time_ns"] / 1e6,
        (statistics.median(fcts) / 1e3, pct(fcts, 0.99) / 1e3),
        {k: int(eng.get(k, 0)) for k in COUNTS},
        (None if queues is None else pct(queues, 0.99) / 1e3, eng.get("max_switch_buffer_bytes", 0) / 1e3),
        int(eng["events"]),
        None if cpu is None else float(cpu),
    )


def run(job: str, transport: str, scenario: Path | None, fabric: Path, out: Path, skip_done: bool) -> Figures:
    """One live run of `job` into `out` (kept if `skip_done` and complete); its figures."""
    if not (skip_done and (out / "results.json").exists()):
        cmd = [str(ROOT / ".venv/bin/phantora"), "run", "-t", str(fabric), "--nproc", "8", "--phantom", "--network",
               "ns3", *TRANSPORTS[transport], "--trace", "none", "-o", str(out), "--overwrite"]  # fmt: skip
        if scenario is not None:
            cmd += ["--scenario", str(scenario)]
        subprocess.run([*cmd, *JOBS[job]], capture_output=True, text=True, check=True, cwd=ROOT)
    return figures(out)


def mid_step_scenario(healthy: Path, out: Path) -> Path:
    """The mid-step failure's scenario file, beside the run directory `out`: leaf0-spine0 down MID_OFFSET_NS after
    step 0 of the healthy run `healthy` ends."""
    step0 = json.loads((healthy / "steps.jsonl").read_text().splitlines()[0])
    path = out.with_name(out.name + ".toml")
    path.write_text(MID_STEP.format(at_ns=int(step0["end_ns"]) + MID_OFFSET_NS))
    return path


def study(args: argparse.Namespace, fabric: Path, scenario: Path) -> None:
    """The table: each job x fabric state x transport."""
    head = ["job", "transport", "fabric", "step 1", "FCT p50 / p99", "drops", "trims", "retx", "timeouts",
            "PFC pauses", "queue p99 / buffer max", "events", "events / CPU s"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|---|---|---|" + "---:|" * (len(head) - 3))
    states = ["healthy"] if args.no_fail else args.states
    for job in args.jobs:
        for state in states:
            for t in args.transports:
                out = args.out / f"{job}-{t}-{state}"
                sc = {"healthy": None, "down": scenario}.get(state)
                if state == "mid":
                    healthy = args.out / f"{job}-{t}-healthy"
                    run(job, t, None, fabric, healthy, skip_done=True)
                    sc = mid_step_scenario(healthy, out)
                r = run(job, t, sc, fabric, out, args.skip_done)
                rate = "-" if r.cpu_s is None else f"{r.events / r.cpu_s / 1e6:.2f} M"
                cells = [job, t, STATES[state], f"{r.step_ms:.3f} ms",
                         f"{r.fct_us[0]:.1f} / {r.fct_us[1]:.1f} us", *(f"{r.counts[k]:,}" for k in COUNTS),
                         f"{'-' if r.queue_kb[0] is None else f'{r.queue_kb[0]:.0f}'} / {r.queue_kb[1]:.0f} KB",
                         f"{r.events:,}", rate]  # fmt: skip
                print("| " + " | ".join(cells) + " |", flush=True)


def cpu_cost(args: argparse.Namespace, fabric: Path) -> None:
    """Events per CPU second per transport on each healthy job, best of `args.cpu` interleaved runs."""
    print(f"| job | transport | events | CPU s (best of {args.cpu}) | events / CPU s | CPU per event vs roce+dcqcn |")
    print("|---|---|---:|---:|---:|---:|")
    for job in args.jobs:
        best: dict[str, Figures] = {}
        for i in range(args.cpu):
            for t in args.transports:
                r = run(job, t, None, fabric, args.out / f"{job}-{t}-cpu{i}", args.skip_done)
                assert r.cpu_s is not None, "a healthy live run reports the network server's CPU"
                if t not in best or r.cpu_s < (best[t].cpu_s or 0.0):
                    best[t] = r
        base = (best["roce+dcqcn"].cpu_s or 0.0) / best["roce+dcqcn"].events if "roce+dcqcn" in best else None
        for t, r in best.items():
            per = (r.cpu_s or 0.0) / r.events
            ratio = "-" if base is None else f"{per / base:.3f}x"
            print(f"| {job} | {t} | {r.events:,} | {r.cpu_s:.2f} | {r.events / (r.cpu_s or 1):,.0f} | {ratio} |",
                  flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    ap.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=list(TRANSPORTS))
    ap.add_argument("--out", type=Path, default=Path("runs/uet-live"), help="run directories and the fabric")
    ap.add_argument("--states", nargs="+", default=list(STATES), choices=list(STATES),
                    help="healthy; down: leaf0-spine0 down from step 1; mid: down 2 ms into step 1")  # fmt: skip
    ap.add_argument("--no-fail", action="store_true", help="only the healthy fabric (--states healthy)")
    ap.add_argument("--skip-done", action="store_true", help="reuse run directories that have results.json")
    ap.add_argument("--cpu", type=int, default=0, help="N > 0: the CPU-per-event table, best of N runs")
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    fabric, scenario = args.out / "fabric.toml", args.out / "uplink_down.toml"
    fabric.write_text(FABRIC)
    scenario.write_text(FAILURE)
    if args.cpu > 0:
        cpu_cost(args, fabric)
    else:
        study(args, fabric, scenario)


if __name__ == "__main__":
    main()
