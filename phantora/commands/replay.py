"""`phantora replay INPUT --topology T`: time a workload, a recorded execution graph or a profiler trace.

`phantora replay --jobs jobs.toml --topology T`: several workloads and graphs, each on its own GPUs, on one
fabric (docs/jobs.md).

INPUT is a workload file (.toml/.json, docs/workload.md), an execution-graph directory written by
`phantora run --record DIR` (docs/egraph.md), or PyTorch profiler (Kineto) Chrome-trace JSON: one file,
or a directory with one file per rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from bridge.cut_pool import run_partitioned_batches
from bridge.cut_stepped_start import spawn_stepped
from bridge.workers import spawn_workers
from phantora.collectives.spec import ALGORITHMS, MODELS, PROTOCOLS, AlgoOptions
from phantora.commands.options import add_granularity_option, add_network_options, add_progress_options, progress_mode
from phantora.commands.outdir import add_out_options, in_run_dir, record_config
from phantora.commands.scenario_option import add_scenario_option, install_throttles, load_scenario, report_scenario
from phantora.commands.seeds import add_seed_options, with_seeds
from phantora.errors import InputError
from phantora.netsim.cli_config import QUEUE_SAMPLE_HELP
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.standalone import flow_alone
from phantora.units import parse_size_bytes

FORMATS = ("auto", "workload", "egraph", "kineto")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay", help="replay a workload, a recorded graph or a profiler trace on a topology", description=__doc__
    )
    p.add_argument(
        "workload",
        metavar="INPUT",
        nargs="?",
        default=None,
        help="workload file, graph directory, or Kineto trace file/directory (not with --jobs)",
    )
    p.add_argument("--jobs", default=None, metavar="TOML", help="several workloads/graphs on one fabric (docs/jobs.md)")
    p.add_argument("--alone", action="store_true", help="--jobs: also replay each job by itself; report slowdowns")
    p.add_argument("--topology", "-t", required=True, help="topology file or shipped name (e.g. testbed16)")
    add_network_options(p)
    p.add_argument("--queue-sample-ns", type=int, default=None, metavar="N", help=QUEUE_SAMPLE_HELP)
    add_scenario_option(p)
    p.add_argument("--format", choices=FORMATS, default="auto", help="what INPUT is (default: detect)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default=None, help="default collective algorithm (auto)")
    p.add_argument("--protocol", choices=PROTOCOLS, default=None, help="NCCL protocol (auto: NCCL's choice)")
    p.add_argument(
        "--collective-model",
        choices=MODELS,
        default=None,
        help="nccl (default: NCCL's algorithm, protocol, latency and throughput; NCCL_* variables honoured) or "
        "ideal (line rate, no latency)",
    )
    add_granularity_option(p, default=None)
    p.add_argument("--channels", type=int, default=None, help="rings per collective (0 = NCCL-like default)")
    p.add_argument("--chunk", default=None, help="chunk size of the chunked granularity (default 2MiB)")
    p.add_argument("--scale-dp", type=int, default=None, metavar="N", help="graphs: re-target DDP/FSDP to N ranks")
    p.add_argument("--gaps", choices=("keep", "drop"), default="keep", help="Kineto: keep or drop unexplained idle")
    p.add_argument(
        "--replicate-rank",
        type=int,
        default=None,
        metavar="R",
        help="Kineto: the trace of rank R stands for every rank of the world its distributedInfo records "
        "(SPMD: all ranks run the same kernels and collectives); for traces that hold one rank",
    )
    p.add_argument("--save-graph", type=Path, default=None, help="write the (imported or scaled) graph here")
    p.add_argument("--export-chakra", type=Path, default=None, help="also write the graph as Chakra ET files here")
    add_out_options(p, "results.json, flows.csv and links.csv")
    add_progress_options(p)
    add_seed_options(p)
    p.set_defaults(func=with_seeds("replay", in_run_dir("replay", run)))


def _detect(path: Path, fmt: str) -> str:
    from phantora.egraph.format import is_graph_dir
    from phantora.egraph.kineto import looks_like_kineto

    if fmt != "auto":
        return fmt
    if is_graph_dir(path):
        return "egraph"
    if path.is_dir() or path.suffix == ".gz" or (path.suffix == ".json" and looks_like_kineto(path)):
        return "kineto"
    return "workload"


def _algo(args: argparse.Namespace, base: AlgoOptions) -> AlgoOptions:
    """`base` with every option the user gave explicitly."""
    given: dict[str, Any] = {}
    if args.algorithm is not None:
        given["algorithm"] = args.algorithm
    if args.granularity is not None:
        given["granularity"] = args.granularity
    if args.protocol is not None:
        given["protocol"] = args.protocol
    if args.collective_model is not None:
        given["model"] = args.collective_model
    if args.channels is not None:
        given["channels"] = args.channels
    if args.chunk is not None:
        given["chunk_bytes"] = parse_size_bytes(args.chunk)
    return dataclasses.replace(base, **given)


def engine_spec(args: argparse.Namespace) -> EngineSpec:
    """The replay's engine from its options (the flow network takes --set ecmp_hash and lb only)."""
    from phantora.netsim.cli_config import engine_spec_from_args

    return engine_spec_from_args(args)


