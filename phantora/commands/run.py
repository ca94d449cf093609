"""`phantora run --topology T train.py [args]`: run a real PyTorch training script on a simulated cluster.

`phantora run --topology T --jobs jobs.toml [--alone]`: several jobs (scripts, workloads, recorded graphs) on
one fabric, each with its own ranks, GPUs, start and step count (docs/jobs.md)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from phantora.commands.options import (
    add_granularity_option,
    add_network_options,
    add_progress_options,
    progress_mode,
)
from phantora.commands.outdir import add_out_options
from phantora.commands.scenario_option import add_scenario_option, check_run_scenario
from phantora.commands.seeds import add_seed_options, with_seeds
from phantora.netsim.cli_config import QUEUE_SAMPLE_HELP, engine_spec_from_args
from phantora.netsim.engine_spec import EngineSpec
from phantora.progress import NetworkLine
from phantora.rank_options import DEFAULT_PROGRAM_SEED, DEFAULT_TRACE_STEPS, parse_program_seed
from phantora.results.run_dir import RunDir
from phantora.units import parse_time_ns


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training script as N simulated GPUs",
        description=__doc__,
        epilog="See docs/runtime.md (one job) and docs/jobs.md (--jobs). Everything after the script is passed to it.",
    )
    p.add_argument("--topology", "-t", required=True, help="topology file or shipped name (e.g. testbed16)")
    add_network_options(p)
    add_scenario_option(p)
    p.add_argument("--queue-sample-ns", type=int, default=None, metavar="N", help=QUEUE_SAMPLE_HELP)
    p.add_argument(
        "--gpu",
        default=None,
        help="GPU model or variant: a100, a100-40gb, a100-pcie, h100, h100-96gb (500 W HBM2e), h100-pcie, h100-nvl, "
        "h200, b200, l40s (default: the topology's; docs/gpus.md)",
    )
    p.add_argument("--window", default=None, help="co-simulation window, e.g. 10us (default 0 = exact, in both modes)")
    add_out_options(p, "results.json, steps.jsonl, status.json, trace.json and logs/")
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="number of ranks (default: the topology's rank count; with --spawn, the nprocs the script's "
        "mp.spawn names in its source, else the GPUs of one host)",
    )
    p.add_argument(
        "--placement",
        default=None,
        metavar="POLICY|GPUS",
        help="the GPUs the ranks run on: packed, spread (one per leaf, then per host, in turn), random, or a list "
        "such as 0-3,8-11 or gpu0,gpu8 (its length is the rank count); rank r on the r-th GPU in ascending order "
        '(default: GPUs 0..nproc-1; docs/jobs.md "Placement")',
    )
    p.add_argument(
        "--spawn",
        action="store_true",
        help="the script starts its ranks itself (torch.multiprocessing.spawn / start_processes, one per GPU it "
        "sees): phantora runs it once, on a host of --nproc GPUs, and each process it starts is a rank",
    )
    p.add_argument("--trace", choices=("ops", "coarse", "none"), default="ops", help="compute detail in trace.json")
    p.add_argument(
        "--trace-steps",
        type=int,
        default=None,  # DEFAULT_TRACE_STEPS unless given: given with --trace none, it is refused (trace_steps)
        metavar="N",
        help=f"compute ops in trace.json for the first N steps, then only the steps and collectives (default "
        f"{DEFAULT_TRACE_STEPS}; 0: every step)",
    )
    p.add_argument("--launch-overhead", default="1us", help="per-kernel launch overhead (default 1us)")
    p.add_argument(
        "--collective-model",
        choices=("nccl", "ideal"),
        default="nccl",
        help="collectives as NCCL runs them (default; NCCL_* variables honoured) or ideal (line rate, no latency)",
    )
    add_granularity_option(p)
    p.add_argument(
        "--compute-model",
        choices=("calibrated", "roofline"),
        default="calibrated",
        help="GPU op times: calibrated efficiency curves (default) or the plain roofline",
    )
    p.add_argument(
        "--perf-table",
        action="append",
        default=[],
        metavar="CSV",
        help="measured op table (phantora profile / perfdb CSV) whose entries take priority; repeatable",
    )
    p.add_argument("--curves", default=None, metavar="JSON", help="curves from `phantora calibrate --out`")
    p.add_argument(
        "--no-public-fit",
        action="store_true",
        help="time every op class with the L40S-shaped curves, not the public per-GPU fit (docs/validation.md)",
    )
    p.add_argument(
        "--tensors",
        choices=("auto", "real", "phantom"),
        default="auto",
        help="real: real CPU tensors, collectives move real data; phantom: meta tensors, no data, no host "
        "memory (large models); auto (default): phantom above 16 ranks",
    )
    p.add_argument("--phantom", dest="tensors", action="store_const", const="phantom", help="same as --tensors phantom")
    p.add_argument(
        "--memory-check",
        action="store_true",
        help="before a real-mode run, run one step in phantom mode to estimate the host memory the ranks need; say "
        "in one line whether it fits the memory available, and with --tensors auto run phantom if not",
    )
    p.add_argument(
        "--dedup",
        default="auto",
        metavar="auto|off|K",
        help="rank deduplication (phantom only): K live processes stand for all ranks, rank r mirrored by "
        "live rank r mod K; auto (default): 8 (a DGX host's GPUs) when 8 divides the ranks; off: one process per rank",
    )
    p.add_argument(
        "--storage",
        type=float,
        default=None,
        metavar="GBPS",
        help="checkpoint storage: each host writes and reads checkpoints at GBPS GB/s, shared by its ranks; "
        "torch.save/load, safetensors and DCP files then cost simulated time (default: not charged; docs/runtime.md)",
    )
    p.add_argument(
        "--shared-fs",
        type=float,
        default=None,
        metavar="GBPS",
        help="with --storage: a shared filesystem of GBPS GB/s aggregate, shared by every rank of the job",
    )
    p.add_argument("--no-time-patch", action="store_true", help="keep time.perf_counter/time.time real")
    p.add_argument(
        "--no-sim-cuda",
        action="store_true",
        help="no simulated CUDA device: torch.cuda is unavailable, as in the CPU build (default: scripts "
        "written for CUDA + NCCL run unchanged on simulated GPUs)",
    )
    p.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start every rank as a fresh interpreter (default: fork them from one that has imported torch)",
    )
    p.add_argument(
        "--program-seed",
        default=str(DEFAULT_PROGRAM_SEED),
        metavar="S|random",
        help=f"seed the generators a program does not seed itself (torch's CPU generator, random, numpy; "
        f"PYTHONHASHSEED) from S and each rank, so runs repeat (default {DEFAULT_PROGRAM_SEED}; the program's own "
        'seeding wins); random: as the interpreter seeds them, runs differ (docs/runtime.md "Reproducibility")',
    )
    p.add_argument("--timeout", type=float, default=None, help="stop the run after this many wall seconds")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="end the script after N training steps, as if it had exited there (a script whose loop runs longer "
        "than the steps you need; with --jobs: each job's `steps`)",
    )
    p.add_argument("--record", default=None, metavar="DIR", help="also record every rank's execution graph here")
    add_progress_options(p, quiet_also=" nor rank 0's output")
    p.add_argument("--jobs", default=None, metavar="TOML", help="several jobs on one fabric, from a job spec file")
    p.add_argument(
        "--alone",
        action="store_true",
        help="--jobs: also run each job by itself (same GPUs and engine) and report its slowdown",
    )
    p.add_argument("script", nargs="?", default=None, help="training script (not with --jobs)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the script")
    add_seed_options(p)
    p.set_defaults(func=with_seeds("run", run))


def run(args: argparse.Namespace) -> int:
    from phantora.errors import InputError
    from phantora.launcher import RunConfig, launch
    from phantora.netsim.factory import PARTITION_REFUSALS, refuse_partition
    from phantora.results.summary import format_summary

    if args.jobs is not None and (args.script or args.script_args):
        raise InputError("give a script or --jobs, not both (a job's script and arguments go in the spec)")
    if args.jobs is None and not args.script:
        raise InputError("a training script is needed (or --jobs FILE)", field="script")
    if args.placement is not None and args.jobs is not None:
        raise InputError("with --jobs, each job's `placement` in the spec places it", field="--placement")
    if args.alone and args.jobs is None:
        raise InputError("--alone goes with --jobs", field="alone")
    if args.spawn and (args.jobs is not None or args.record):
        raise InputError("--spawn runs one program that starts its own ranks: not with --jobs or --record")
    if args.jobs is not None and args.record:
        raise InputError("--record records one job; record each job with its own phantora run", field="record")
    check_rank_env()
    seed = parse_program_seed(args.program_seed)
    engine = engine_spec(args)
    if engine.packet_used is not None:
        refuse_partition(engine.packet_used, PARTITION_REFUSALS["run" if args.jobs is None else "jobs"])
    check_run_scenario(args)
    env = storage_env(args.storage, args.shared_fs)
    net = network_line(args, engine)
    cfg = RunConfig(
        script=args.script or "",
        args=list(args.script_args),
        topology=args.topology,
        engine=engine,
        gpu=args.gpu,
        out_dir=args.out,
        overwrite=args.overwrite,
        nproc=args.nproc,
        placement=args.placement,
        spawn=args.spawn,
        trace=args.trace,
        trace_steps=trace_steps(args),
        max_steps=max_steps(args),
        time_patch=not args.no_time_patch,
        launch_ns=parse_time_ns(args.launch_overhead),
        compute_model=args.compute_model,
        collective_model=args.collective_model,
        granularity=args.granularity,
        perf_tables=list(args.perf_table),
        curves=args.curves,
        public_fit=not args.no_public_fit,
        tensors=args.tensors,
        sim_cuda=not args.no_sim_cuda,
        dedup=args.dedup,
        timeout_s=args.timeout,
        fork_server=not args.no_fork_server,
        program_seed=seed,
        env=env,
        command=["phantora", *sys.argv[1:]],
        on_step=None
        if progress_mode(args) == "off"
        else step_printer(
            every_step=bool(args.progress) or sys.stdout.isatty(), before=None if net is None else net.clear
        ),
        on_network=None if net is None else net.show,
    )
    if args.jobs is not None:
        return run_jobs(args, cfg, net)
    if args.memory_check:
        cfg = memory_checked(cfg)
    try:
        if args.record:
            from phantora.egraph.live import record_run

            report, graph = record_run(cfg, args.record)
        else:
            report = launch(cfg)
    finally:
        if net is not None:
            net.clear()
    if args.record:
        print(f"recorded an execution graph of {graph.world} ranks in {args.record} (phantora replay {args.record})")
    if report.out_dir is not None and "scenario" in report.summary:
        from phantora.report.scenario_plot import plot_scenario_steps

        plot_scenario_steps(report.out_dir, report.summary["scenario"])
    if not args.quiet:
        log = report.logs.get("rank 0", "")
        if log.strip():
            print("----- rank 0 output -----")
            print(log.rstrip())
            print("-------------------------")
    s = report.summary
    r = s["run"]
    print(f"{r['script']} on {r['topology']}, network {r['network']}, wall {r['wall_s']:.1f} s{cpu_text(r)}")
    print(format_summary(s))
    if report.out_dir is not None:
        print(f"wrote {report.out_dir}: " + ", ".join(RunDir(report.out_dir).contents()))
    else:
        print("nothing saved: pass --out DIR to keep results.json, steps, the trace and the logs")
    sys.stdout.flush()
    return 0


def cpu_text(run: dict[str, Any]) -> str:
    """The summary's CPU part from results.json's `run.cpu_s`: the coordinator's, the ranks' and, where it ran in
    its own process (the packet network), the network server's."""
    cpu = run.get("cpu_s") or {}
    text = f", CPU {cpu['coordinator']:.1f} s coordinator" if "coordinator" in cpu else ""
    text += f", {cpu['ranks']:.1f} s ranks" if "ranks" in cpu else ""
    return text + (f", {cpu['server']:.1f} s network server" if cpu.get("server") else "")


