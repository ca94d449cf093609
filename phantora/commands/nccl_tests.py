"""`phantora nccl-tests TEST [nccl-tests flags] [--topology T]`: nccl-tests on a simulated topology.

TEST is one of all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, broadcast_perf,
reduce_perf, sendrecv_perf, gather_perf, scatter_perf, hypercube_perf. The flags are nccl-tests' own: -b/-e
sizes (K, M, G suffixes: powers of 1024), -f
step factor or -i step increment, -t threads and -g GPUs per thread, -d datatype (or all), -o reduction op
(printed only; or all), -n iterations, -w warm-up iterations, -m calls per iteration (one NCCL group), -N cycles,
-r root (-1: every root), -c check (#wrong 0, or N/A with -c 0), -z blocking, -G CUDA graph, -C CPU time, -S
timestamps, -J JSON file, -I / -K per-iteration timing, -M memory line, -u unaligned buffers, -R registration and
-x CTA policy (as NCCL runs them); -a, -p, -y, -T and -V are accepted and change no time; -D (nccl-tests' device API
kernels) is refused. --np N stands for `mpirun -np N` (ranks = np x t x g); by default every GPU of the topology is one
process (-g 1), and -g alone is one process. Each size is timed as nccl-tests times it: -w warm-up calls of every
size first, then -n calls back to back on one engine, the mean per call, with one host thread launching its -g
GPUs' calls one after another (a few µs each, which bound small sizes under -g 8); the table on stdout is
nccl-tests' own, so it can be diffed with a cluster's output (docs/nccl-tests.md). --out DIR also writes the table
(nccl-tests.txt), results.json and the run's network files as `phantora replay` writes them: flows.csv (every flow
of every call, warm-ups included) and links.csv, and in packet mode the fabric's traces and engine.json.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phantora.commands.options import Parser, add_granularity_option, add_network_options
from phantora.commands.outdir import add_out_options, in_run_dir, record_config
from phantora.errors import InputError
from phantora.netsim.engine_spec import EngineSpec
from phantora.report import nccl_tests as nt
from phantora.report import nccl_tests_flags as nf
from phantora.report import nccl_tests_json as nj
from phantora.report import nccl_tests_split as ns
from phantora.report.nccl_tests_iters import iter_stats
from phantora.report.nccl_tests_memory import memory_line, user_allocated
from phantora.run_gpu import apply_gpu

DEFAULT_TOPOLOGY = "one DGX-like server of 8 GPUs, the shipped dgx8 (H100), with --gpu's own NVLink"


def unknown_argument(token: str, known: list[str]) -> str:
    """The one-line message for an argument the parser left over: an unknown option (with the nearest known one),
    or a stray value."""
    name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
    if name.startswith("-") and name != "-":
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        return f"unknown option {name}" + (f"; did you mean {near[0]}?" if near else " (phantora nccl-tests --help)")
    return f"unexpected argument {token!r}: the test is named once, before or after the options"


class NcclTestsParser(Parser):
    """The nccl-tests sub-parser: a bad value or an unknown option is one line, "phantora nccl-tests: error: ...",
    instead of argparse's usage block."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(unknown_argument(extras[0], list(self._option_string_actions)))
        return ns, extras

    def error(self, message: str) -> Any:
        self.exit(2, f"phantora nccl-tests: error: {message}\n")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "nccl-tests", help="run an nccl-tests benchmark on a simulated topology, printed as nccl-tests prints it",
        description=__doc__,
    )  # fmt: skip
    p.__class__ = NcclTestsParser  # add_parser builds the top-level parser's class; errors here are one line
    p.add_argument("test", metavar="TEST", help=f"the benchmark: {', '.join(nt.TESTS)}")
    p.add_argument("--topology", default=None, help=f"topology file or shipped name (default: {DEFAULT_TOPOLOGY})")
    p.add_argument(
        "--gpu",
        default=None,
        help="GPU model (a100, h100, h200, b200, ...): of the default server, or instead of the topology's own",
    )
    add_network_options(p)
    add_granularity_option(p)
    g = p.add_argument_group("nccl-tests flags")
    g.add_argument(
        "--np",
        type=int,
        default=None,
        help="processes, as `mpirun -np` launches them: ranks = --np x -t x -g (default: one per GPU with -g 1, "
        "or 1 when -g is given)",
    )
    g.add_argument("-t", "--nthreads", type=nf.c_int, default=1, help="threads per process (default 1)")
    g.add_argument(
        "-g",
        "--ngpus",
        type=nf.c_int,
        default=None,
        help="GPUs per thread; one thread launches its GPUs' calls one after another (default 1 under --np, else "
        "every GPU of the topology)",
    )
    g.add_argument("-b", "--minbytes", default="32M", help="smallest size, e.g. 8, 64K, 1M (default 32M)")
    g.add_argument("-e", "--maxbytes", default="32M", help="largest size, e.g. 8G (default 32M)")
    g.add_argument("-i", "--stepbytes", default=None, help="size increment (default 1M; not with -f)")
    g.add_argument("-f", "--stepfactor", type=nf.c_int, default=None, help="size multiplication factor (not with -i)")
    g.add_argument("-n", "--iters", type=nf.c_int, default=20, help="measured iterations per size (default 20)")
    g.add_argument(
        "-w", "--warmup_iters", type=nf.c_int, default=1, help="warm-up iterations per size, not measured (default 1)"
    )
    g.add_argument(
        "-d", "--datatype", default="float", help=f"datatype: {', '.join(nt.DATATYPES)}, or all (default float)"
    )
    g.add_argument(
        "-o", "--op", default="sum", help=f"reduction op, printed only: {', '.join(nt.REDOPS)}, or all (default sum)"
    )
    g.add_argument(
        "-r", "--root", type=nf.c_int, default=0, help="root rank of broadcast and reduce; -1: every rank (default 0)"
    )
    g.add_argument(
        "-m", "--agg_iters", type=nf.c_int, default=1, help="calls per iteration, in one NCCL group (default 1)"
    )
    g.add_argument("-N", "--run_cycles", type=nf.c_int, default=1, help="print the measured sizes this many times")
    g.add_argument(
        "-c",
        "--check",
        type=nf.c_int,
        default=1,
        help="#wrong is 0 (-c 1 or more: NCCL taken as correct) or N/A (-c 0)",
    )
    g.add_argument(
        "-z", "--blocking", type=nf.c_int, default=0, help="1, 2, 3: the host waits for each call before the next"
    )
    g.add_argument(
        "-G",
        "--cudagraph",
        type=nf.c_int,
        default=0,
        help="graph launches: the calls replay with no host launch between",
    )
    g.add_argument(
        "-a",
        "--average",
        type=nf.c_int,
        default=1,
        help="how the threads' times combine over the processes: 0 process 0's, 1 mean, 2 min, 3 max (these differ "
        "only between NCCL_TESTS_SPLIT's communicators), 4 sum",
    )
    nf.add_arguments(g)
    add_out_options(p, "the table (nccl-tests.txt), results.json, config.json, flows.csv and links.csv", short=False)
    p.set_defaults(func=_with_run_dir(run))


