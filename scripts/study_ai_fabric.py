"""The AI-fabric study (issue 17, docs/study-ai-fabric.md): one FSDP job over an oversubscribed leaf-spine in packet
mode, per-flow ECMP vs packet spraying vs adaptive routing, each under DCQCN and HPCC; then DLCP's loss curve.

    PYTHONPATH=. python scripts/study_ai_fabric.py --out runs/study

The network part runs examples/gpt_fsdp.py in phantom mode (meta tensors: timing only, so it is fast) on 8 GPUs,
two hosts of 4 (NVSwitch inside) under two leaves, 100G NICs, two spines, 100G uplinks: 400G into 200G up, 2:1.
FSDP's all-gathers and reduce-scatters cross the hosts on 8 ring channels, 8 flows each way over 2 spines, so
ECMP's hash decides how evenly the spines carry them. Configurations: lb = ecmp (go-back-N receiver), spray and
adaptive (SACK receiver), and spray with go-back-N once (DCQCN), x cc = dcqcn / hpcc, for each seed.

The loss part runs examples/gpt_fsdp.py with real tensors (4 gloo-backed ranks, a tiny GPT) on a 4:1 two-leaf
fabric, lossless and with `--set dlcp=grads` (its gradient reduce-scatters loss-tolerant, switches trimming past
`--trim-bytes`), as scripts/dlcp_loss_curve.py does.

Writes OUT/network.csv and OUT/network.md (one row per configuration and seed; the markdown also has the mean and
spread over seeds), OUT/compare.md (`phantora compare` of the first seed's runs), OUT/loss_curve.csv and
OUT/loss_curve.png, and keeps every run directory under OUT/runs/.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from phantora.launcher import RunConfig, launch
from phantora.netsim.cli_config import engine_spec_from_flags
from phantora.results.read import load_run
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from dlcp_loss_curve import loss_curve, plot_curve  # noqa: E402

# (label, packet settings) x cc; spray over go-back-N once, to show the collapse
CONFIGS = [
    ("ecmp/gbn", ["lb=ecmp"]),
    ("spray/sack", ["lb=spray", "rx=sack"]),
    ("adaptive/sack", ["lb=adaptive", "rx=sack"]),
]
COLLAPSE = ("spray/gbn", ["lb=spray"], "dcqcn")
MODEL = ["--layers", "2", "--d-model", "512", "--heads", "8", "--seq", "128", "--batch", "4"]
COLUMNS = [
    "config",
    "cc",
    "seed",
    "step_ms",
    "fct_p50_us",
    "fct_p99_us",
    "pfc_pauses",
    "ecn_marks",
    "max_buffer_kb",
    "retx_packets",
    "reorder_max_kb",
    "spine_bytes_max_over_min",
]


def fabric() -> Topology:
    """2 hosts x 4 GPUs (NVSwitch), one host per leaf, 100G NICs, 2 spines over 100G uplinks: 2:1."""
    return leaf_spine(2, 4, 2, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", gpus_per_host=4,
                      name="ls2x4-2spine-2to1")  # fmt: skip


def network_run(out: Path, topo: Topology, sets: list[str], cc: str, seed: int, steps: int) -> None:
    """One phantom-mode run of gpt_fsdp.py into `out`."""
    cfg = RunConfig(
        str(ROOT / "examples" / "gpt_fsdp.py"),
        ["--steps", str(steps), *MODEL],
        topo,
        engine=engine_spec_from_flags("ns3", sets=[f"cc={cc}", *sets], seed=seed),
        nproc=8,
        trace="none",
        tensors="phantom",
        dedup="off",
        out_dir=out,
        overwrite=True,
    )
    launch(cfg)


def fabric_fcts(run_dir: Path, topo: Topology) -> np.ndarray:
    """FCTs (ns) of the flows between hosts (through the leaves and spines); NVLink flows left out."""
    fcts = []
    with open(run_dir / "flows.csv", newline="") as f:
        for row in csv.DictReader(f):
            src, dst = topo.nodes[int(row["src_id"])], topo.nodes[int(row["dst_id"])]
            if int(row["size_bytes"]) > 0 and src.host != dst.host:
                fcts.append(int(row["fct_ns"]))
    return np.array(fcts, dtype=np.int64)


def metrics(run_dir: Path, topo: Topology) -> dict[str, Any]:
    """One table row's figures from a run directory."""
    run = load_run(run_dir)
    e = run.engine or {}
    fct = fabric_fcts(run_dir, topo)
    return {
        "step_ms": round((run.time_ns or 0) / 1e6, 4),
        "fct_p50_us": round(float(np.percentile(fct, 50)) / 1e3, 1) if fct.size else "",
        "fct_p99_us": round(float(np.percentile(fct, 99)) / 1e3, 1) if fct.size else "",
        "pfc_pauses": e.get("pfc_pause", 0),
        "ecn_marks": e.get("ecn_marks", 0),
        "max_buffer_kb": round(e.get("max_switch_buffer_bytes", 0) / 1e3, 1),
        "retx_packets": e.get("retx_packets", 0),
        "reorder_max_kb": round(e.get("reorder_max_bytes", 0) / 1e3, 1),
        "spine_bytes_max_over_min": round(
            e.get("switch_link_bytes_max", 0) / max(1, e.get("switch_link_bytes_min", 0)), 3
        ),
    }