def max_steps(args: argparse.Namespace) -> int | None:
    """`--max-steps`: None unless given; InputError for a count under 1 and with --jobs (a job's is its `steps`)."""
    from phantora.errors import InputError

    if args.max_steps is None:
        return None
    if args.jobs is not None:
        raise InputError("with --jobs, each job's `steps` in the spec ends it", field="--max-steps")
    if args.max_steps < 1:
        raise InputError(f"{args.max_steps}: give a step count of 1 or more", field="--max-steps")
    return int(args.max_steps)


def trace_steps(args: argparse.Namespace) -> int:
    """`--trace-steps` (DEFAULT_TRACE_STEPS unless given); InputError when given with `--trace none`, which traces no
    compute op for it to cap (the user meant one or the other)."""
    from phantora.errors import InputError

    if args.trace_steps is None:
        return DEFAULT_TRACE_STEPS
    if args.trace == "none":
        raise InputError(
            f"{args.trace_steps} caps the compute ops in trace.json, which --trace none leaves out: "
            "give one or the other",
            field="--trace-steps",
        )
    return int(args.trace_steps)


def check_rank_env() -> None:
    """The ranks' switches read before the ranks start (PHANTORA_NCCL_HOST_LAUNCH, PHANTORA_GLOO_COST), so a bad
    value is one line from the launcher, not a rank's failure mid-run (or never, for a gloo cost in a run without
    gloo groups)."""
    from phantora.runtime import gloo_cost, nccl_launch

    nccl_launch.enabled()
    gloo_cost.model()


