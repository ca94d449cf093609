"""End-to-end validation: Megatron-LM GPT runs of Narayanan et al. (SC 2021), Table 1, simulated live.

    .venv/bin/python bench/bench_validation.py                      # 1.7B, 3.6B, 7.5B
    .venv/bin/python bench/bench_validation.py --models gpt3-18.4b  # the 256-GPU row
    .venv/bin/python bench/bench_validation.py --layers 2 --steps 2 # a quick smoke run (not comparable)

For each configuration it writes a DGX A100 cluster topology (8 GPUs per host on an NVSwitch,
NVLink 2400 Gb/s per direction = 600 GB/s per GPU both ways, one 200 Gb/s HDR NIC per GPU, a
non-blocking 2-tier leaf-spine with 32 NICs (4 hosts) per leaf and 8 spines), runs
examples/megatron_gpt.py under `phantora run --tensors phantom --dedup 8 --gpu a100` (flow network)
inside `/usr/bin/time -v`, and prints the simulated achieved TFLOP/s per GPU (Megatron's FLOP
formula over the mean step time of every step but the first) against the paper's figure.

Not part of the test suite: the three default rows take several minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from megatron_gpt import TABLE1, get_config, megatron_flops, param_count  # noqa: E402

A100_BF16_PEAK = 312e12
ENDPOINTS_PER_LEAF = 32
SPINES = 8
SOURCE = (
    "Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM, "
    "SC 2021 (arXiv:2104.04473), Table 1"
)


def topology_toml(gpus: int) -> str:
    """A non-blocking leaf-spine of DGX A100 hosts (one leaf and no spine when 32 GPUs or fewer)."""
    leaves = max(1, gpus // ENDPOINTS_PER_LEAF)
    per_leaf = gpus // leaves
    spines = SPINES if leaves > 1 else 0
    lines = [
        f'name = "dgxa100-{gpus}"',
        f'description = "{gpus // 8} DGX A100 hosts: 8 GPUs on an NVSwitch (NVLink 2400 Gbps per direction), '
        f'one 200G HDR NIC per GPU, {leaves} leaves x {per_leaf} NICs, {spines} spines, non-blocking"',
        'gpu = "a100"',
        "",
        "[generator]",
        'kind = "leaf_spine"',
        f"leaves = {leaves}",
        f"endpoints_per_leaf = {per_leaf}",
        f"spines = {spines}",
        "gpus_per_host = 8",
        'nic_rate = "200Gbps"',
        'latency = "1us"',
    ]
    if spines:
        lines.append("oversubscription = 1")
    return "\n".join(lines) + "\n"


def command(model: str, topo: Path, out: Path, args: argparse.Namespace) -> list[str]:
    row = TABLE1[model]
    cmd = [
        str(ROOT / ".venv/bin/phantora"),
        "run",
        "--tensors",
        "phantom",
        "--dedup",
        str(args.dedup),
        "--gpu",
        "a100",
        "--topology",
        str(topo),
        "--nproc",
        str(row["gpus"]),
        "--trace",
        "none",
        "--out",
        str(out),
        str(ROOT / "examples/megatron_gpt.py"),
        "--model",
        model,
        "--tp",
        str(row["tp"]),
        "--global-batch",
        str(row["batch"]),
        "--micro-batch",
        str(args.micro_batch),
        "--steps",
        str(args.steps),
    ]
    if args.layers is not None:
        cmd += ["--layers", str(args.layers)]
    if args.attention != "sdpa":
        cmd += ["--attention", args.attention]
    return cmd


def time_v(stderr: str) -> tuple[float | None, float | None]:
    """Wall seconds and maximum resident set size (MB) from /usr/bin/time -v."""
    wall = rss = None
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", stderr)
    if m:
        parts = [float(x) for x in m.group(1).split(":")]
        wall = sum(v * 60**i for i, v in enumerate(reversed(parts)))
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    if m:
        rss = int(m.group(1)) / 1024
    return wall, rss


def run_one(model: str, args: argparse.Namespace) -> dict:
    row = TABLE1[model]
    out = Path(args.out) / model
    out.mkdir(parents=True, exist_ok=True)
    topo = out / f"dgxa100_{row['gpus']}.toml"
    topo.write_text(topology_toml(row["gpus"]))
    cmd = command(model, topo, out / "run", args)
    print("$", " ".join(cmd).replace(str(ROOT) + "/", ""), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=ROOT)
    elapsed = time.monotonic() - t0
    wall, rss = time_v(proc.stderr)
    (out / "stdout.txt").write_text(proc.stdout)
    (out / "stderr.txt").write_text(proc.stderr)
    res: dict = {"model": model, **row, "wall_s": wall or elapsed, "max_rss_mb": rss, "command": cmd}
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        res["failed"] = " / ".join(tail)
        return res
    summary = json.loads((out / "run" / "results.json").read_text())
    cfg = get_config(model, args.layers)
    flops = megatron_flops(cfg, row["batch"])
    step_ns = summary["step_time_ns"]["mean"]
    sim = flops / (step_ns * 1e-9 * row["gpus"]) / 1e12
    res.update(
        params=param_count(cfg),
        flops_per_step=flops,
        step_s=step_ns * 1e-9,
        steps=[s["time_ns"] * 1e-9 for s in summary["steps"]],
        exposed_s=sum(s["exposed_ns"] for s in summary["steps"][1:]) / max(1, len(summary["steps"]) - 1) * 1e-9,
        sim_tflops=sim,
        mfu=summary.get("mfu"),
        error=(sim - row["tflops"]) / row["tflops"],
        peak_rss_mb_total=summary.get("peak_rss_mb_total"),
        device_memory_gib=summary.get("memory", {}).get("peak_bytes", 0) / 2**30,
    )
    return res


def table(results: list[dict]) -> str:
    head = (
        "| config | GPUs | TP x DP | global batch | paper TFLOP/s/GPU | simulated TFLOP/s/GPU | error | "
        "step time (sim.) | of which exposed comm. | wall time | max RSS (one process) |"
    )
    lines = [head, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        dp = r["gpus"] // r["tp"]
        first = f"| {r['model']} | {r['gpus']} | {r['tp']} x {dp} | {r['batch']} | {r['tflops']} |"
        if "failed" in r:
            lines.append(f"{first} failed: {r['failed']} |")
            continue
        rss = f"{r['max_rss_mb']:.0f} MB" if r.get("max_rss_mb") else "?"
        lines.append(
            f"{first} {r['sim_tflops']:.1f} | {r['error'] * 100:+.1f}% | {r['step_s']:.3f} s | "
            f"{r['exposed_s'] * 1e3:.0f} ms | {r['wall_s']:.0f} s | {rss} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gpt3-1.7b", "gpt3-3.6b", "gpt3-7.5b"], choices=list(TABLE1))
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch (our choice, see docs)")
    p.add_argument("--steps", type=int, default=3, help="iterations; the first is warm-up and not counted")
    p.add_argument("--dedup", type=int, default=8, help="live processes")
    p.add_argument("--layers", type=int, default=None, help="override the blocks (smoke runs only)")
    p.add_argument("--attention", choices=["sdpa", "unfused"], default="sdpa", help="see examples/megatron_gpt.py")
    p.add_argument("--out", default="runs/validation")
    args = p.parse_args()
    results = []
    for model in args.models:
        r = run_one(model, args)
        results.append(r)
        print(table([r]).splitlines()[-1], flush=True)
    print(f"\nsource: {SOURCE}")
    print(table(results))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "validation.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