def run(args: argparse.Namespace) -> int:
    from phantora.resources import shipped_file, workloads_dir
    from phantora.topology import load_topology

    if (args.jobs is None) == (args.workload is None):
        raise InputError("give one INPUT or --jobs FILE", field="INPUT")
    if args.alone and args.jobs is None:
        raise InputError("--alone goes with --jobs", field="alone")
    if args.jobs is not None:
        return _run_jobs(args)
    topo = load_topology(args.topology)
    args.workload = str(shipped_file(args.workload, workloads_dir(), (".toml", ".json")))
    kind = _detect(Path(args.workload), args.format)
    if args.replicate_rank is not None and kind != "kineto":
        raise InputError(f"applies to Kineto traces only, and INPUT is {kind}", field="--replicate-rank")
    engine = engine_spec(args)
    source = Path(args.workload)
    if kind == "egraph" and source.is_file():  # its graph.json: the graph is the directory
        source = source.parent
    record_config(args, "replay", topo, engine.packet_used, {"INPUT": source, "--scenario": args.scenario})
    if kind == "workload":
        return _run_workload(args, topo, engine)
    return _run_graph(args, topo, engine, kind)


def _run_jobs(args: argparse.Namespace) -> int:
    """--jobs: every job a workload or a graph, replayed together on one engine (under --scenario, as one INPUT
    is: its network events and background traffic; phantora.jobs.scenario refuses what names a job's rank)."""
    from phantora.jobs.run import format_jobs, launch_jobs
    from phantora.jobs.spec import load_jobs
    from phantora.launcher import RunConfig
    from phantora.netsim.cli_config import engine_spec_from_args

    given = [k for k in ("scale_dp", "save_graph", "export_chakra") if getattr(args, k)]
    if given or args.format != "auto":
        from phantora.errors import InputError

        raise InputError("applies to one INPUT, not to --jobs", field=given[0] if given else "format")
    spec = load_jobs(args.jobs)
    cfg = RunConfig(
        script="",
        topology=args.topology,
        engine=engine_spec_from_args(args, scenario=args.scenario),  # either network's engine runs the scenario
        out_dir=args.out,
        overwrite=True,
        trace="none",  # args.out: claimed by in_run_dir
        command=["phantora", *sys.argv[1:]],
    )
    algo = (
        _algo(args, AlgoOptions())
        if any(
            getattr(args, k) is not None
            for k in ("algorithm", "granularity", "channels", "chunk", "protocol", "collective_model")
        )
        else None
    )
    report = launch_jobs(spec, cfg, alone=args.alone, algo=algo, live_ok=False)
    print(format_jobs(report.summary))
    if report.out_dir is not None:
        print(f"wrote {report.out_dir}/results.json, links_by_job.csv, trace.json and jobs/<name>/ per job")
    return 0


def _whole_dag_engine(engine: EngineSpec, topo: Any, sc: Any) -> Any:
    """The engine of a replay, which submits its whole DAG and drains it (factory.WHOLE_DAG_DRIVER), with the
    bridge's worker spawners."""
    return make_engine(
        engine,
        topo,
        spawner=spawn_workers,
        scenario=sc,
        partitioner=run_partitioned_batches,
        stepper=spawn_stepped,
        whole_dag=True,
    )


def workload_engine(engine: EngineSpec, topo: Any, sc: Any) -> Any:
    """A workload replay's engine, its scenario's GPU throttles installed (also `phantora netsim --flows WORKLOAD`'s
    runs that rate its NCCL groups)."""
    sim = _whole_dag_engine(engine, topo, sc)
    install_throttles(sim, sc, topo, engine.network)
    return sim


