"""`launch`: run a training script as N simulated ranks through the co-simulation bridge.

It starts the coordinator, the network (flow engine in the coordinator, or an ns-3 server) and
one `python -m phantora.runtime.bootstrap SCRIPT ARGS` per rank, then aggregates the ranks'
results into results.json and merges their traces into trace.json.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantora.collectives.nccl import nccl_env, summarize_choices
from phantora.collectives.spec import AlgoOptions
from phantora.errors import InputError
from phantora.netsim.engine_spec import EngineSpec
from phantora.perfmodel.gpus import get_gpu
from phantora.progress import Beat
from phantora.rank_options import (
    COMPUTE_MODELS,
    DEFAULT_LAUNCH_NS,
    DEFAULT_PROGRAM_SEED,
    DEFAULT_TRACE_STEPS,
    RANDOM_SEED,
    Options,
    check_trace_level,
    check_trace_steps,
    import_time_env,
    parse_program_seed,
)
from phantora.resources import examples_dir, shipped_file
from phantora.results import provenance
from phantora.results import schema as S
from phantora.results.run_dir import RunDir, nccl_args
from phantora.results.summary import summarize, write_results
from phantora.spawn_count import declared_nprocs
from phantora.topology.model import Topology
from phantora.topology.placement import place_run


@dataclass
class RunConfig:
    """Everything `phantora run` takes."""

    script: str
    args: list[str] = field(default_factory=list)
    topology: str | Path | Topology = "testbed16"
    # the network engine, whole: mode, PacketConfig (CC, --set fields, seed, queue sampling), window W, scenario
    # (`cli_config.engine_spec_from_flags` builds it from a command line; the flow network by default)
    engine: EngineSpec = field(default_factory=EngineSpec)
    gpu: str | None = None  # default: the topology's GPU model, else h100
    out_dir: str | Path | None = None
    overwrite: bool = False  # out_dir may hold an earlier run: remove what it wrote (otherwise refused)
    nproc: int | None = None  # default: every rank of the topology
    placement: str | None = None  # the ranks' GPUs: packed, spread, random or a GPU list (None: GPUs 0..nproc-1)
    trace: str = "ops"
    trace_steps: int = DEFAULT_TRACE_STEPS  # compute ops in trace.json for the first N steps (0: all)
    max_steps: int | None = None  # end the script after this many steps (--max-steps; None: when it ends)
    time_patch: bool = True
    launch_ns: int = DEFAULT_LAUNCH_NS
    compute_model: str = COMPUTE_MODELS[0]  # "calibrated" or "roofline"
    collective_model: str = "nccl"  # "nccl" (NCCL's choice, protocol, latency, throughput) or "ideal" (line rate)
    granularity: str = "coarse"  # the collectives' flows: "coarse" or "chunked" (NCCL's steps; AlgoOptions)
    perf_tables: list[str | Path] = field(default_factory=list)  # measured tables, priority over the model
    curves: str | Path | None = None  # `phantora calibrate --out` file; None: the shipped curves
    public_fit: bool = True  # False: no public per-GPU fit (the L40S-shaped curves time every class)
    tensors: str = "auto"  # "real", "phantom" (meta tensors), "auto": phantom above PHANTOM_ABOVE ranks
    dedup: str | int = "auto"  # live processes: "auto" (phantom: one host's GPUs), "off", or a number
    timeout_s: float | None = None
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    wrapper: str | None = None  # a script each rank runs instead, with the training script and its args as argv
    spawn: bool = False  # the script starts its ranks itself (mp.spawn): run it once, on one host of `nproc` GPUs
    sim_cuda: bool = True  # the simulated CUDA device: CUDA + NCCL scripts run unchanged (runtime/simcuda)
    fork_server: bool = True  # fork ranks from one interpreter that has imported RANK_PRELOAD (bridge/forkserver.py)
    # seeds the generators of a program that does not seed them (runtime/program_seed.py), "random": none seeded
    program_seed: int | str = DEFAULT_PROGRAM_SEED
    command: list[str] | None = None  # the command line that asked for the run (recorded in config.json)
    rerun_of: dict[str, Any] | None = None  # `phantora rerun`: the run it repeats (provenance.rerun_origin)
    on_step: Callable[[dict[str, Any]], None] | None = None  # told of each step all live ranks finished
    on_network: Callable[[Beat], None] | None = None  # told the network's progress inside long engine calls


@dataclass
class RunReport:
    """What a run produced."""

    summary: dict[str, Any]  # the content of results.json
    logs: dict[str, str]  # "rank 0", "coordinator", ... -> log text
    out_dir: Path | None
    cosim: Any  # bridge.run.CosimResult


def resolve_topology(spec: str | Path | Topology, gpu: str | None = None, prog: str = "phantora") -> Topology:
    """The run's topology: `spec` loaded (a Topology is taken as is), with `gpu` (the run's --gpu) as its GPU model,
    so that NCCL's tuning follows the GPU that runs (phantora.run_gpu; a given Topology is copied, not changed)."""
    from phantora.run_gpu import apply_gpu

    if isinstance(spec, Topology):
        topo = copy.copy(spec) if gpu is not None else spec
    else:
        from phantora.topology.loader import load_topology

        topo = load_topology(spec)
    apply_gpu(topo, gpu, prog)
    return topo