def _with_run_dir(body: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`in_run_dir` with --out; without it the table alone, and the note that nothing is saved on stderr (stdout
    holds only what nccl-tests prints)."""
    claimed = in_run_dir("nccl-tests", body)

    def run(args: argparse.Namespace) -> int:
        if args.out is not None:
            return claimed(args)
        rc = body(args)
        print("phantora nccl-tests: nothing saved: pass --out DIR to keep the table and results.json", file=sys.stderr)
        return rc

    return run


def _topology(spec: str | None, gpu: str | None = None) -> Any:
    """The topology to run on: `spec`, or one DGX-like server of 8 `gpu` (default H100); `gpu` replaces a loaded
    topology's GPU model (its link rates stay the file's)."""
    from phantora.perfmodel.gpus import get_gpu
    from phantora.topology import dgx_host, load_topology

    if gpu is not None:
        get_gpu(gpu.strip())  # an unknown name is refused (field 'gpu'), as `phantora run --gpu` refuses it
    if spec is None:
        return dgx_host(8, gpu=gpu or "h100")
    topo = load_topology(spec)
    apply_gpu(topo, gpu, "phantora nccl-tests")
    return topo


def engine_spec(args: argparse.Namespace) -> EngineSpec:
    """The engine, as `phantora replay` builds it: the flow network takes --set ecmp_hash and lb only; ns3 the CC
    and every PacketConfig field (queues are not sampled unless --set queue_sample_ns asks: no queues.csv)."""
    from phantora.netsim.cli_config import engine_spec_from_args

    return engine_spec_from_args(args, queue_sample_ns=0)


def _ranks(args: argparse.Namespace, topo: Any) -> tuple[int, ...]:
    """Ranks 0..np x t x g - 1. Without -g and --np, one process per GPU of the topology (mpirun's usual run);
    -g alone is one process driving its GPUs (the binary run without mpirun)."""
    for flag, value in (("-t", args.nthreads), ("--np", args.np), ("-g", args.ngpus)):
        if value is not None and value < 1:
            raise InputError(f"must be >= 1, got {value}", field=flag)
    # the flag a count too large is named by: -g where given, else --np, else -t (--np's default fits any -t)
    named = "-g" if args.ngpus is not None else "--np" if args.np is not None else "-t"
    if args.ngpus is None:
        args.ngpus = 1
        if args.np is None:
            args.np = max(1, topo.num_ranks // args.nthreads)
    elif args.np is None:
        args.np = 1
    n = args.np * args.nthreads * args.ngpus
    if n > topo.num_ranks:
        asked = f"--np {args.np} x -t {args.nthreads} x -g {args.ngpus} = {n} GPUs"
        raise InputError(f"{asked} asked for, but topology {topo.name!r} has {topo.num_ranks}", field=named)
    return tuple(range(n))


def run(args: argparse.Namespace) -> int:
    from bridge.workers import spawn_workers
    from phantora.netsim.factory import PARTITION_REFUSALS, make_engine, refuse_partition

    started = time.time()
    spec = nt.find_test(args.test)
    topo = _topology(args.topology, args.gpu)
    ranks = _ranks(args, topo)
    ns.check_average(args.average)
    for flag, value, low in (
        ("-n", args.iters, 1),
        ("-w", args.warmup_iters, 0),
        ("-m", args.agg_iters, 1),
        ("-N", args.run_cycles, 1),
        ("-c", args.check, 0),
        ("-G", args.cudagraph, 0),
    ):
        if value < low:
            raise InputError(f"must be >= {low}, got {value}", field=flag)
    if args.blocking not in (0, 1, 2, 3):
        raise InputError(f"must be 0, 1, 2 or 3, got {args.blocking}", field="-z")
    warnings: list[str] = []  # nccl-tests' own stderr lines for values it disables or resets
    flags = nf.harness_flags(args, iters=args.iters, graph=args.cudagraph, blocking=args.blocking,
                             nccl_version=nf.running_version_code(os.environ), warn=warnings)  # fmt: skip
    opts = nf.nccl_run_options(flags, args.granularity, args.agg_iters)
    minbytes, maxbytes = nt.parse_size(args.minbytes, "-b"), nt.parse_size(args.maxbytes, "-e")
    stepbytes = None if args.stepbytes is None else nt.parse_size(args.stepbytes, "-i")
    min_bw = nt.min_bw(os.environ)  # NCCL_TESTS_MIN_BW: read before anything runs
    reduced = []  # nccl-tests' "Reducing maxBytes" note, printed after the devices
    limit = nt.max_bytes_limit(topo, args.check)
    if limit is not None and maxbytes > limit:
        reduced = ["#", f"# Reducing maxBytes to {limit} due to memory limitation"]
    header_min, header_max = minbytes, maxbytes  # nccl-tests prints them before it reduces them
    if reduced:
        maxbytes = limit or maxbytes
        minbytes = min(minbytes, maxbytes)
    sizes = nt.size_steps(minbytes, maxbytes, args.stepfactor, stepbytes)
    types = nt.datatypes(args.datatype, nt.compute_capability(topo))
    nt.check_fp8(spec, types, nt.compute_capability(topo))
    split = _split(args, ranks, flags)
    comm = split.groups[0] if split is not None else ranks  # process 0's communicator: the one it prints
    if spec.kind == nt.HYPERCUBE:
        nt.check_hypercube(len(comm), args.agg_iters)
        if split is not None and len(split.groups) > 1:
            refused = f"hypercube_perf with {ns.MASK} / {ns.SPLIT}'s communicators is not modelled"
            raise InputError(refused, field="TEST")
    blocks = nt.runs(spec, types, nt.redops(args.op), args.root, len(comm))
    if split is not None and spec.rooted:
        ns.check_root(split, args.root)
    engine = engine_spec(args)
    opts = opts.on_engine(engine)  # its NIC latency netted out of NCCL's (`AlgoOptions.nic_latency_ns`)
    config = engine.packet_used
    if config is not None:
        refuse_partition(config, PARTITION_REFUSALS["nccl-tests"])
    record_config(args, "nccl-tests", topo, config, {})
    for line in warnings:
        print(line, file=sys.stderr)
    grow = args.stepfactor is not None and args.stepfactor > 1
    stepbytes = 1024**2 if stepbytes is None else stepbytes  # nccl-tests' default increment
    step = f"{args.stepfactor}(factor)" if grow else f"{stepbytes}(bytes)"
    cc = config.cc if config is not None else None
    lines: list[str] = []

    def emit(*new: str) -> None:
        for line in new:
            print(line, flush=True)
        lines.extend(new)

    json_path = _open_json(flags.output_file, emit)
    per_iter_skip = flags.per_iter_skip if flags.per_iter_timing else None
    emit(*nt.preamble(spec, nthreads=args.nthreads, ngpus=args.ngpus, minbytes=header_min, maxbytes=header_max,
                      step=step, warmup=args.warmup_iters, iters=args.iters, topo=topo, ranks=ranks,
                      network=args.network, cc=cc, check=args.check, agg=args.agg_iters, graph=args.cudagraph,
                      blocking=flags.blocking, unalign=flags.unalign, per_iter_skip=per_iter_skip,
                      parallel_init=flags.parallel_init, notes=_notes(flags) + ns.notes(split),
                      colors=split.colors if split is not None else None))  # fmt: skip
    emit(*reduced, *nt.table_header(flags.report_cputime, flags.report_timestamps, flags.per_iter_timing))
    traffic = nt.Traffic() if args.out is not None else None  # flows.csv and links.csv: kept only for --out
    benches = [
        nt.Bench(
            spec,
            topo,
            group,
            types[0],
            iters=args.iters,
            warmup=0,
            gpus_per_thread=args.ngpus,
            agg=args.agg_iters,
            blocking=flags.blocking > 0,
            graph=args.cudagraph > 0,
            opts=opts,
            traffic=traffic,
        )  # fmt: skip
        for group in (split.groups if split is not None else (ranks,))
    ]
    network_files: list[Path] = []
    results: list[tuple[nt.Run, nt.SizeResult]] = []
    records: list[dict[str, Any]] = []  # -J's results
    sim = make_engine(engine, topo, spawner=spawn_workers)
    try:
        for block in blocks:  # nccl-tests' TimeTest: warm every size up, then measure them (-N times)
            for bench in benches:
                bench.datatype, bench.root, bench.op = block.datatype, max(block.root, 0), block.op
            ns.warm_up(benches, sim, nt.warmup_sizes(minbytes, maxbytes), args.warmup_iters)
            for _cycle in range(args.run_cycles):
                for size in sizes:
                    procs = split.procs if split is not None else (args.np,)
                    res = ns.bench(benches, sim, size, procs, args.nthreads, args.average)
                    results.append((block, res))
                    note = nt.fallback_note(res.choice)
                    if note is not None and note not in lines:  # NCCL logs it once, as its search runs
                        emit(note)
                    # -S: the time the line would be printed, had the cluster run from the command's start
                    stamp = nj.time_string(started + sim.now() / 1e9) if flags.report_timestamps else None
                    emit(nt.size_line(res, spec, block.datatype, block.op, block.root, args.check,
                                      cputime=flags.report_cputime, per_iter_skip=per_iter_skip,
                                      timestamp=stamp))  # fmt: skip
                    if json_path is not None:
                        records.append(_json_result(res, spec, block, args.check, args.iters, flags, args.np))
        # the engine's counters go to results.json only (ns-3's take seconds to gather): none without --out
        stats = {k: v for k, v in sim.stats().items() if "wall" not in k} if args.out is not None else {}
        simulated_s = sim.now() / 1e9
        if traffic is not None:
            network_files = _network_files(args.out, topo, sim, traffic, engine)
    finally:
        sim.close()
    memory = None
    if flags.memory_report:
        memory = memory_line(user_allocated(spec.layout, spec.kind, maxbytes, len(comm), flags.unalign, args.check))
    emit(*nt.footer([r for _, r in results], spec, memory, min_bw))
    avg = nt.avg_busbw([r for _, r in results])
    if json_path is not None:
        okay: bool | str = "unchecked" if min_bw is None else nt.bw_passes(avg, min_bw)
        doc = _json_document(args, flags, topo, ranks, header_min, header_max, stepbytes, records, started,
                             started + simulated_s, avg, okay)  # fmt: skip
        json_path.write_text(nj.encode(doc), encoding="ascii")
    if args.out is not None:
        from phantora.collectives.nccl.settings import nccl_env

        data = _results(args, spec, topo, ranks, cc, stepbytes, results, stats, split)
        # the NCCL_* variables the model ran with (the environment's, and -R / -x's), as a live run's `nccl.env`
        data["nccl_env"] = dict(opts.nccl_env if opts.nccl_env is not None else nccl_env())
        if traffic is not None:  # flows.csv's rows and the zero-byte flows it leaves out: with them, every flow
            from phantora.results.write import flows_csv_count

            data["flows_csv"] = flows_csv_count(traffic.completions)
        paths = _write(args.out, lines, data) + network_files
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    if not nt.bw_passes(avg, min_bw):  # nccl-tests' main: TESTCHECK(result) prints, then returns testNumResults
        print(nt.check_failure_line(os.getpid()), flush=True)
        return nt.CHECK_FAILED_RC
    return 0


def _split(args: argparse.Namespace, ranks: tuple[int, ...], flags: nf.HarnessFlags) -> ns.Split | None:
    """NCCL_TESTS_SPLIT_MASK / NCCL_TESTS_SPLIT's communicators (None: one, the world). -I's per-process rows
    are refused with more than one: its report of a split run is not modelled."""
    colors = ns.split_colors(os.environ, args.np)
    if colors is None:
        return None
    split = ns.split_run(colors, ranks, args.nthreads * args.ngpus)
    if len(split.groups) > 1 and flags.per_iter_timing:
        raise InputError(f"-I with {ns.MASK} / {ns.SPLIT}'s communicators is not modelled", field="-I")
    return split


def _network_files(out: Path, topo: Any, sim: Any, traffic: nt.Traffic, engine: EngineSpec) -> list[Path]:
    """flows.csv and links.csv of the whole run (the links' use over its simulated time), and the packet engine's
    traces, by the writer every command uses (`results.write.write_network_files`)."""
    from phantora.results.write import write_network_files

    return write_network_files(
        Path(out), topo, sim, traffic.completions, elapsed_ns=sim.now(), flows=traffic.flows, spec=engine
    )


def _open_json(name: str | None, emit: Callable[..., None]) -> Path | None:
    """-J: create the file as nccl-tests does and print its line first (None: no -J, or a name nccl-tests writes
    nothing for, which stderr says)."""
    if name is None:
        return None
    if not nj.is_json_name(name):
        print(f"phantora nccl-tests: -J {name}: nothing written: nccl-tests writes only a .json file (its suffix "
              "names the type)", file=sys.stderr)  # fmt: skip
        return None
    path, line = nj.open_exclusive(name)
    emit(line)
    return path


def _notes(flags: nf.HarnessFlags) -> list[str]:
    """The "# phantora:" lines for flags whose effect on a cluster the simulation does not reproduce."""
    notes = []
    if flags.unalign:
        notes.append(f"-u {flags.unalign}: NCCL's choice is unchanged; its kernels copy unaligned buffers in "
                     "element-sized packs (common_kernel.h), not modelled: the times are aligned buffers'")  # fmt: skip
    if flags.memory_report:
        notes.append("-M: User-Allocated is the test's buffers; NCCL's own memory is not modelled (N/A)")
    if flags.report_cputime:
        notes.append("-C: cputime is the host's time in the launch loop per call (under -z 0 the launches alone)")
    return notes


def _argv(args: argparse.Namespace) -> list[str]:
    """-J's "args": the command line as typed."""
    return [str(a) for a in getattr(args, "command_line", None) or ["phantora", "nccl-tests", args.test]]


def _json_document(
    args: argparse.Namespace,
    flags: nf.HarnessFlags,
    topo: Any,
    ranks: tuple[int, ...],
    minbytes: int,
    maxbytes: int,
    stepbytes: int,
    records: list[dict[str, Any]],
    start: float,
    end: float,
    avg_busbw: float,
    avg_okay: bool | str = "unchecked",
) -> dict[str, Any]:
    """-J's document: under mpirun, "devices" holds each process's first GPU, as nccl-tests parses it; `avg_okay`
    the average's check (NCCL_TESTS_MIN_BW), "unchecked" without one."""
    devs = nt.devices(topo, ranks, args.nthreads, args.ngpus)[:: args.nthreads * args.ngpus]
    conf = nj.config(
        nthreads=args.nthreads, ngpus=args.ngpus, minbytes=minbytes, maxbytes=maxbytes, step_factor=args.stepfactor,
        step_bytes=stepbytes, warmup=args.warmup_iters, iters=args.iters, agg=args.agg_iters, check=args.check,
        graph=args.cudagraph, blocking=flags.blocking, per_iter=flags.per_iter_timing,
        per_iter_skip=flags.per_iter_skip, parallel_init=flags.parallel_init,
        devices=[nj.device(d.rank, 0, d.pid, d.host, d.device, d.node, d.name) for d in devs],
    )  # fmt: skip
    return nj.document(start=start, end=end, argv=_argv(args), nccl_version=nt.NCCL_VERSION_CODE, config_obj=conf,
                       results=records, avg_busbw=avg_busbw, avg_okay=avg_okay)  # fmt: skip


def _json_result(
    res: nt.SizeResult,
    spec: nt.BenchSpec,
    block: nt.Run,
    check: int,
    iters: int,
    flags: nf.HarnessFlags,
    processes: int,
) -> dict[str, Any]:
    """One table line as -J writes it."""
    shown_op = block.op if spec.has_op else "none"
    shown_root = block.root if spec.rooted else -1
    groups: list[tuple[str, dict[str, Any]]] = []
    for key, r in (("out_of_place", res), ("in_place", res.in_place())):
        time_us, algbw, busbw = nt.group_figures(r, flags.report_cputime)
        groups.append((key, nj.body(time_us, algbw, busbw, 0.0 if check else None, flags.report_cputime)))
        if flags.per_iter_timing:
            times = r.iter_us()
            groups.append((f"{key}_per_iter", nj.per_iter(iter_stats(times[flags.per_iter_skip :]), times,
                                                          flags.per_iter_skip, processes)))  # fmt: skip
    return nj.result(res.size, res.count, block.datatype, shown_op, shown_root, groups, iters)


def _results(
    args: argparse.Namespace,
    spec: nt.BenchSpec,
    topo: Any,
    ranks: tuple[int, ...],
    cc: str | None,
    stepbytes: int,
    results: list[tuple[nt.Run, nt.SizeResult]],
    stats: dict[str, Any],
    split: ns.Split | None = None,
) -> dict[str, Any]:
    """results.json: the run's parameters and one record per table line (times in us and ns, bandwidths in GB/s,
    the line's datatype, op and root, the NCCL model's choice)."""
    from phantora.results import schema as S

    return {
        "schema": S.NCCL_TESTS,
        "test": spec.name,
        "collective": spec.kind,
        "topology": topo.summary(),
        "network": args.network,
        "granularity": args.granularity,
        "cc": cc,
        "ranks": len(ranks),
        "np": args.np,
        "nthreads": args.nthreads,
        "ngpus": args.ngpus,
        "datatype": args.datatype if args.datatype == "all" else nt.datatype(args.datatype),
        "redop": args.op if spec.has_op else None,
        "root": args.root if spec.rooted else None,
        "iters": args.iters,
        "warmup_iters": args.warmup_iters,
        "agg_iters": args.agg_iters,
        "run_cycles": args.run_cycles,
        "check": args.check,
        "blocking": args.blocking,
        "cudagraph": args.cudagraph,
        **({"step_factor": args.stepfactor} if (args.stepfactor or 1) > 1 else {"step_bytes": stepbytes}),
        "units": {"time_us": "us", "time_ns": "ns", "algbw": "GB/s (1e9 bytes/s)", "busbw": "GB/s (1e9 bytes/s)"},
        "sizes": [
            {
                "datatype": b.datatype,
                "redop": b.op,
                "root": b.root,
                "bytes": r.size,
                "count": r.count,
                "nbytes": r.nbytes,
                "time_us": r.time_us,
                "time_ns": r.time_ns,
                "iter_ns": r.iter_ns,
                "algbw": r.algbw,
                "busbw": r.busbw,
                "busbw_factor": r.factor,
                "choice": r.choice,
                **({"inplace_time_us": r.in_place().time_us} if r.inplace_ns is not None else {}),
                **({"communicator_time_us": [t / 1e3 for t in r.comm_ns]} if r.comm_ns is not None else {}),
            }
            for b, r in results
        ],
        "avg_busbw": nt.avg_busbw([r for _, r in results]),
        **({"split": ns.describe(split, args.average)} if split is not None else {}),
        "engine": stats,
    }


def _write(out: Path, lines: list[str], data: dict[str, Any]) -> list[Path]:
    from phantora.results import schema as S
    from phantora.results.run_dir import RunDir

    rd = RunDir(out)
    return [
        rd.write_text(S.NCCL_TESTS_TXT, "\n".join(lines) + "\n"),
        rd.write_json(S.RESULTS_JSON, data, indent=1, sort_keys=False),
    ]