def _run_workload(args: argparse.Namespace, topo: Any, engine: EngineSpec) -> int:
    from phantora.replay import replay_settled
    from phantora.report.replay_report import format_table, write_replay_outputs
    from phantora.workload import load_workload

    wl = load_workload(args.workload, world=topo.num_ranks)
    bad = wl.max_rank
    if bad >= topo.num_ranks:
        topo.node_of_rank(bad)  # raises the clear "rank outside the topology" error
    base = _algo(args, AlgoOptions()).on_engine(engine)
    sc = load_scenario(args, topo)
    res, sim = replay_settled(wl, topo, lambda: workload_engine(engine, topo, sc), base, progress=progress_mode(args))
    try:
        print(f"workload {wl.name} on {topo.name} ({topo.num_ranks} ranks), network {args.network}")
        print(format_table(res))
        idle = _idle_note(args, topo, res.completions)
        spans = [(r.start_ns, r.end_ns) for r in res.ops]
        section = report_scenario(
            sc, topo, sim, spans, res.completions, args.out, "ops", alone=flow_alone(res.flows) if sc else None
        )
        if args.out:
            extra = {**({"scenario": section} if section else {}), **idle}
            paths = write_replay_outputs(
                args.out,
                res,
                workload=wl.name,
                topology=topo,
                network=args.network,
                engine=sim,
                extra=extra or None,
                spec=engine,
            )
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    finally:
        sim.close()
    return 0


def _idle_note(args: argparse.Namespace, topo: Any, completions: Any) -> dict[str, Any]:
    """Packet mode: print the idle-fabric note and return {"idle_fabric": ...} for results.json ({} if the
    traffic reached the switches, or on the flow network)."""
    from phantora.results.idle import idle_fabric_on, traffic_of

    if args.network != "ns3":
        return {}
    idle = idle_fabric_on(topo, traffic_of(topo, completions), args.cc, list(args.set))
    if idle is None:
        return {}
    print(f"note: {idle['text']}")
    return {"idle_fabric": idle}


def _run_graph(args: argparse.Namespace, topo: Any, engine: EngineSpec, kind: str) -> int:
    from phantora.egraph.format import load, save
    from phantora.egraph.replay import algo_from_meta, replay_graph_settled
    from phantora.egraph.report import format_graph_result, graph_results
    from phantora.results import schema as S
    from phantora.results.run_dir import RunDir
    from phantora.results.write import write_network_files

    notes: list[str] = []
    if kind == "kineto":
        from phantora.egraph.kineto import import_kineto, trace_files

        graph, rep = import_kineto(trace_files(args.workload), gaps=args.gaps, replicate_rank=args.replicate_rank)
        what = (
            f"imported {rep.ranks} rank trace(s)"
            if rep.replicated_from is None
            else f"imported the trace of rank {rep.replicated_from}, replicated to {rep.ranks} ranks; per rank"
        )
        notes.append(
            f"{what}: {rep.kernels} kernels, {rep.collectives} collectives, "
            f"{rep.transfers} transfers, {rep.sync_deps} cross-stream waits from cuda_sync events, "
            f"{rep.nccl_issue_deps} inferred NCCL issue dependencies, {rep.idle_ns / 1e6:.3f} ms idle kept"
        )
        notes += [f"  - {n}" for n in rep.notes]
    else:
        graph = load(args.workload)
    if args.scale_dp:
        from phantora.egraph.scale import scale_dp

        graph, srep = scale_dp(graph, args.scale_dp)
        notes += srep.lines()
    if args.save_graph:
        save(graph, args.save_graph)
        notes.append(f"wrote graph {args.save_graph}")
    if args.export_chakra:
        from phantora.egraph.chakra import export_chakra

        paths = export_chakra(graph, args.export_chakra)
        notes.append(f"wrote {len(paths) - 1} Chakra ET files and {paths[-1].name} in {args.export_chakra}")
    algo = _algo(args, algo_from_meta(graph)).on_engine(engine)
    sc = load_scenario(args, topo, steps=True)  # events at a step boundary: as the graph's steps start
    network_files: list[Path] = []
    res, sim = replay_graph_settled(
        graph, topo, lambda: workload_engine(engine, topo, sc), algo, progress=progress_mode(args), scenario=sc
    )
    try:
        spans = [(e - t, e) for e, t in zip(res.step_ends_ns, res.step_times_ns, strict=True)]
        alone = flow_alone(res.plan_flows) if sc else None
        section = report_scenario(sc, topo, sim, spans, res.completions, args.out, "steps", res.steps_started, alone)
        if args.out:
            flows = {f.id: f for f in res.plan_flows}
            network_files = write_network_files(
                args.out, topo, sim, res.completions, elapsed_ns=res.makespan_ns, flows=flows, spec=engine
            )
    finally:
        sim.close()
    print(f"execution graph ({graph.world} ranks, {len(graph.programs)} distinct programs) on {topo.name}, "
          f"network {args.network}")  # fmt: skip
    for line in notes:
        print(line)
    print(format_graph_result(res, graph))
    idle = _idle_note(args, topo, res.completions)
    if args.out:
        data = graph_results(res, graph, topology=topo.name, network=args.network, cc=args.cc)
        if section:
            data["scenario"] = section
        data.update(idle)
        path = RunDir(args.out).write_json(S.RESULTS_JSON, data, indent=1)
        print("wrote " + ", ".join(str(p) for p in [path, *network_files]))
    return 0
