"""`launch`: run a training script as N simulated ranks through the co-simulation bridge.

It starts the coordinator, the network (flow engine in the coordinator, or an ns-3 server) and
one `python -m phantora.runtime.bootstrap SCRIPT ARGS` per rank, then aggregates the ranks'
results into results.json and merges their traces into trace.json.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.runtime.gpus import get_gpu
from phantora.runtime.options import DEFAULT_LAUNCH_NS, Options
from phantora.runtime.results import summarize, write_results
from phantora.runtime.trace import LEVELS, merge_traces
from phantora.topology.model import Topology


@dataclass
class RunConfig:
    """Everything `phantora run` takes."""

    script: str
    args: list[str] = field(default_factory=list)
    topology: str | Path | Topology = "testbed16"
    network: str = "flow"
    cc: str | None = None  # ns3 congestion control
    gpu: str | None = None  # default: the topology's GPU model, else h100
    window_ns: int | None = None  # None: the bridge's default for the network mode
    out_dir: str | Path | None = None
    nproc: int | None = None  # default: every rank of the topology
    trace: str = "ops"
    time_patch: bool = True
    launch_ns: int = DEFAULT_LAUNCH_NS
    timeout_s: float | None = None
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunReport:
    """What a run produced."""

    summary: dict[str, Any]  # the content of results.json
    logs: dict[str, str]  # "rank 0", "coordinator", ... -> log text
    out_dir: Path | None
    cosim: Any  # bridge.run.CosimResult


def _topology(spec: str | Path | Topology) -> Topology:
    if isinstance(spec, Topology):
        return spec
    from phantora.topology.loader import load_topology

    return load_topology(spec)


def launch(cfg: RunConfig) -> RunReport:
    """Run the script; raise BridgeError (a PhantoraError) naming the cause if any process fails."""
    from bridge.run import CosimRun

    script = Path(cfg.script)
    if not script.is_file():
        raise InputError("training script not found", file=str(cfg.script))
    if cfg.trace not in LEVELS:
        raise InputError(f"trace level must be one of {', '.join(LEVELS)}, got {cfg.trace!r}", field="trace")
    topo = _topology(cfg.topology)
    gpu_name = cfg.gpu or topo.gpu_model or "h100"
    gpu = get_gpu(gpu_name)
    if cfg.cc and cfg.network != "ns3":
        raise InputError("--cc applies to --network ns3 only", field="cc")
    keep = cfg.out_dir is not None
    out = Path(cfg.out_dir) if keep else Path(tempfile.mkdtemp(prefix="phantora-run-"))
    out.mkdir(parents=True, exist_ok=True)
    opts = Options(gpu=gpu_name, launch_ns=cfg.launch_ns, trace=cfg.trace, out_dir=str(out), time_patch=cfg.time_patch)
    env = {**opts.to_env(), **cfg.env}
    cmd = [cfg.python, "-m", "phantora.runtime.bootstrap", str(script.resolve()), *cfg.args]
    try:
        cosim = CosimRun(
            topo,
            rank_cmd=cmd,
            network=cfg.network,
            world_size=cfg.nproc,
            window_ns=cfg.window_ns,
            engine_options={"cc": cfg.cc} if cfg.cc else None,
            env=env,
            out_dir=out if keep else None,
            timeout_s=cfg.timeout_s,
            keep_flows=keep,  # flows.csv for `phantora compare` when results are written
        ).run()
        summary = summarize(cosim.ranks, gpu)
        summary = {
            "run": {
                "script": str(cfg.script),
                "args": list(cfg.args),
                "topology": topo.name,
                "network": cosim.network,
                "cc": cfg.cc,
                "window_ns": cosim.window_ns,
                "gpu": gpu_name,
                "launch_ns": cfg.launch_ns,
                "wall_s": cosim.wall_s,
            },
            **summary,
            "network": {
                "makespan_ns": cosim.makespan_ns,
                "rounds": cosim.rounds,
                "messages": cosim.messages,
                "late_collectives": cosim.late_collectives,
                "engine_stats": cosim.engine_stats,
            },
        }
        parts = sorted((out / "trace").glob("rank*.trace.json"), key=lambda p: int(p.name[4:].split(".")[0]))
        if keep:
            write_results(out / "results.json", summary)
            if parts:
                merge_traces(parts, out / "trace.json")
                shutil.rmtree(out / "trace")
        return RunReport(summary, cosim.logs, out if keep else None, cosim)
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
