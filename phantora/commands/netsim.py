"""`phantora netsim --topology T --flows F`: run flows on the packet (ns-3) or flow network.

F is an HPCC flow file, or a workload file of the replay format (.toml/.json, docs/workload.md), which
is decomposed into one static flow DAG as `phantora replay` does. The type is told by the suffix
(.toml, .json: workload; anything else is looked at: a first line holding just the flow count is HPCC).
The network is the flow engine unless `--network ns3` asks for packets (as on every command).

Writes the run directory's files (docs/compare-and-sweep.md): flows.csv (FCT and standalone FCT as HPCC
defines them: to the sender's last ACK), links.csv, pfc.csv, queues.csv, drops.csv, cnps.csv,
ecn_marks.csv and summary.json, and HPCC's own fct.txt and pfc.txt, to --out. Switch queues are sampled
every 1 us by default (--queue-sample-ns 0: off). `--network flow` runs the same input through the
flow-level engine for comparison (its FCT is the last byte's arrival; it has no ACKs, PFC, ECN or queues,
so it writes flows.csv, links.csv, fct.txt and summary.json only).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phantora.commands.options import add_network_options, add_progress_options, progress_mode
from phantora.commands.outdir import add_out_options, in_run_dir, record_config
from phantora.commands.scenario_option import add_scenario_option, install_throttles, load_scenario, report_scenario
from phantora.commands.seeds import add_seed_options, with_seeds
from phantora.errors import InputError
from phantora.files import read_text
from phantora.netsim.base import Flow, NetworkSimulator, drain_observed
from phantora.netsim.cli_config import QUEUE_SAMPLE_HELP, engine_spec_from_args
from phantora.netsim.effective import EffectiveSettings
from phantora.netsim.engine_spec import FLOW_FIELDS, EngineSpec
from phantora.netsim.engine_warnings import Tell, fabric_warnings, tell, to_stderr, warning_line
from phantora.netsim.factory import make_engine
from phantora.netsim.hpcc_io import FctLine, read_hpcc_flows, write_fct_txt, write_pfc_txt
from phantora.netsim.standalone import Alone, flow_alone, standalone_fct_ns
from phantora.progress import Progress
from phantora.results import schema as S
from phantora.results.run_dir import RunDir
from phantora.results.write import (
    per_flow_counts,
    write_cnps_csv,
    write_drops_csv,
    write_ecn_csv,
    write_engine_json,
    write_flows_csv,
    write_links_csv,
    write_pfc_csv,
    write_queues_csv,
)
from phantora.topology.model import Topology

WORKLOAD_SUFFIXES = (".toml", ".json")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "netsim", help="run an HPCC flow file or a workload on the ns-3 or flow network", description=__doc__
    )
    p.add_argument("--topology", "-t", required=True, help="topology file (HPCC, SimAI, TOML) or shipped name")
    p.add_argument("--flows", "-f", required=True, help="HPCC flow file, or workload file (.toml/.json)")
    add_network_options(p)
    p.add_argument("--config", "-c", default=None, help="HPCC config.txt (phantora PacketConfig fields also allowed)")
    p.add_argument("--queue-sample-ns", type=int, default=None, metavar="N", help=QUEUE_SAMPLE_HELP)
    add_scenario_option(p)
    add_out_options(p, "flows.csv, links.csv, the traces and summary.json")
    add_progress_options(p)
    add_seed_options(p)
    p.set_defaults(func=with_seeds("netsim", in_run_dir("netsim", run)))


@dataclass
class NetsimInput:
    """The flows of a run, from either input format."""

    fmt: str  # "hpcc" or "workload"
    name: str
    batches: list[tuple[int, list[Flow]]]  # (submit time ns, flows), in time order
    dports: dict[int, int]  # HPCC destination port per flow id (fct.txt label); default 100
    hidden: frozenset[int]  # workload marker flows: run by the engine, left out of the outputs
    ops: int = 0
    path: Path | None = None  # the file read

    @property
    def flows(self) -> list[Flow]:
        return [f for _, batch in self.batches for f in batch]

    @property
    def reported(self) -> list[Flow]:
        return [f for f in self.flows if f.id not in self.hidden]

    @property
    def first_start(self) -> int:
        return self.batches[0][0] if self.batches else 0


def detect_flows_format(path: Path) -> str:
    """'workload' or 'hpcc': by suffix (.toml, .json), else by content (HPCC starts with the flow count)."""
    if path.suffix.lower() in WORKLOAD_SUFFIXES:
        return "workload"
    text = read_text(path, "flow file")
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            if len(words) == 1 and words[0].isdigit():
                return "hpcc"
            break
    if text.lstrip().startswith("{"):
        return "workload"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return "hpcc"  # its reader explains what is wrong
    return "workload" if data else "hpcc"


def _load_workload(path: Path, topo: Topology) -> Any:
    from phantora.workload import workload_from_dict

    suffix = path.suffix.lower()
    text = read_text(path, "workload file")
    as_json = suffix == ".json" or (suffix != ".toml" and text.lstrip().startswith("{"))
    try:
        data = json.loads(text) if as_json else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot parse: {exc}", file=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("a workload is a table of ops (docs/workload.md)", file=str(path))
    wl = workload_from_dict(data, topo.num_ranks, str(path))
    if wl.max_rank >= topo.num_ranks:
        topo.node_of_rank(wl.max_rank)  # raises the clear "rank outside the topology" error
    return wl


def read_netsim_input(
    path: str | Path, topo: Topology, make: Callable[[], NetworkSimulator] | None = None
) -> NetsimInput:
    """Read an HPCC flow file or a workload (decomposed into one flow DAG submitted at t = 0). A workload's NCCL groups
    of transfers (`splits`) are first rated, each pair from its own start, by runs on engines from `make`
    (`replay.settle_groups`, as `phantora replay` rates them); without `make`, all from one start."""
    from phantora.resources import shipped_file, workloads_dir

    p = shipped_file(path, workloads_dir(), (".flows.txt", ".toml"))
    if not p.exists():
        raise InputError(f"no such flow file, and not a shipped workload (shipped: {workloads_dir()})", file=str(p))
    if detect_flows_format(p) == "hpcc":
        hpcc = read_hpcc_flows(p, topo)
        batches: dict[int, list[Flow]] = {}
        for f in hpcc:
            batches.setdefault(f.start_ns, []).append(f.to_flow())
        dports = {f.index: f.dport for f in hpcc}
        return NetsimInput("hpcc", p.stem, list(batches.items()), dports, frozenset(), path=p)
    from phantora.replay import plan_workload, settle_groups
    from phantora.replay_groups import grouped_ops

    wl = _load_workload(p, topo)
    if make is not None and grouped_ops(wl):
        _, sim, wl = settle_groups(wl, topo, make)
        sim.close()
    plan = plan_workload(wl, topo)
    real = {i for ids in plan.op_flows.values() for i in ids}
    hidden = frozenset(f.id for f in plan.flows if f.id not in real)
    return NetsimInput("workload", wl.name, [(0, plan.flows)], {}, hidden, len(wl.ops), path=p)


def engine_spec(args: argparse.Namespace) -> EngineSpec:
    """The run's engine from its options, every default filled in. The flow network runs at the packet config's
    goodput (payload / (payload + header)), so it takes the packet and header sizes and --config too."""
    flow_fields = (*FLOW_FIELDS, "payload_bytes", "header_bytes")
    return engine_spec_from_args(args, config_file=args.config, flow_fields=flow_fields, flow_goodput=True)


def _drain(sim: Any, inp: NetsimInput, progress: str, done: dict[int, Any] | None = None) -> list[Any]:
    """`sim.drain()`, with flows done, simulated time, events/s and an ETA shown (the same events run);
    `done`: the flows that completed already."""
    if progress == "off":
        return list(sim.drain())
    done = done or {}
    with Progress(progress, "netsim", len(inp.flows), "flow") as bar:
        bar.update(len(done))

        from phantora.replay import beating, engine_events

        def tick(got: list[Any]) -> None:
            bar.update(add=len(got), sim_ns=sim.now(), events=engine_events(sim) if bar.shows_extras() else None)

        with beating(sim, bar):
            return drain_observed(sim, [f.id for f in inp.flows if f.id not in done], tick)


def _run_ns3(
    topo: Topology,
    inp: NetsimInput,
    engine: EngineSpec,
    out: Path | None,
    progress: str = "off",
    scenario: Any = None,
) -> dict[str, Any]:
    """The packet engine, with HPCC's outputs: FCT at the sender's last ACK (fct.txt) and pfc.txt.

    With `out`, the run's PhantoraNetwork calls go to out/ns3-calls.txt (phantora-ns3-runner replays them). The
    run itself is the runner's (`phantora.netsim.runner_engine`: no Python bindings to load, the same records),
    unless the config or a `scenario` (the packet engine under it, `netsim.packet_faults`) needs the in-process
    engine. With ``partition=N``, N worker processes (`netsim_partition`; no call script)."""
    from phantora.netsim.runner_engine import runner_usable

    config = engine.packet
    for name, value in (("nvlink", "fluid"), ("reuse", "on")):
        if getattr(config, name) == value:
            raise InputError(
                "netsim reports every flow's FCT as HPCC does (at its sender's last ACK), packet by packet: "
                f"{name}={value} applies to run and replay only",
                file="--set",
                field=name,
            )
    if config.partition:
        from phantora.commands.netsim_partition import run_partition

        return run_partition(topo, inp, engine, scenario, progress)
    if runner_usable(config) and scenario is None:
        return _run_runner(topo, inp, engine, out, progress)
    from phantora.netsim.packet import Ns3Simulator

    calls = RunDir(out).file(S.NS3_CALLS_TXT) if out else None
    sim = make_engine(engine, topo, calls=calls, scenario=scenario)
    install_throttles(sim, scenario, topo, "ns3")
    assert isinstance(sim, Ns3Simulator)
    with sim:
        t0 = time.perf_counter()
        for start, batch in inp.batches:
            sim.submit(batch, start, dports={f.id: inp.dports[f.id] for f in batch if f.id in inp.dports})
        done = {c.flow_id: c for c in _drain(sim, inp, progress)}
        sim.finish()
        wall = time.perf_counter() - t0
        return {
            "done": done,
            "fct": [r for r in sim.fct_records() if r.flow_id in done and r.flow_id not in inp.hidden],
            "pfc": sim.pfc_events(),
            "pfc_txt": sim.pfc_lines(),
            "queues": sim.queue_samples(),
            "drops": sim.drops(),
            "cnps": sim.cnp_events(),
            "ecn": sim.ecn_mark_events(),
            "transport": sim.flow_transport(),
            "links": sim.channel_usage(max(1, sim.now() - inp.first_start)),
            "stats": sim.stats(),
            "effective": sim.effective(),
            "wall_s": wall,
            "now": sim.now(),
            "scenario": report_scenario(
                scenario, topo, sim, [], list(done.values()), None, "flows", alone=_alone(inp, scenario)
            ),
        }


def _run_runner(
    topo: Topology, inp: NetsimInput, engine: EngineSpec, out: Path | None, progress: str
) -> dict[str, Any]:
    """`_run_ns3` in phantora-ns3-runner: the call script (out/ns3-calls.txt, else a temporary one) run there."""
    from phantora.netsim.base import watch_sample
    from phantora.netsim.factory import make_runner

    told: list[EffectiveSettings] = []  # what the fabric runs by, its warnings told before the run

    def fabric(pairs: list[tuple[str, str]], to: Tell = to_stderr) -> None:
        told.append(EffectiveSettings.parse(net.config, pairs))
        tell(told[0], fabric_warnings(told[0], topo), to)

    with tempfile.TemporaryDirectory(prefix="phantora-netsim-") as tmp:
        net = make_runner(engine, topo, RunDir(out or Path(tmp)).file(S.NS3_CALLS_TXT))
        for start, batch in inp.batches:
            net.submit(batch, start, dports={f.id: inp.dports[f.id] for f in batch if f.id in inp.dports})
        t0 = time.perf_counter()
        if progress == "off":
            rec = net.run(on_effective=fabric)
        else:
            with Progress(progress, "netsim", len(inp.flows), "flow") as bar:
                bar.update(0)
                watch = list(watch_sample([f.id for f in inp.flows]))

                def to(notes: list[str]) -> None:  # (not tearing the bar)
                    for n in notes:
                        bar.write(warning_line(n))

                rec = net.run(
                    watch,
                    lambda got, now, events: bar.update(add=len(got), sim_ns=now, events=events),
                    on_effective=lambda pairs: fabric(pairs, to),
                )
        wall = time.perf_counter() - t0
    return {
        "done": {c.flow_id: c for c in rec.done},
        "fct": [r for r in rec.fct if r.flow_id not in inp.hidden],
        "pfc": rec.pfc,
        "pfc_txt": rec.pfc_lines(),
        "queues": rec.queues,
        "drops": rec.drops,
        "cnps": rec.cnps,
        "ecn": rec.ecn,
        "transport": rec.transport,
        "links": rec.channel_usage(max(1, rec.now - inp.first_start)),
        "stats": rec.stats(net.config, topo),
        "effective": told[0] if told else EffectiveSettings.parse(net.config, rec.effective),
        "wall_s": wall,
        "now": rec.now,
    }


def _run_flow(
    topo: Topology, inp: NetsimInput, engine: EngineSpec, progress: str = "off", scenario: Any = None
) -> dict[str, Any]:
    """The flow engine at the packet config's goodput (`EngineSpec.flow_goodput`); FCT at the last byte.
    With a `scenario` (docs/scenarios.md, the spec's, read), the flow engine under it."""
    config = engine.packet
    efficiency = engine.flow_options()["payload_efficiency"]
    sim = make_engine(engine, topo, scenario=scenario)
    install_throttles(sim, scenario, topo, "flow")
    channels = sim.channels()
    assert channels is not None  # an in-process engine observes its channels
    try:
        t0 = time.perf_counter()
        done: dict[int, Any] = {}
        for start, batch in inp.batches:
            done.update((c.flow_id, c) for c in sim.advance(start))
            sim.submit(batch, start)
        done.update((c.flow_id, c) for c in _drain(sim, inp, progress, done))
        wall = time.perf_counter() - t0
        fct = []
        for f in sorted(inp.reported, key=lambda f: (done[f.id].end_ns, f.id)):
            c = done[f.id]
            key = f.id if f.key is None else f.key
            framing = (config.payload_bytes, config.header_bytes)
            ideal = standalone_fct_ns(topo, f.src, f.dst, f.size, key, framing, f.rate_bps, f.via_nic)
            if topo.ecmp_hash == "hpcc":  # the ports the hash sees
                sport, dport = key & 0xFFFF, key >> 16 & 0xFFFF
            else:
                sport, dport = 10000, inp.dports.get(f.id, 100)
            fct.append(FctLine(f.src, f.dst, sport, dport, f.size, c.start_ns, c.end_ns - c.start_ns, ideal, f.id))
        return {
            "done": done,
            "fct": fct,
            "pfc": [],
            "pfc_txt": [],
            "queues": [],
            "drops": [],
            "cnps": None,
            "ecn": None,
            "transport": None,
            "links": channels.channel_usage(max(1, sim.now() - inp.first_start)),
            "stats": dict(sim.stats(), engine="flow", payload_efficiency=efficiency),
            "wall_s": wall,
            "now": sim.now(),
            "scenario": report_scenario(
                scenario, topo, sim, [], list(done.values()), None, "flows", alone=_alone(inp, scenario)
            ),
        }
    finally:
        sim.close()


def _alone(inp: NetsimInput, scenario: Any) -> dict[int, Alone] | None:
    """The flows' ECMP keys and rate caps for a scenario's FCT tables (None without a scenario)."""
    return flow_alone(inp.flows) if scenario is not None else None


def _write_outputs(out: Path, topo: Topology, inp: NetsimInput, res: dict[str, Any], engine: EngineSpec) -> list[Path]:
    """The run directory's network files, as every command writes them (flows.csv with HPCC's FCT and
    standalone FCT), HPCC's fct.txt and pfc.txt, engine.json (what the packet engine ran by) and summary.json.
    The flow engine measures no PFC, queues, drops, CNPs or ECN marks: those files are left out (not measured)."""
    out.mkdir(parents=True, exist_ok=True)
    rd = RunDir(out)
    by_id = {f.id: f for f in inp.reported}
    packet = res["cnps"] is not None
    fct = {r.flow_id: r for r in res["fct"]}
    done = [res["done"][i] for i in fct]
    paths = [
        write_flows_csv(
            rd.file(S.FLOWS_CSV),
            topo,
            done,
            flows=by_id,
            fct_ns={i: r.fct_ns for i, r in fct.items()},
            standalone_ns={i: r.standalone_ns for i, r in fct.items()},
            cnps=per_flow_counts(res["cnps"]) if packet else None,
            ecn_marks=per_flow_counts(res["ecn"]) if packet else None,
            transport=res["transport"],
        ),
        rd.file(S.FCT_TXT),
        write_links_csv(rd.file(S.LINKS_CSV), topo, res["links"]),
    ]
    write_fct_txt(res["fct"], rd.file(S.FCT_TXT))
    if packet:
        write_pfc_txt(res["pfc_txt"], rd.file(S.PFC_TXT))
        paths += [
            write_pfc_csv(rd.file(S.PFC_CSV), topo, res["pfc"]),
            rd.file(S.PFC_TXT),
            write_queues_csv(rd.file(S.QUEUES_CSV), topo, res["queues"]),
            write_drops_csv(rd.file(S.DROPS_CSV), topo, res["drops"]),
            write_cnps_csv(rd.file(S.CNPS_CSV), topo, res["cnps"]),
            write_ecn_csv(rd.file(S.ECN_CSV), topo, res["ecn"]),
            write_engine_json(out, res["effective"], engine, topo),
        ]
    summary = {"schema": S.NETSIM, **res["stats"]}
    if res.get("scenario"):
        summary["scenario"] = res["scenario"]
    if res.get("partition"):
        summary["partition"] = res["partition"]
    if res.get("idle_fabric"):
        summary["idle_fabric"] = res["idle_fabric"]
    summary.update(wall_s=round(res["wall_s"], 6), sim_end_ns=res["now"], flows=len(by_id), input_format=inp.fmt)
    if inp.fmt == "workload":
        summary.update(workload=inp.name, ops=inp.ops, marker_flows=len(inp.hidden))
    paths.append(rd.write_json(S.SUMMARY_JSON, summary))
    paths += [rd.file(S.NS3_CALLS_TXT)] if rd.exists(S.NS3_CALLS_TXT) else []
    return paths


def run(args: argparse.Namespace) -> int:
    from phantora.topology import load_topology

    topo = load_topology(args.topology)
    engine = engine_spec(args)
    sc = load_scenario(args, topo)

    def make() -> NetworkSimulator:  # a workload's runs that rate its NCCL groups, as `phantora replay` runs it
        from phantora.commands.replay import workload_engine

        return workload_engine(engine, topo, sc)

    inp = read_netsim_input(args.flows, topo, make)
    config = engine.packet
    inputs = {"--flows": inp.path, "--config": args.config, "--scenario": args.scenario}
    record_config(args, "netsim", topo, config, inputs)  # the flow network too: it runs at the config's goodput
    mode = progress_mode(args)
    if args.network == "ns3":
        res = _run_ns3(topo, inp, engine, args.out, mode, sc)
    else:
        res = _run_flow(topo, inp, engine, mode, sc)
    fcts = sorted(r.fct_ns for r in res["fct"])
    slow = sorted(r.fct_ns / r.standalone_ns for r in res["fct"] if r.standalone_ns)
    stats = res["stats"]
    cc = config.cc if args.network == "ns3" else "-"
    if inp.fmt == "workload":
        print(f"workload {inp.name}: {inp.ops} ops, {len(inp.hidden)} marker flows (not reported)")
    print(f"{len(inp.reported)} flows on {topo.name} ({args.network}, cc {cc}) in {res['wall_s']:.3f} s wall")
    if fcts:
        p99 = fcts[min(len(fcts) - 1, int(0.99 * len(fcts)))]
        print(f"  fct ns: min {fcts[0]}  median {fcts[len(fcts) // 2]}  p99 {p99}  max {fcts[-1]}")
    if slow:
        print(f"  slowdown (fct / standalone): median {slow[len(slow) // 2]:.3f}  max {slow[-1]:.3f}")
    if args.network == "ns3":
        print(
            f"  pfc frames {len(res['pfc'])}  drops {stats.get('drops', 0)}  ecn marks {stats.get('ecn_marks', 0)}"
            f"  cnps {stats.get('cnps', 0)}"
            f"  retransmitted packets {stats.get('retx_packets', 0)}  events {stats.get('events', 0)}"
        )
        if res.get("partition"):
            part = res["partition"]
            print(
                f"  partition: {part['workers']} workers, {part['windows']} windows, "
                f"{part['message_bytes']:,} message bytes, {part['ties_by_key']} cross-worker ties ordered by key"
            )
        from phantora.results.idle import idle_fabric_on, traffic_of

        idle = idle_fabric_on(topo, traffic_of(topo, inp.flows), args.cc, list(args.set))
        if idle:
            print(f"note: {idle['text']}")
            res["idle_fabric"] = idle
    if args.out:
        paths = _write_outputs(args.out, topo, inp, res, engine)
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