def _text(p: Path) -> str:
    return p.read_text() if p.exists() else ""


def markdown(rows: list[dict[str, Any]]) -> str:
    """The per-run table, then mean and spread (max - min) over seeds of each configuration."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["config"], r["cc"]), []).append(r)
    keys = ["step_ms", "fct_p99_us", "pfc_pauses", "retx_packets"]
    lines += ["", "| config | cc | seeds | " + " | ".join(f"{k} mean (spread)" for k in keys) + " |"]
    lines += ["|" + "---|" * (3 + len(keys))]
    for (config, cc), rs in groups.items():
        cells = []
        for k in keys:
            v = [float(r[k]) for r in rs if r[k] != ""]
            cells.append(f"{np.mean(v):.4g} ({max(v) - min(v):.3g})" if v else "-")
        lines.append(f"| {config} | {cc} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/study"))
    p.add_argument("--steps", type=int, default=3, help="FSDP steps per network run (the first is warm-up)")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds of the network runs")
    p.add_argument("--ccs", default="dcqcn,hpcc")
    p.add_argument("--configs", default=",".join(c[0] for c in CONFIGS) + "," + COLLAPSE[0])
    p.add_argument("--loss-steps", type=int, default=30, help="steps of each loss-curve run (0: no loss curve)")
    p.add_argument("--bound", type=float, default=0.05, help="dlcp_bound of the loss-curve run")
    p.add_argument("--trim-bytes", type=int, default=8000)
    p.add_argument("--skip-done", action="store_true", help="keep network runs already complete in OUT/runs")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    topo = fabric()
    wanted = args.configs.split(",")
    plan = [(label, sets, cc) for cc in args.ccs.split(",") for label, sets in CONFIGS if label in wanted]
    if COLLAPSE[0] in wanted:
        plan.append(COLLAPSE)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for label, sets, cc in plan:
            run_dir = args.out / "runs" / f"{label.replace('/', '-')}-{cc}-seed{seed}"
            if not (args.skip_done and '"complete"' in _text(run_dir / "status.json")):
                network_run(run_dir, topo, sets, cc, seed, args.steps)
            rows.append({"config": label, "cc": cc, "seed": seed, **metrics(run_dir, topo)})
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    with open(args.out / "network.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (args.out / "network.md").write_text(markdown(rows))
    first = sorted({r["seed"] for r in rows})[0]
    dirs = [args.out / "runs" / f"{r['config'].replace('/', '-')}-{r['cc']}-seed{first}" for r in rows]
    dirs = [d for d in dirs if d.name.endswith(f"seed{first}")]
    labels = ",".join(d.name.removesuffix(f"-seed{first}") for d in dirs)
    cmp = [sys.executable, "-m", "phantora.cli", "compare", *map(str, dirs), "--labels", labels, "--no-plots"]
    cmp += ["--out", str(args.out / "compare")]
    res = subprocess.run(cmp, capture_output=True, text=True, check=False)
    (args.out / "compare.md").write_text(res.stdout if res.returncode == 0 else res.stderr)
    t_net = time.perf_counter() - t0
    if args.loss_steps > 0:
        rows_l = loss_curve(args.out, args.loss_steps, args.bound, args.trim_bytes, "dcqcn", "gpt_fsdp.py")
        plot_curve(rows_l, args.bound, args.out / "loss_curve.png", "tiny GPT, FSDP, 4 GPUs, 4:1 two-leaf, DCQCN")
        zeroed = [r[5] for r in rows_l]
        print(f"loss at the last step: lossless {rows_l[-1][1]:.4f}, DLCP {rows_l[-1][2]:.4f}; "
              f"zeroed per step on rank 0: {min(zeroed)}..{max(zeroed)} B")  # fmt: skip
    print(f"network runs {t_net:.0f} s, all {time.perf_counter() - t0:.0f} s; tables in {args.out}")


if __name__ == "__main__":
    main()
