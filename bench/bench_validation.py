"""End-to-end validation: every published row of docs/validation.md, simulated live, with the mean abs error.

    .venv/bin/python bench/bench_validation.py                      # Megatron 1.7B, 3.6B, 7.5B
    .venv/bin/python bench/bench_validation.py --models gpt3-18.4b  # the 256-GPU row
    .venv/bin/python bench/bench_validation.py --all                # all 6 rows (Megatron 4 + Llama 3 8B 2)
    .venv/bin/python bench/bench_validation.py --all --no-public-fit  # the same with the L40S-shaped curves only
    .venv/bin/python bench/bench_validation.py --layers 2 --steps 2 # a quick smoke run (not comparable)

Megatron-LM GPT runs of Narayanan et al. (SC 2021), Table 1: for each configuration it writes a DGX A100
cluster topology (AMD EPYC hosts, `cpu = "amd"`; 8 GPUs per host on an NVSwitch, NVLink 2400 Gb/s per
direction = 600 GB/s per GPU both ways, one 200 Gb/s HDR NIC per GPU, a non-blocking 2-tier leaf-spine with
32 NICs (4 hosts) per leaf and 8 spines), runs examples/megatron_gpt.py under `phantora run --tensors phantom
--dedup 8 --gpu a100` (flow network) inside `/usr/bin/time -v`, and prints the simulated achieved TFLOP/s per
GPU (Megatron's FLOP formula over the mean step time of every step but the first) against the paper's figure.

torchtitan's published Llama 3 8B figures (docs/performance.md of pytorch/torchtitan): tokens/s per GPU of
examples/llama_train.py on 8 H100 (the Grand Teton part: `--gpu h100-96gb`, 500 W, 96 GB HBM2e, local
batch 2, op-level selective AC) and on 64 A100 80 GB (`topologies/a100x64.toml`, batch 1, selective layer
AC), sequence 8192, phantom tensors, flow network.

Not part of the test suite: the rows take minutes each on two cores (the 18.4B row and the 64-GPU Llama
row the longest).
"""

from __future__ import annotations

import argparse
import json
import os
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
        'cpu = "amd"',  # a DGX A100 has two AMD EPYC 7742s: NCCL's AMD net overhead and LL limits apply
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


PHANTORA = [sys.executable, "-m", "phantora.cli"]  # this checkout's phantora (PYTHONPATH), or the installed one
# torchtitan's published Llama 3 8B rows: name -> (published tokens/s/GPU, phantora run arguments)
LLAMA = {
    "llama3-8b-8xh100": (
        5762,
        ["--topology", "rail128", "--nproc", "8", "--gpu", "h100-96gb"],
        ["--batch", "2", "--ac", "op"],
    ),
    "llama3-8b-64xa100": (2904, ["--topology", "a100x64", "--gpu", "a100"], ["--batch", "1", "--ac", "selective"]),
}
LLAMA_SOURCE = "pytorch/torchtitan docs/performance.md: Llama 3.1 8B on 8 H100 (Table 1), Llama 3 8B on 64 A100"


