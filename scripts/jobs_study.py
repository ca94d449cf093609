"""The interference study of docs/tutorial.md: two FSDP jobs on an oversubscribed leaf-spine.

    python scripts/jobs_study.py [--out runs/jobs-study] [--buffer 8000000] [--configs flow,dcqcn,...]

Runs examples/jobs/fsdp_pair.toml (and fsdp_pair_classes.toml: one traffic class per job) on twoleaf8
(2 leaves x 4 GPUs, 4:1 across leaves) with each job also run alone (--alone), in flow mode and in packet
mode with DCQCN and HPCC, switch buffers of --buffer bytes (shallow enough for PFC to act). Prints one
row per job and configuration: step time shared and alone, slowdown, and the PFC pauses the job suffered
and caused; writes the table to OUT/study.md. Each packet-mode configuration takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phantora.jobs.run import launch_jobs  # noqa: E402
from phantora.jobs.spec import load_jobs  # noqa: E402
from phantora.launcher import RunConfig  # noqa: E402
from phantora.netsim.cli_config import engine_spec_from_flags  # noqa: E402

# name -> (network, cc, jobs file)
CONFIGS = {
    "flow": ("flow", None, "fsdp_pair"),
    "dcqcn": ("ns3", "dcqcn", "fsdp_pair"),
    "hpcc": ("ns3", "hpcc", "fsdp_pair"),
    "dcqcn-classes": ("ns3", "dcqcn", "fsdp_pair_classes"),
    "hpcc-classes": ("ns3", "hpcc", "fsdp_pair_classes"),
}


def alone_pauses(run: Path, job: str) -> int:
    """The PFC pauses a job suffered when it ran alone (alone/<job>/results.json)."""
    doc = json.loads((run / "alone" / job / "results.json").read_text())
    return int(doc["fabric"]["jobs"][job].get("pauses_suffered", 0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/jobs-study"))
    p.add_argument(
        "--buffer", type=int, default=8_000_000, help="switch buffer (bytes) in packet mode (2000000: PFC acts)"
    )
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    args = p.parse_args()
    rows = [
        "| config | job | class | step shared (ms) | step alone (ms) | slowdown | PFC pauses suffered (alone) "
        "| paused µs | PFC pauses caused |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in args.configs.split(","):
        network, cc, jobs = CONFIGS[name]
        sets = [f"buffer_bytes={args.buffer}"] if network == "ns3" else []
        cfg = RunConfig(
            script="",
            topology="twoleaf8",
            engine=engine_spec_from_flags(network, cc=cc, sets=sets),
            out_dir=args.out / name,
            overwrite=True,
            trace="none",
        )
        rep = launch_jobs(load_jobs(jobs), cfg, alone=True)
        fab = (rep.summary.get("fabric") or {}).get("jobs", {})
        for j in rep.summary["jobs"]:
            if j.get("alone_error"):  # the job's run alone failed: its row would have no baseline
                sys.exit(f"jobs_study.py: {name}: job {j['name']} alone failed: {j['alone_error']}")
            f = fab.get(j["name"], {})
            pfc = [str(f[k]) if k in f else "-" for k in ("pauses_suffered", "paused_ns_suffered", "pauses_caused")]
            if pfc[1] != "-":
                pfc[1] = f"{int(pfc[1]) / 1e3:.1f}"
                pfc[0] += f" ({alone_pauses(args.out / name, j['name'])})"
            rows.append(
                f"| {name} | {j['name']} | {j['traffic_class'] or 3} | {j['time_ns'] / 1e6:.3f} | "
                f"{j['alone_time_ns'] / 1e6:.3f} | {j['slowdown']:.3f} | {' | '.join(pfc)} |"
            )
        print("\n".join(rows), flush=True)
    (args.out / "study.md").write_text("\n".join(rows) + "\n")
    print(f"wrote {args.out / 'study.md'}")


if __name__ == "__main__":
    main()