def memory_checked(cfg: Any) -> Any:
    """`--memory-check`: the run's config after the check (phantora.memcheck), its one line printed."""
    from phantora.launcher import resolve_topology
    from phantora.memcheck import checked

    world = cfg.nproc if cfg.nproc is not None else resolve_topology(cfg.topology).num_ranks
    cfg, line = checked(cfg, world)
    if line is not None:
        print(line, flush=True)
    return cfg


def engine_spec(args: argparse.Namespace) -> EngineSpec:
    """The run's engine, built once from its command line (--network, --cc, --set, --queue-sample-ns, --seed,
    --window, --scenario) and checked here, before any process starts; the bridge carries it whole."""
    window = None if args.window is None else parse_time_ns(args.window)
    return engine_spec_from_args(args, window_ns=window, scenario=args.scenario)


def storage_env(gbps: float | None, shared_gbps: float | None) -> dict[str, str]:
    """The ranks' environment for `--storage` / `--shared-fs` (phantora.runtime.storage reads it)."""
    from phantora.errors import InputError

    if shared_gbps is not None and gbps is None:
        raise InputError("--shared-fs goes with --storage (the per-host bandwidth)", field="shared_fs")
    for flag, value in (("storage", gbps), ("shared_fs", shared_gbps)):
        if value is not None and not value > 0:
            raise InputError(
                f"--{flag.replace('_', '-')} must be a positive bandwidth in GB/s, got {value}", field=flag
            )
    env = {} if gbps is None else {"PHANTORA_STORAGE_GBPS": repr(gbps)}
    if shared_gbps is not None:
        env["PHANTORA_SHARED_FS_GBPS"] = repr(shared_gbps)
    return env


