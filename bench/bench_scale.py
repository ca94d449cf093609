"""Scale benchmark: one simulated training step of Llama-3 on up to 1024 H100s from this machine.

Runs `phantora run` (phantom tensors, rank deduplication, flow-level network) on:
- Llama-3-8B, FSDP2, full activation checkpointing, seq 8192, on 8, 64 and 1024 H100s;
- Llama-3-70B, TP 8 x FSDP 64, full activation checkpointing, seq 8192, on 512 H100s.
For each it prints the wall time, the live processes that stood for the ranks, the peak host
memory of the launcher plus every child, sampled (the summed resident set, which counts pages the
forked ranks share once per process, and the summed proportional set, which splits them), and the
simulated step time, tokens/s per GPU, MFU and device-memory peak.

    .venv/bin/python bench/bench_scale.py            # all four (about 10-20 minutes on 2 cores)
    .venv/bin/python bench/bench_scale.py --only 8b-64 --steps 2
    .venv/bin/python bench/bench_scale.py --only 8b-64 --steps 1 --record   # + execution-graph size

With --record each run also records its execution graph (`phantora run --record`; with deduplication
only the live processes record, the graph stores every rank) and the table adds the trace size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.procmem import proportional_set_mb

ROOT = Path(__file__).resolve().parents[1]
PHANTORA = [sys.executable, "-m", "phantora.cli"]

# name -> (topology args, script args)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "8b-8": (["--topology", "rail128", "--nproc", "8"], ["--model", "llama3-8b"]),
    "8b-64": (["--topology", "rail128", "--nproc", "64"], ["--model", "llama3-8b"]),
    "8b-1024": (["--topology", "leafspine1024"], ["--model", "llama3-8b"]),
    "70b-512": (["--topology", "RAIL512"], ["--model", "llama3-70b", "--parallel", "tp-fsdp", "--tp", "8"]),
}


def rail512(tmp: Path) -> Path:
    """64 DGX-H100 hosts, rail-optimised (8 rail leaves x 8 spines), written as a topology file."""
    path = tmp / "rail512.toml"
    path.write_text(
        'name = "rail512"\ngpu = "h100"\n[generator]\nkind = "rail_optimized"\nhosts = 64\ngpus_per_host = 8\n'
        'spines = 8\nnic_rate = "400Gbps"\nuplink_rate = "3200Gbps"\nlatency = "1us"\nnvlink_latency = "25ns"\n'
    )
    return path


def peak_memory(proc: subprocess.Popen, stop: threading.Event, out: list[float]) -> None:
    """Sample the summed resident set and proportional set of `proc` and its children (MB) until `stop`.

    Appends the peak RSS sum (counts every shared page once per process) and the peak PSS sum."""
    try:
        p = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        return
    best = best_pss = 0.0
    while not stop.is_set():
        try:
            procs = [p, *p.children(recursive=True)]
            best = max(best, sum(c.memory_info().rss for c in procs) / 2**20)
            best_pss = max(best_pss, sum(proportional_set_mb(c.pid) or 0.0 for c in procs))
        except psutil.Error:
            pass
        stop.wait(0.5)
    out.extend([best, best_pss])


def run_case(name: str, steps: int, tmp: Path, record: bool = False) -> dict:
    topo_args, script_args = CASES[name]
    topo_args = [str(rail512(tmp)) if a == "RAIL512" else a for a in topo_args]
    out = tmp / name
    cmd = [
        *PHANTORA,
        "run",
        *topo_args,
        "--phantom",
        "--trace",
        "none",
        "--out",
        str(out),
        "-q",
        *(["--record", str(out / "trace")] if record else []),
        str(ROOT / "examples" / "llama_train.py"),
        *script_args,
        "--seq",
        "8192",
        "--batch",
        "1",
        "--ac",
        "full",
        "--steps",
        str(steps),
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop, rss = threading.Event(), list[float]()
    sampler = threading.Thread(target=peak_memory, args=(proc, stop, rss))
    sampler.start()
    log, _ = proc.communicate()
    stop.set()
    sampler.join()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"case": name, "error": log.strip().splitlines()[-1] if log.strip() else f"exit {proc.returncode}"}
    res = json.loads((out / "results.json").read_text())
    trace = {}
    if record:
        size = sum(f.stat().st_size for f in (out / "trace").rglob("*") if f.is_file())
        per = size / res["world_size"] / len(res["steps"])
        trace = {"trace_kb": round(size / 1e3, 1), "trace_b_per_rank_step": round(per)}
    return {
        **trace,
        "case": name,
        "gpus": res["world_size"],
        "live": res["live_processes"],
        "wall_s": round(wall, 1),
        "host_peak_mb": round(rss[0] if rss else 0.0),
        "host_pss_peak_mb": round(rss[1] if len(rss) > 1 else 0.0),
        "step_ms": round(res["step_time_ns"]["mean"] / 1e6, 1),
        "tokens_s_gpu": round(res.get("tokens_per_s_per_gpu", 0.0)),
        "mfu_pct": round(100 * res.get("mfu", 0.0), 1),
        "device_peak_gib": round(res["memory"]["peak_bytes"] / 2**30, 1) if "memory" in res else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated cases ({', '.join(CASES)})")
    ap.add_argument("--steps", type=int, default=2, help="training steps per run (the first is warm-up)")
    ap.add_argument("--record", action="store_true", help="also record each run's execution graph; report its size")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="phantora-scale-") as d:
        rows = [run_case(name, args.steps, Path(d), args.record) for name in args.only.split(",")]
    keys = [
        "case",
        "gpus",
        "live",
        "wall_s",
        "host_peak_mb",
        "host_pss_peak_mb",
        "step_ms",
        "tokens_s_gpu",
        "mfu_pct",
        "device_peak_gib",
    ]
    if args.record:
        keys += ["trace_kb", "trace_b_per_rank_step"]
    print(" | ".join(keys))
    for r in rows:
        failed = f"{r['case']} | FAILED: {r.get('error')}"
        print(failed if "error" in r else " | ".join(str(r.get(k, "")) for k in keys))


if __name__ == "__main__":
    main()
