"""DLCP's effect on a real training loss: examples/gpt_ddp.py (a tiny GPT, real tensors, gloo-backed ranks; or
gpt_fsdp.py with `--example`) on an oversubscribed two-leaf fabric in packet mode, once lossless and once with its
gradient all-reduces (FSDP: reduce-scatters) loss-tolerant (`--set dlcp=grads`), the loss and step time of each
step side by side.

    PYTHONPATH=. python scripts/dlcp_loss_curve.py --out runs/dlcp --steps 30
    PYTHONPATH=. python scripts/dlcp_loss_curve.py --out runs/dlcp-fsdp --steps 30 --example gpt_fsdp.py

Writes OUT/loss_curve.csv (step, loss and step time of each run, bytes the DLCP run zeroed on rank 0) and
OUT/loss_curve.png, and keeps both run directories (OUT/lossless, OUT/dlcp). The fabric: 4 GPUs, two per leaf,
100G NICs, one spine over 25G uplinks (4:1), so the ring's leaf-crossing flows queue at the leaves, where
switches trim loss-tolerant packets past `--trim-bytes` of egress queue.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path
from typing import Any

from phantora.launcher import RunConfig, launch
from phantora.netsim.cli_config import engine_spec_from_flags
from phantora.topology.generators import leaf_spine

ROOT = Path(__file__).resolve().parents[1]
LOSS_LINE = re.compile(r"step\s+(\d+)\s+loss\s+([0-9.]+)")


def run(out: Path, steps: int, sets: list[str], model: list[str], example: str = "gpt_ddp.py") -> list[dict[str, Any]]:
    """One run of examples/EXAMPLE; per step: loss (rank 0's log), simulated step time, bytes rank 0 zeroed."""
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="25Gbps", latency="1us", name="twoleaf4-4to1")
    cfg = RunConfig(
        str(ROOT / "examples" / example),
        ["--steps", str(steps), *model],
        topo,
        engine=engine_spec_from_flags("ns3", sets=sets),
        nproc=4,
        trace="none",
        out_dir=out,
        overwrite=True,
    )
    rep = launch(cfg)
    losses = {int(m[1]): float(m[2]) for m in LOSS_LINE.finditer(rep.logs.get("rank 0", ""))}
    lines = [json.loads(x) for x in (out / "steps" / "rank0.jsonl").read_text().splitlines() if x.strip()]
    return [
        {"loss": losses.get(i, float("nan")), "time_ns": ln["time_ns"], "lost_bytes": ln.get("lost_bytes", 0)}
        for i, ln in enumerate(lines)
    ]


MODEL = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "64", "--batch", "4", "--lr", "3e-3"]
COLUMNS = ["step", "loss_lossless", "loss_dlcp", "step_ns_lossless", "step_ns_dlcp", "zeroed_bytes_rank0"]


def loss_curve(
    out: Path, steps: int, bound: float, trim_bytes: int, cc: str, example: str = "gpt_ddp.py"
) -> list[list[float]]:
    """The lossless run and the `dlcp=grads` run of `example`; rows as COLUMNS, written to OUT/loss_curve.csv."""
    common = [f"cc={cc}"] if cc else []
    base = run(out / "lossless", steps, common, MODEL, example)
    dlcp_sets = [*common, "dlcp=grads", f"dlcp_bound={bound}", f"trim_bytes={trim_bytes}"]
    lossy = run(out / "dlcp", steps, dlcp_sets, MODEL, example)
    rows: list[list[float]] = []
    for i, (a, b) in enumerate(zip(base, lossy, strict=False)):
        rows.append([i, a["loss"], b["loss"], a["time_ns"], b["time_ns"], b["lost_bytes"]])
    with open(out / "loss_curve.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(rows)
    return rows


def plot_curve(rows: list[list[float]], bound: float, path: Path, title: str = "") -> None:
    """Loss and simulated step time per step, lossless beside DLCP, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot([r[0] for r in rows], [r[1] for r in rows], label="lossless")
    ax1.plot([r[0] for r in rows], [r[2] for r in rows], label=f"DLCP (bound {bound:g})")
    ax1.set(xlabel="step", ylabel="training loss (rank 0)")
    ax1.legend()
    ax2.plot([r[0] for r in rows], [r[3] / 1e3 for r in rows], label="lossless")
    ax2.plot([r[0] for r in rows], [r[4] / 1e3 for r in rows], label="DLCP")
    ax2.set(xlabel="step", ylabel="simulated step time (µs)")
    ax2.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/dlcp"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--bound", type=float, default=0.05, help="dlcp_bound: share of each all-reduce that may be lost")
    p.add_argument("--trim-bytes", type=int, default=8000, help="switch egress queue depth past which to trim")
    p.add_argument("--cc", default="dcqcn", help="congestion control of both runs")
    p.add_argument("--example", default="gpt_ddp.py", help="gpt_ddp.py (all-reduce) or gpt_fsdp.py (reduce-scatter)")
    args = p.parse_args()
    rows = loss_curve(args.out, args.steps, args.bound, args.trim_bytes, args.cc, args.example)
    plot_curve(rows, args.bound, args.out / "loss_curve.png")
    for r in rows:
        print(f"step {r[0]:3d}  loss {r[1]:.4f} | {r[2]:.4f}  step {r[3] / 1e3:9.1f} | {r[4] / 1e3:9.1f} µs  "
              f"zeroed {r[5]} B")  # fmt: skip


if __name__ == "__main__":
    main()
