"""`phantora compare RUN_A RUN_B ...`: compare run directories; differences are relative to the first run.

Prints a table (iteration time or makespan, per-collective times, FCT and slowdown percentiles, PFC
pauses and paused time, queue depth, ECN marks and CNPs, link utilisation) and, with --out, writes
compare.md, compare.json and the plots (FCT CDF, queue depth, PFC timeline, step timelines).
A file a run does not have is shown as "-" (not measured).

Given one directory of a multi-job run (`phantora run --jobs ... --alone`), it compares each job alone and
shared, with the job's bytes and the PFC pauses it suffered and caused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from phantora.commands.options import add_plot_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="compare run directories (flow vs packet, CC algorithms ...)", description=__doc__
    )
    p.add_argument("runs", nargs="+", type=Path, help="run directories (replay --out, run --out, netsim --out)")
    p.add_argument("--out", "-o", type=Path, default=None, help="write compare.md, compare.json and plots here")
    p.add_argument("--labels", default=None, help="comma-separated run labels (default: directory names)")
    add_plot_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.plots:
        return _run(args)
    from phantora.report.plots import plot_style

    with plot_style(args.plot_style):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from phantora.report.compare import compare_jobs, format_table, jobs_run, load_and_compare, write_report

    if len(args.runs) == 1 and jobs_run(args.runs[0]) is not None:
        for i, (name, runs, cmp) in enumerate(compare_jobs(args.runs[0])):
            print(("\n" if i else "") + f"== job {name}: alone vs shared ==")
            print(format_table(cmp))
            if args.out:
                paths = write_report(args.out / name, runs, cmp, plots=args.plots)
                print(f"\nwrote {len(paths)} files to {args.out / name}: " + ", ".join(p.name for p in paths))
        return 0
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    runs, cmp = load_and_compare(args.runs, labels)
    print(format_table(cmp))
    if args.out:
        paths = write_report(args.out, runs, cmp, plots=args.plots)
        print(f"\nwrote {len(paths)} files to {args.out}: " + ", ".join(p.name for p in paths))
    return 0
