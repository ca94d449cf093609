"""`phantora sweep --grid GRID.toml` (or flags): run a grid of configurations, one process each, in parallel.

Sweeps CC algorithms, CC parameters, buffer sizes, PFC on/off, topologies, the window W or workloads.
Each run writes its own directory under OUT/runs/; OUT/sweep.csv (and sweep.parquet when pyarrow is
installed) has one row per run with its full configuration and metrics; OUT/sweep.json the same with
the grid; plots show time and PFC paused time against the CC algorithm (or the first swept parameter)
and the FCT CDFs. With --trace DIR (an execution graph from `phantora run --record DIR`) every run
replays that recording instead of running a workload or a live job. A failed run is reported with its
configuration; the others still run. Exit status 1 if any run failed. See docs/compare-and-sweep.md for
the grid format.

Example: phantora sweep --workload workloads/incast_heavy.toml --topology star8 --network ns3
         --param cc=none,dcqcn,hpcc,dctcp --param set.buffer_bytes=1000000 --out sweep-cc
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from phantora.commands.options import add_network_options, add_plot_options, add_progress_options, progress_mode

if TYPE_CHECKING:
    from phantora.sweep import SweepSpec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid of configurations in parallel and tabulate them",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--grid", "-g", type=Path, default=None, help="grid file (TOML: command, fixed, grid)")
    p.add_argument("--workload", "-w", default=None, help="fixed workload (or comma-separated list to sweep)")
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="recorded execution graph(s) (phantora run --record DIR): every run replays it; a list is swept",
    )
    p.add_argument("--topology", "-t", default=None, help="fixed topology (or comma-separated list to sweep)")
    add_network_options(p, sweep=True)
    p.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="a parameter and its values (one value = fixed); set.FIELD sets a PacketConfig field",
    )
    p.add_argument(
        "--command", dest="template", default=None, help="command template, e.g. 'replay {workload} --out {out}'"
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="repeat every configuration with seeds 1..N (the same as -p seed=1,...,N): the tables and plots "
        "show each configuration's mean and spread",
    )
    p.add_argument("--out", "-o", type=Path, default=None, help="output directory (default: sweep-<name>)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="parallel runs (default: grid jobs, else cores)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run before it counts as failed")
    p.add_argument("--ray", default=None, metavar="ADDRESS", help="run on a Ray cluster (or 'local')")
    add_progress_options(p, quiet_also=" nor each failed run as it fails")
    add_plot_options(p)
    p.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    p.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep the runs an interrupted sweep in --out completed and run the rest (default: when --out "
        "holds the same sweep); --no-resume starts over",
    )
    p.set_defaults(func=run)


def build_spec(args: argparse.Namespace) -> SweepSpec:
    """The grid file (if any) with the flags layered on top: a one-value flag is fixed, a list is swept."""
    from phantora.errors import InputError
    from phantora.sweep import SweepSpec, load_grid, parse_param, use_traces

    spec = load_grid(args.grid) if args.grid else SweepSpec()
    pairs = [parse_param(p) for p in args.param]
    for name in ("cc", "network", "topology", "workload"):  # as --param, at the front: workload first
        value = getattr(args, name)
        if value is not None:
            pairs.insert(0, parse_param(f"{name}={value}"))
    pairs += [parse_param(f"set.{item.strip()}") for item in args.set]  # --set FIELD=V1,V2
    for name, values in pairs:
        spec.fixed.pop(name, None)
        spec.grid.pop(name, None)
        if len(values) == 1:
            spec.fixed[name] = values[0]
        else:
            spec.grid[name] = values
    if args.seeds is not None:
        if args.seeds < 1:
            raise InputError(f"expected a number of seeds >= 1, got {args.seeds}", field="--seeds")
        spec.fixed.pop("seed", None)
        spec.grid["seed"] = list(range(1, args.seeds + 1))
    if args.template:
        spec.command = tuple(shlex.split(args.template))
    if args.timeout is not None:
        spec.timeout_s = args.timeout
    if args.trace is not None:
        if args.workload is not None:
            raise InputError("give either --trace or --workload, not both", field="--trace")
        spec.fixed.pop("workload", None)  # --trace replaces the grid file's workload or trace
        spec.grid.pop("workload", None)
        use_traces(spec, [t.strip() for t in args.trace.split(",")])
    if not spec.fixed and not spec.grid:
        raise InputError("nothing to sweep: give --grid or --param/--workload/--topology", field="--grid")
    ccs = spec.grid.get("cc", [spec.fixed["cc"]] if "cc" in spec.fixed else [])
    if ccs:  # every CC is a registered one (the library's registry), before any run starts
        from phantora.netsim.cc_registry import lookup

        for cc in ccs:
            lookup(str(cc), field="cc")
    return spec.validate()


def run(args: argparse.Namespace) -> int:
    from phantora.sweep import build_runs, format_rows, run_sweep

    spec = build_spec(args)
    out = args.out or Path(f"sweep-{spec.name}")
    if args.dry_run:
        for r in build_runs(spec, out):
            print(shlex.join([sys.executable, "-m", "phantora.cli", *r.args]))
        return 0
    n = len(spec.points())
    where = f"Ray at {args.ray}" if args.ray else f"{args.jobs or spec.jobs or 'all'} local job(s)"
    print(f"sweep {spec.name}: {n} runs on {where}, writing {out}", flush=True)
    style: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if args.plots:
        from phantora.report.plots import plot_style

        style = plot_style(args.plot_style)
    with style:
        res = run_sweep(
            spec,
            out,
            jobs=args.jobs,
            ray_address=args.ray,
            progress=progress_mode(args),
            plots=args.plots,
            resume=args.resume,
        )
    print(format_rows(spec, res.rows))
    print("wrote " + ", ".join(str(p) for p in res.files))
    if res.failed:
        print(f"{len(res.failed)} of {n} runs failed (see above and their run.log)", file=sys.stderr)
        return 1
    return 0