def run_jobs(args: argparse.Namespace, cfg: Any, net: NetworkLine | None = None) -> int:
    """`--jobs`: run them, print the jobs table; exit 1 if a job failed. `net`: the network's line (`network_line`)."""
    import dataclasses

    from phantora.jobs.run import format_jobs, launch_jobs
    from phantora.jobs.spec import load_jobs

    spec = load_jobs(args.jobs)
    every = bool(args.progress) or sys.stdout.isatty()
    show = None if progress_mode(args) == "off" else step_printer(every, before=None if net is None else net.clear)
    on_step = None if show is None else (lambda job, line: show({**line, "job": job}))
    from phantora.launcher import jobs_algo

    try:
        report = launch_jobs(
            spec, dataclasses.replace(cfg, on_step=None), alone=args.alone, on_step=on_step, algo=jobs_algo(cfg)
        )
    finally:
        if net is not None:
            net.clear()
    print(format_jobs(report.summary))
    if report.out_dir is not None:
        print(f"wrote {report.out_dir}: " + ", ".join(RunDir(report.out_dir).contents()) + " (jobs/<name>/ per job)")
    else:
        print("nothing saved: pass --out DIR to keep the results, traces and logs")
    sys.stdout.flush()
    return 1 if any(j["status"] != "complete" for j in report.summary["jobs"]) else 0


def network_line(args: argparse.Namespace, engine: EngineSpec) -> NetworkLine | None:
    """The packet network's progress from inside its long calls, on stderr (`phantora.progress.NetworkLine`: a
    status line on a terminal, else a line every few seconds); None with the flow engine or no progress."""
    mode = progress_mode(args)
    return None if mode == "off" or engine.network != "ns3" else NetworkLine(mode)


def step_printer(
    every_step: bool, every_s: float = 5.0, before: Callable[[], None] | None = None
) -> Callable[[dict[str, Any]], None]:
    """Progress: a line per finished step (`every_step`: a terminal, or --progress); otherwise (a log file, a
    pipe) at most one per `every_s` seconds, so a long run's log stays short. `before`: called before a line is
    printed (the network's status line taken off the terminal)."""
    t0 = time.monotonic()
    last = [float("-inf")]

    def show(line: dict[str, Any]) -> None:
        now = time.monotonic()
        if not every_step and now - last[0] < every_s:
            return
        last[0] = now
        if before is not None:
            before()
        who = f"job {line['job']} " if "job" in line else ""
        print(
            f"[phantora] {who}step {line['step']} done: {line['time_ns'] / 1e6:.3f} ms "
            f"(simulated time {line['end_ns'] / 1e6:.3f} ms, wall {now - t0:.1f} s)",
            flush=True,
        )

    return show