# What a rank imports before the user's script runs (torch._dynamo: DDP and FSDP2 load it), and
# the parallelism wrappers most scripts use: the fork server imports these once for all ranks.
RANK_PRELOAD = (
    "phantora.runtime.simcuda.preload",  # before torch: the simulated CUDA device's C++ part
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    # what every rank then imported itself, 30 ms of CPU each: the compute model's modules, and numpy.ma, which numpy
    # loads when the model first calls np.unique
    "numpy.ma",
    "phantora.perfmodel.model",
    "phantora.perfmodel.torch_adapter",
    "phantora.perfmodel.public",
    "phantora.perfmodel.pubfit",
    "phantora.runtime.backend_name",
    "phantora.runtime.simcuda.sdp_choice",
    # the fork server freezes the objects of the preloads above (none loads triton): see bridge/forkserver.py
    "torch._dynamo",
    "phantora.runtime.bootstrap",
    "phantora.runtime.dispatch",
    "phantora.runtime.autostep",
    "bridge.client",
)


def config_options(cfg: RunConfig, skip: tuple[str, ...]) -> dict[str, Any]:
    """config.json's "options" of a run: every field of `cfg` but `skip`, the engine as its plain data
    (`EngineSpec.to_dict`; `phantora rerun` reads it back with `EngineSpec.from_dict`)."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in skip}
    out.pop("on_network", None)  # (a display, not an option)
    out["engine"] = cfg.engine.to_dict()
    return out


def run_algo(cfg: RunConfig) -> AlgoOptions:
    """The collective options of a run's ranks (what the bridge decomposes with, and a recording replays with):
    its collective model and granularity, and its engine's NIC latency (`AlgoOptions.on_engine`); InputError on a
    bad value."""
    return AlgoOptions(model=cfg.collective_model, granularity=cfg.granularity).on_engine(cfg.engine)


def jobs_algo(cfg: RunConfig) -> AlgoOptions | None:
    """Several jobs (`phantora run --jobs`): `run_algo` for every job if the run sets a collective option off its
    default, else None (each job's defaults; a recorded graph's, those it was recorded with)."""
    given = (cfg.collective_model, cfg.granularity) != (RunConfig.collective_model, RunConfig.granularity)
    return run_algo(cfg) if given else None


def run_cc(engine: EngineSpec) -> str | None:
    """results.json's "cc": the packet engine's congestion control (None on the flow network, which has none)."""
    return engine.packet.cc if engine.network == "ns3" else None


FLOWS_CSV_MAX_RANKS = 256  # per-flow records (flows.csv) for jobs up to this many ranks
AUTO_LIVE = 8  # --dedup auto: live processes (ranks r and r mod 8 run alike)
PHANTOM_ABOVE = 16  # auto: more ranks than this run phantom (a live real-tensor rank costs ~330 MB of host)


def plan_processes(cfg: RunConfig, topo: Topology) -> tuple[bool, int, int]:
    """(phantom, world, live): the tensor mode and how many live processes stand for how many ranks.

    Deduplication needs phantom mode (mirrored ranks move no data). "auto" runs 8 live processes (a DGX
    host's GPUs), which keeps tensor-parallel groups of up to 8 live, whatever GPUs a host of the topology has;
    it is off when the job has 8 ranks or fewer or a rank count that 8 does not divide.
    """
    world = (host_gpus(topo) if cfg.spawn else topo.num_ranks) if cfg.nproc is None else cfg.nproc
    if cfg.spawn:
        asked = declared_nprocs(cfg.script) if cfg.nproc is None else None  # the program's own mp.spawn count
        world = world if asked is None else asked[0]
        source = f"the program's mp.spawn(nprocs={asked[0]}) at {asked[1]}" if asked else "--nproc"
        check_spawn(cfg, topo, world, source)
    if cfg.tensors not in ("auto", "real", "phantom"):
        raise InputError(f"must be auto, real or phantom, got {cfg.tensors!r}", field="tensors")
    phantom = cfg.tensors == "phantom" or (cfg.tensors == "auto" and world > PHANTOM_ABOVE)
    if cfg.dedup in ("off", None, 0):
        return phantom, world, world
    if cfg.dedup == "auto":
        if not phantom:
            return phantom, world, world
        live = min(AUTO_LIVE, world)  # (not a host's GPUs: a program whose ranks differ across hosts keeps them)
        return phantom, world, live if world % live == 0 else world
    try:
        live = int(cfg.dedup)
    except (TypeError, ValueError):
        raise InputError(f"must be auto, off or a number of live processes, got {cfg.dedup!r}", field="dedup") from None
    if not phantom and live < world:
        raise InputError("rank deduplication needs phantom tensors (--tensors phantom)", field="dedup")
    if not 1 <= live <= world or world % live:
        raise InputError(f"{live} live processes must divide the {world} ranks", field="dedup")
    return phantom, world, live


def host_gpus(topo: Topology) -> int:
    """The GPUs of the host of rank 0 (every rank if the topology names no hosts)."""
    host = topo.nodes[topo.node_of_rank(0)].host
    if host is None:
        return topo.num_ranks
    return sum(1 for r in range(topo.num_ranks) if topo.nodes[topo.node_of_rank(r)].host == host)


def check_spawn(cfg: RunConfig, topo: Topology, world: int, source: str = "--nproc") -> None:
    """`--spawn` runs the program once, on one host whose GPUs are its ranks: refuse what that cannot be. `source`:
    where the count `world` came from (--nproc, or the program's own mp.spawn call)."""
    per_host = host_gpus(topo)
    if not 1 <= world <= per_host:
        raise InputError(
            f"--spawn runs the program on one host, and {topo.name}'s hosts have {per_host} GPUs: "
            f"{source} must be 1 to {per_host}, got {world} (a program that starts ranks on several hosts is not "
            "simulated; one process per rank, torchrun style, runs without --spawn)",
            field="nproc",
        )
    if cfg.dedup not in ("auto", "off", None, 0, world, str(world)):
        raise InputError("--spawn runs every rank the program starts live: no --dedup", field="dedup")
    if cfg.wrapper:
        raise InputError("--spawn runs the program itself, not a wrapper", field="wrapper")


def compute_model_options(cfg: RunConfig) -> tuple[str, tuple[str, ...], str | None]:
    """Check the compute model, its tables and curves file here (InputError naming the file), before
    any rank starts; return them with absolute paths for the ranks."""
    if cfg.compute_model not in COMPUTE_MODELS:
        raise InputError(
            f"must be one of {', '.join(COMPUTE_MODELS)}, got {cfg.compute_model!r}", field="compute_model"
        )
    if cfg.compute_model != "calibrated" and (cfg.perf_tables or cfg.curves):
        raise InputError("--perf-table and --curves need --compute-model calibrated", field="compute_model")
    from phantora.perfmodel.model import load_inputs

    load_inputs(cfg.perf_tables, cfg.curves)
    tables = tuple(str(Path(p).resolve()) for p in cfg.perf_tables)
    return cfg.compute_model, tables, str(Path(cfg.curves).resolve()) if cfg.curves else None


def input_files(cfg: RunConfig, script: Path | None) -> dict[str, str | Path | None]:
    """The files a run reads, by option (config.json records them by content): the script, the wrapper, the
    measured tables and the curves (shipped names that are not paths are versioned with phantora)."""
    files: dict[str, str | Path | None] = {"script": script, "--wrapper": cfg.wrapper, "--curves": cfg.curves}
    files.update({f"--perf-table {i}": t for i, t in enumerate(cfg.perf_tables)})
    return files


def rank_options(cfg: RunConfig, gpu: str, out: Path, model_opts: tuple[str, tuple[str, ...], str | None],
                 phantom: bool) -> Options:  # fmt: skip
    """What a rank of the run is told (phantora.rank_options) of its GPU, compute model, tensors, trace and output
    directory: the one place for a single run and for each job of several (phantora.jobs.run adds its own)."""
    opts = Options(gpu=gpu, launch_ns=cfg.launch_ns, trace=cfg.trace, out_dir=str(out), time_patch=cfg.time_patch)
    opts.trace_steps = cfg.trace_steps
    opts.max_steps = cfg.max_steps
    opts.compute_model, opts.perf_tables, opts.curves = model_opts
    opts.public_fit = cfg.public_fit
    opts.phantom = phantom
    opts.sim_cuda = cfg.sim_cuda
    opts.program_seed = parse_program_seed(cfg.program_seed)
    if opts.program_seed != RANDOM_SEED and "PYTHONHASHSEED" not in {**os.environ, **cfg.env}:
        opts.hash_seed = str(opts.program_seed)  # the rank interpreters' str hashes (set order), unless given
    packet = cfg.engine.packet_used
    if packet is not None:  # how the ranks mark their collectives (traffic class, DLCP loss tolerance)
        opts.priority, opts.dlcp, opts.dlcp_bound = packet.priority, packet.dlcp, float(packet.dlcp_bound)
    return opts


def _idle_fabric(cfg: RunConfig, topo: Topology, traffic: dict[str, int]) -> dict[str, Any]:
    """{"idle_fabric": ...} for a packet-level run whose traffic left the switches (almost) idle, else {}."""
    from phantora.results.idle import given_settings, idle_fabric_on

    if cfg.engine.network != "ns3":
        return {}
    idle = idle_fabric_on(topo, traffic, *given_settings(cfg.engine.packet))
    return {"idle_fabric": idle} if idle else {}


def engine_warnings(out: Path, told: list[str]) -> dict[str, Any]:
    """{"warnings": [...]}: the packet engine's (e.g. a switch without a shared buffer), `told` when it was built
    (`CosimResult.warnings`), else from the run's engine.json (workers' engines tell theirs there); else {}."""
    from phantora.results.read import read_document

    warnings = told or (read_document(out, S.ENGINE_JSON) or {}).get("warnings")
    return {"warnings": list(warnings)} if warnings else {}


def _scenario_section(cfg: RunConfig, topo: Topology, cosim: Any, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """results.json's "scenario" of a live run (phantora.results.scenario_live)."""
    from phantora.netsim.scenario import read_scenario
    from phantora.results.scenario_live import live_section

    assert cfg.engine.scenario is not None
    sc = read_scenario(cfg.engine.scenario)
    return live_section(sc, topo, cosim.scenario, cosim.ranks, steps, cosim.engine_stats)


def _steps_for_engine(cfg: RunConfig) -> bool:
    """The scenario has network events at a step: the engine must hear of steps, so it runs in the coordinator
    (a network server would not; ns-3 there pauses the coordinator's heartbeats during long engine calls)."""
    if not cfg.engine.scenario:
        return False
    from phantora.netsim.scenario import read_scenario

    return any(ev.at_step is not None for ev in read_scenario(cfg.engine.scenario).network())


def _trace_notes(cfg: RunConfig, steps: int) -> dict[str, Any]:
    """trace.json's note when `--trace-steps` left the later steps' compute ops out."""
    if not 0 < cfg.trace_steps < steps or cfg.trace == "none":
        return {}
    return {
        "ops_traced_steps": cfg.trace_steps,
        "note": f"compute ops of the first {cfg.trace_steps} steps only; "
        "the later steps hold their step and collective spans (phantora run --trace-steps N, 0: every step)",
    }


def scenario_trace_events(section: dict[str, Any]) -> list[dict[str, Any]]:
    from phantora.results.scenario_live import trace_events

    return trace_events(section)


def launch(cfg: RunConfig) -> RunReport:
    """Run the script; raise BridgeError (a PhantoraError) naming the cause if any process fails."""
    from bridge.run import CosimRun

    script = shipped_file(cfg.script, examples_dir(), (".py",))
    if not script.is_file():
        raise InputError("training script not found", file=str(cfg.script))
    check_trace_level(cfg.trace)
    check_trace_steps(cfg.trace_steps)
    parse_program_seed(cfg.program_seed)
    algo = run_algo(cfg)  # checked before anything is written
    topo = resolve_topology(cfg.topology, cfg.gpu, "phantora run")
    if cfg.placement is not None:
        if cfg.spawn:
            raise InputError("--spawn runs the program on the GPUs of one host: no --placement", field="--placement")
        topo, placed = place_run(topo, cfg.placement, cfg.nproc)
        cfg = dataclasses.replace(cfg, nproc=placed)
    gpu_name = topo.gpu_model or "h100"
    gpu = get_gpu(gpu_name)
    engine = cfg.engine
    packet = engine.packet_used
    if engine.ecmp_hash:
        topo.use_ecmp(engine.ecmp_hash)  # the engine's processes get it with the topology; flows.csv's paths follow it
    model_opts = compute_model_options(cfg)
    phantom, world, live = plan_processes(cfg, topo)
    keep = cfg.out_dir is not None
    if cfg.out_dir is not None:
        rd = RunDir.claim(cfg.out_dir, overwrite=cfg.overwrite)
        out = rd.root
        rd.running(script=str(cfg.script), args=list(cfg.args), world_size=world, live=live)
        options = config_options(cfg, ("command", "python", "on_step", "rerun_of"))
        provenance.write_config(out, options=options, topo=topo, packet=packet, command=cfg.command,
                                inputs=input_files(cfg, script), rerun_of=cfg.rerun_of,
                                env={**os.environ, **cfg.env})  # fmt: skip
    else:
        from bridge.transport import make_run_dir

        out = make_run_dir()  # private, removed at the end (or by a later run, if this launcher is killed)
        rd = RunDir(out)
    opts = rank_options(cfg, gpu_name, out, model_opts, phantom)
    opts.scenario = str(Path(engine.scenario).resolve()) if engine.scenario else None  # slow GPUs, step reports
    rank_env = opts.to_env()
    if "host" in topo.meta and "PHANTORA_HOST" not in {**os.environ, **cfg.env}:  # the topology's hosts, unless given
        rank_env["PHANTORA_HOST"] = str(topo.meta["host"])
    wrap = [str(Path(cfg.wrapper).resolve())] if cfg.wrapper else []
    entry = "phantora.runtime.spawned" if cfg.spawn else "phantora.runtime.bootstrap"
    cmd = [cfg.python, "-m", entry, *wrap, str(script.resolve()), *cfg.args]
    watcher = rd.step_watcher(live, cfg.on_step) if cfg.on_step is not None else None
    try:
        cosim = CosimRun(
            topo,
            engine,
            rank_cmd=None if cfg.spawn else cmd,
            spawner_cmd=cmd if cfg.spawn else None,
            world_size=world,
            live_ranks=live,
            env={**import_time_env(rank_env), **cfg.env},  # the fork server's too
            rank_env=rank_env,
            algo=algo,
            out_dir=out if keep else None,
            timeout_s=cfg.timeout_s,
            # flows.csv for `phantora compare` when results are written; a larger job's per-flow
            # records run to millions of rows, so it keeps the engine's totals only
            keep_flows=keep and world <= FLOWS_CSV_MAX_RANKS,
            rank_preload=RANK_PRELOAD if cfg.fork_server else (),
            engine_in_coordinator=True if _steps_for_engine(cfg) else None,
            on_progress=cfg.on_network,
        ).run()
    except BaseException as exc:  # a failed run (or ^C) says so, and keeps the steps that finished
        if watcher is not None:
            watcher.stop()
        if keep:
            steps = rd.merge_steps(range(live))
            trace = rd.merge_trace(partial=True, notes=_trace_notes(cfg, len(steps)))
            traced = {"trace": f"partial: {trace.name} holds the steps each rank finished"} if trace else {}
            rd.failed(exc, steps_finished=len(steps), **traced)
        else:
            shutil.rmtree(out, ignore_errors=True)
        raise
    if watcher is not None:
        watcher.stop()
    try:
        from phantora.results.write import flows_csv_count

        summary = summarize(cosim.ranks, gpu)
        summary = {
            "run": {
                "script": str(cfg.script),
                "args": list(cfg.args),
                "topology": topo.name,
                "network": cosim.network,
                "cc": run_cc(engine),
                "window_ns": cosim.window_ns,
                "gpu": gpu_name,
                "launch_ns": cfg.launch_ns,
                "compute_model": cfg.compute_model,
                "collective_model": cfg.collective_model,
                "granularity": cfg.granularity,
                "perf_tables": [str(p) for p in cfg.perf_tables],
                "curves": str(cfg.curves) if cfg.curves else None,
                "tensors": "phantom" if phantom else "real",
                "world_size": world,
                "live_processes": live,
                "program_seed": parse_program_seed(cfg.program_seed),
                "wall_s": cosim.wall_s,
                "cpu_s": {k: round(v, 3) for k, v in cosim.cpu_s.items()},  # the run phase's, by process kind
            },
            **summary,
            "network": {
                "makespan_ns": cosim.makespan_ns,
                "rounds": cosim.rounds,
                "messages": cosim.messages,
                "late_collectives": cosim.late_collectives,
                "rejected_messages": cosim.rejected_messages,
                "ecmp_hash": topo.ecmp_hash,
                "engine_stats": cosim.engine_stats,
                **({"flows_note": cosim.flows_note} if cosim.flows_note else {}),
                # flows.csv's rows and the zero-byte flows it leaves out (docs/results.md "What flows.csv lists")
                **({"flows_csv": flows_csv_count(cosim.completions)} if keep and cosim.completions else {}),
                **({"traffic_bytes": cosim.traffic_bytes} if cosim.traffic_bytes else {}),
                **_idle_fabric(cfg, topo, cosim.traffic_bytes),
                **engine_warnings(out, cosim.warnings),
            },
            "nccl": summarize_choices(cosim.collectives, nccl_env({**os.environ, **cfg.env})),
        }
        steps = rd.merge_steps(range(live)) if keep else []
        extra_trace: list[dict[str, Any]] = []
        if engine.scenario:
            summary["scenario"] = _scenario_section(cfg, topo, cosim, steps)
            extra_trace = scenario_trace_events(summary["scenario"])
        if keep:
            write_results(rd.results, summary)
            notes = _trace_notes(cfg, len(steps))
            rd.merge_trace(comm_args=nccl_args(cosim.collectives), extra_events=extra_trace, notes=notes)
            rd.complete(steps_finished=len(steps), wall_s=cosim.wall_s)
        return RunReport(summary, cosim.logs, out if keep else None, cosim)
    except BaseException as exc:  # the run ended but its results could not be written
        if keep:
            rd.failed(exc)
        raise
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