def command(model: str, topo: Path, out: Path, args: argparse.Namespace) -> list[str]:
    row = TABLE1[model]
    cmd = [
        *PHANTORA,
        "run",
        "--overwrite",
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
    cmd += ["--attention", args.attention]
    if args.no_public_fit:
        cmd.insert(cmd.index("--gpu"), "--no-public-fit")
    return cmd


def llama_command(name: str, out: Path, args: argparse.Namespace) -> list[str]:
    _, run_args, script_args = LLAMA[name]
    cmd = [*PHANTORA, "run", "--overwrite", "--phantom", "--trace", "none", "--out", str(out), *run_args]
    if args.no_public_fit:
        cmd.append("--no-public-fit")
    cmd += [str(ROOT / "examples/llama_train.py"), "--model", "llama3-8b", "--seq", "8192", *script_args]
    cmd += ["--steps", "2"]  # the first step warms up; the second is the steady step
    if args.layers is not None:
        cmd += ["--layers", str(args.layers)]
    return cmd


def run_llama(name: str, args: argparse.Namespace) -> dict:
    """One torchtitan row: simulated tokens/s per GPU against the published figure."""
    published = LLAMA[name][0]
    out = Path(args.out) / name
    out.mkdir(parents=True, exist_ok=True)
    cmd = llama_command(name, out / "run", args)
    print("$", " ".join(cmd).replace(str(ROOT) + "/", ""), flush=True)
    t0 = time.monotonic()
    env = {**os.environ, "PHANTORA_MEMORY_LIMIT": "off"}  # the published H100 run reserved 82.4 GiB of 96
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=ROOT,
                          env=env)  # fmt: skip
    wall, rss = time_v(proc.stderr)
    (out / "stdout.txt").write_text(proc.stdout)
    (out / "stderr.txt").write_text(proc.stderr)
    res: dict = {"model": name, "published": published, "unit": "tokens/s/GPU", "wall_s": wall or time.monotonic() - t0,
                 "max_rss_mb": rss, "command": cmd}  # fmt: skip
    if proc.returncode != 0:
        res["failed"] = " / ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        return res
    summary = json.loads((out / "run" / "results.json").read_text())
    sim = summary["tokens_per_s_per_gpu"]
    steps = summary["steps"][1:] or summary["steps"]
    res.update(
        simulated=sim,
        error=(sim - published) / published,
        step_s=summary["step_time_ns"]["mean"] * 1e-9,
        exposed_s=sum(s["exposed_ns"] for s in steps) / len(steps) * 1e-9,
        compute_tiers=(summary.get("compute_tiers") or {}).get("share"),
    )
    return res


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
    res.update(published=row["tflops"], unit="TFLOP/s/GPU")
    if proc.returncode != 0:
        own = proc.stderr.split("\tCommand being timed")[0]  # the run's own words, not /usr/bin/time's report
        tail = (proc.stdout + own).strip().splitlines()[-5:]
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
        published=row["tflops"],
        simulated=sim,
        unit="TFLOP/s/GPU",
        compute_tiers=(summary.get("compute_tiers") or {}).get("share"),
    )
    return res


def summary_table(results: list[dict]) -> str:
    """Every row's published and simulated figure, its error and who timed its kernels; the mean abs error."""
    lines = ["| row | unit | published | simulated | error | kernel time by tier |", "|---|---|---:|---:|---:|---|"]
    errs = []
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['model']} | {r['unit']} | {r['published']} | failed | | |")
            continue
        errs.append(abs(r["error"]))
        tiers = ", ".join(f"{t} {100 * v:.0f}%" for t, v in (r.get("compute_tiers") or {}).items())
        sim, err = f"{r['simulated']:.1f}", f"{100 * r['error']:+.1f}%"
        lines.append(f"| {r['model']} | {r['unit']} | {r['published']} | {sim} | {err} | {tiers} |")
    if errs:
        lines.append(f"\nmean absolute error over {len(errs)} rows: {100 * sum(errs) / len(errs):.1f}%")
    return "\n".join(lines)


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
    p.add_argument("--models", nargs="*", default=["gpt3-1.7b", "gpt3-3.6b", "gpt3-7.5b"], choices=list(TABLE1))
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch (our choice, see docs)")
    p.add_argument("--steps", type=int, default=3, help="iterations; the first is warm-up and not counted")
    p.add_argument("--dedup", type=int, default=8, help="live processes")
    p.add_argument("--layers", type=int, default=None, help="override the blocks (smoke runs only)")
    p.add_argument(
        "--attention",
        choices=["megatron", "sdpa", "unfused"],
        default="megatron",
        help="Megatron rows: megatron = the paper's fused scale-mask-softmax (default); see examples/megatron_gpt.py",
    )
    p.add_argument("--all", action="store_true", help="every row: the four Megatron rows and the two Llama rows")
    p.add_argument("--llama", nargs="*", default=[], choices=list(LLAMA), help="torchtitan Llama rows to run")
    p.add_argument("--no-public-fit", action="store_true", help="L40S-shaped curves only (the model before issue 16)")
    p.add_argument("--out", default="runs/validation")
    args = p.parse_args()
    if args.all:
        args.models, args.llama = list(TABLE1), list(LLAMA)
    results = []
    for model in args.models:
        r = run_one(model, args)
        results.append(r)
        print(table([r]).splitlines()[-1], flush=True)
    megatron = list(results)
    for name in args.llama:
        r = run_llama(name, args)
        results.append(r)
        print(summary_table([r]).splitlines()[2], flush=True)
    if megatron:
        print(f"\nsource: {SOURCE}")
        print(table(megatron))
    if args.llama:
        print(f"source: {LLAMA_SOURCE}")
    print(summary_table(results))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "validation.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
