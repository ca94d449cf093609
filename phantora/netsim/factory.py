"""The one engine factory: an `EngineSpec` (and a topology) -> a `NetworkSimulator`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phantora.errors import InputError
from phantora.netsim.base import NetworkSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.engine_warnings import Tell, fabric_warnings, tell, to_stderr
from phantora.topology.model import Topology

if TYPE_CHECKING:
    from phantora.netsim.decompose import Spawner
    from phantora.netsim.flow import FlowSimulator
    from phantora.netsim.runner_engine import RunnerNetwork
    from phantora.netsim.scenario import Scenario


# Which driver `--set workers=N` builds, per mode (docs/packet-model.md, "Which driver workers=N builds"). Every mode
# builds the plain `DecomposedSimulator` under the driver's `FluidNvlinkSimulator` (the fluid NVLink side in the
# driver). Route (a)'s `HybridDecomposedSimulator` (each worker the fluid hybrid of its hosts and pieces) gives the
# same files byte for byte on a replay (tests/test_decompose_replay_driver.py) but is not faster on the users' path
# (bench/bench_whole_dag_driver.py, 2026-12-02, after the driver cuts of 2026-12-01/02): on a replay of 2 hierarchical
# 64 MiB all-reduces on rail128, chunked (90,112 flows), its critical path was plain's (6.21 against 6.23 CPU s, 911
# rounds against 187), on workloads/moe_rail_alltoall.toml at 16 MiB 1.18x plain's (3.86 against 3.27; 199 rounds
# against 68): the workload's markers and the NVLink hand-offs gate every worker with no lookahead. Only a caller that
# submits its whole DAG once and drains it (`phantora replay`: whole_dag=True) may use it, and only when
# WHOLE_DAG_DRIVER says so. `run` and `jobs` submit as they go and keep the plain driver: there the hybrid stops its
# workers at every watched flow's bound with no lookahead (nccl-tests' old wait on every rank's last flow: 11,369
# rounds against 105, 15.6x the wall). nccl-tests keeps it too, though it now drains each call (7fd9960: the hybrid 9
# rounds, plain 18, about one wall).
WHOLE_DAG_DRIVER = "plain"  # "hybrid": route (a)'s driver for whole-DAG runs
# Where the plain driver's fluid NVLink side runs for a whole-DAG run (issue 38, item 2, step 3): "driver" (one flow
# engine in the driver's process), "procs" (`fluid_shards` = workers, each shard's flow engine in a process of its
# own, the fluid releases in the shards: `fluid_chains`) or "workers" (the same shards, each served by a thread of a
# local worker's process: no process more, on the workers' cores; Ray's workers keep it in the driver), unless the
# user set fluid_shards. The same completions and files every way (tests/test_decompose_fluid_procs.py);
# docs/packet-model.md, "The fluid NVLink side out of the driver" and "The fluid NVLink side in the workers".
# "driver" by default again (2026-12-05, 21:11): "workers" shortens the hierarchical all-reduce's critical path, but
# each fluid event is a round trip to the shards and the wire adds CPU, so on a shared 2-core machine its wall is no
# better (the MoE replay's worse: 1,364 answers for 0.05 CPU s): opt-in (docs/packet-model.md, "Why the wall").
WHOLE_DAG_FLUID = "driver"
# Whether the plain driver takes a packet flow waiting on the fluid NVLink side at the first submit, behind an outer
# gate the fluid side opens (`FluidNvlinkSimulator.outer_gates`), or the hybrid holds it until then (issue 38, item 2).
# The same completions either way (tests/test_decompose_outer_gates.py); docs/packet-model.md, "Outer gates".
OUTER_GATES = True


def make_engine(
    spec: EngineSpec,
    topo: Topology,
    *,
    calls: Path | None = None,
    spawner: Spawner | None = None,
    scenario: Scenario | None = None,
    partitioner: Callable[..., Any] | None = None,
    stepper: Spawner | None = None,
    whole_dag: bool = False,
    warn: Tell = to_stderr,
) -> NetworkSimulator:
    """The engine `spec` describes, on `topo`: the flow engine (under its scenario, if any: `netsim.faults`),
    or ns-3 (with fluid NVLink, NIC latency, profile reuse or decomposition as its config asks).

    ``calls`` records an ns-3 run's call script for phantora-ns3-runner. Decomposition (``workers=N``) starts
    worker processes, so it needs the bridge's ``spawner`` (`bridge.workers.spawn_workers`); so does partition
    (``partition=N``), the bridge's ``partitioner`` (`bridge.cut_pool.run_partitioned_batches`), and with
    nvlink=fluid its ``stepper`` (`bridge.cut_stepped_start.spawn_stepped`). ``scenario``: the spec's scenario
    already read (else it is read from its file). ``whole_dag``: the caller submits its whole DAG once and drains
    it, so ``workers=N`` may build route (a)'s driver (`HybridDecomposedSimulator`; `WHOLE_DAG_DRIVER`). ``warn``:
    given the warnings of an ns-3 engine whose fabric is in this process as soon as it is built (a switch without
    a shared buffer: `phantora.netsim.engine_warnings`; default: stderr); workers' fabrics tell theirs later."""
    if scenario is None and spec.scenario is not None:
        from phantora.netsim.scenario import read_scenario

        scenario = read_scenario(spec.scenario)
    if spec.network == "flow":
        if scenario is not None:
            from phantora.netsim.background import scenario_background
            from phantora.netsim.faults import BACKGROUND_BASE, FaultyFlowSimulator

            background = scenario_background(scenario, topo, BACKGROUND_BASE)  # ids far above any job's
            return FaultyFlowSimulator(topo, scenario, background=background, **spec.flow_options())
        from phantora.netsim.flow import FlowSimulator

        return FlowSimulator(topo, **spec.flow_options())
    if spec.packet.partition and spec.packet.partition_worker < 0 and partitioner is not None:
        if scenario is not None:
            raise InputError(
                f"partition={spec.packet.partition}: a scenario's faults are not split between partition workers "
                "yet; run it on one engine (partition=0)",
                field="--scenario",
            )
        return partitioned(topo, spec.packet, partitioner, stepper)
    if scenario is not None:
        return built(packet_under_scenario(spec, topo, scenario, calls), topo, warn)
    from phantora.netsim.packet import Ns3Simulator

    config = spec.packet
    refuse_partition(config)
    if spec.side == "packet":
        return packet_side(Ns3Simulator(topo, config, calls=calls), config)
    if spec.side == "hybrid":
        return hybrid_worker(topo, config)
    if config.workers:
        if spawner is None:
            raise InputError(
                f"workers={config.workers} (decomposition) starts worker processes: pass the bridge's spawner "
                "(bridge.workers.spawn_workers; phantora run, replay, nccl-tests and jobs do)",
                field="workers",
            )
        if whole_dag and WHOLE_DAG_DRIVER == "hybrid":
            from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator

            return HybridDecomposedSimulator(topo, config, spawner)
        from phantora.netsim.decompose import DecomposedSimulator

        decomposed = DecomposedSimulator(topo, config, spawner)
        fluid_config = config
        links = None  # (the fluid shards served by the workers' processes)
        if whole_dag and WHOLE_DAG_FLUID in ("procs", "workers") and not config.fluid_shards:
            links = decomposed.shard_links() if WHOLE_DAG_FLUID == "workers" else None
            if WHOLE_DAG_FLUID == "procs" or links is not None:
                n = config.workers if links is None else len(links)
                fluid_config = config.with_updates(fluid_shards=n, fluid_procs="on", fluid_chains="on")
        engine = fluid_nvlink(topo, fluid_config, packet=decomposed, links=links)  # (needs nvlink=fluid: validated)
        shards = getattr(engine, "fluid", None)
        if getattr(fluid_config, "fluid_procs", "off") == "on" and shards is not None:  # (its CPU off the driver's)
            decomposed.helper_cpu = lambda: float(shards.critical_cpu_s)
        engine.outer_gates = engine.outer_gates and OUTER_GATES  # type: ignore[attr-defined]
        decomposed.reacts = engine.reacts_to  # type: ignore[attr-defined]
        decomposed.react_epoch = lambda: int(engine.react_epoch)  # type: ignore[attr-defined]
        decomposed.meanwhile = engine.run_ahead  # type: ignore[attr-defined]  # asynchronous rounds (issue 38)
        # (decomposed.floor = engine.submit_floor: opt-in, issue 38; unexplained slowdown on a 64 MiB run)
        decomposed.prechecked = True  # the hybrid checks each batch whole at its submit: ids, ends, deps, cycles
        return engine
    if config.nvlink == "fluid":
        return built(fluid_nvlink(topo, config, calls), topo, warn)
    return built(packet_side(Ns3Simulator(topo, config, calls=calls), config), topo, warn)


def built(engine: NetworkSimulator, topo: Topology, warn: Tell) -> NetworkSimulator:
    """`engine`, its fabric's warnings told through `warn` (once: `engine_warnings.tell`)."""
    fabric = engine.fabric()
    if fabric is not None:
        settings = fabric.effective()
        tell(settings, fabric_warnings(settings, topo), warn)
    return engine


def packet_under_scenario(spec: EngineSpec, topo: Topology, scenario: Scenario, calls: Path | None) -> NetworkSimulator:
    """ns-3 under a scenario (`netsim.packet_faults`): the fabric itself, or with nvlink=fluid beside the fluid
    NVLink side (events on NVLink links refused there); decomposition, profile reuse and NIC latency are not
    combined with a scenario."""
    from phantora.netsim.background import scenario_background
    from phantora.netsim.faults import BACKGROUND_BASE
    from phantora.netsim.packet_faults import FaultyNs3Simulator, check_packet_scenario

    config = spec.packet
    for name, on in (("workers", config.workers), ("reuse", config.reuse == "on"), ("nic_latency", config.nic_latency)):
        if on:
            raise InputError(f"a scenario runs on the plain packet engine: {name} is not combined with it", field=name)
    check_packet_scenario(scenario, topo, fluid_nvlink=config.nvlink == "fluid")
    background = scenario_background(scenario, topo, BACKGROUND_BASE)
    faulty = FaultyNs3Simulator(topo, scenario, config, calls, background=background)
    if config.nvlink == "fluid":
        return fluid_nvlink(topo, faulty.config, packet=faulty)
    return faulty


def make_runner(spec: EngineSpec, topo: Topology, script: Path) -> RunnerNetwork:
    """The packet engine `spec` describes as one batch run of phantora-ns3-runner (what netsim uses when the config
    allows it, `runner_engine.runner_usable`): the fabric's calls written to `script`, then the flows `submit`ted
    and `run()` there, with the in-process engine's records and no Python bindings to load."""
    from phantora.netsim.runner_engine import RunnerNetwork

    if spec.network != "ns3":
        raise InputError("the ns-3 runner runs the packet engine only", field="network")
    refuse_partition(spec.packet)
    return RunnerNetwork(topo, spec.packet, script)


# Why a command that submits flows as it goes cannot use partition workers (they run one DAG, submitted whole, to
# its end): `refuse_partition`'s `why`, by command.
PARTITION_REFUSALS = {
    "run": "the live bridge submits each collective's flows as the ranks reach it and steps the network between "
    "them; record the run (--record DIR) and replay it with partition=N",
    "nccl-tests": "each call starts on the network the previous one left at its last completion (its congestion "
    "state carries over), and the workers cannot be stopped there yet",
    "jobs": "jobs submit their flows as they go",
}


def refuse_partition(config: Any, why: str = "") -> None:
    """partition=N without the bridge's runner (`make_engine`'s ``partitioner``), or for a caller whose flows are
    not one DAG known before the run (`why`): say so in one line rather than run one engine instead."""
    if config.partition and config.partition_worker < 0:
        reason = why or "this caller does not drive them"
        raise InputError(
            f"partition={config.partition}: partition workers run one DAG of flows, submitted whole, to its end "
            f"(phantora netsim and replay); {reason}; use one engine (partition=0)",
            field="partition",
        )


def partitioned(
    topo: Topology, config: Any, runner: Callable[..., Any], stepper: Spawner | None = None
) -> NetworkSimulator:
    """partition=N as a command's engine (`phantora.netsim.partitioned`): what each worker's plain ns-3 engine
    cannot run beside it is refused, naming the field. With nvlink=fluid the fluid NVLink side runs here and steps
    the workers in rounds (`phantora.netsim.partition_stepped`, started by the bridge's `stepper`); with reuse=on
    a `ProfileReuseSimulator` over the stepped workers (its episodes the whole network's quiet periods), between
    them and the fluid side."""
    from phantora.netsim.partitioned import PartitionedSimulator

    if config.nvlink == "fluid":
        if stepper is None:
            raise InputError(
                f"partition={config.partition} with nvlink=fluid steps its workers from this process: pass the "
                "bridge's stepper (bridge.cut_stepped_start.spawn_stepped; phantora replay does)",
                field="nvlink",
            )
        from phantora.netsim.partition_stepped import SteppedPartition

        stepped = SteppedPartition(topo, config, stepper)
        packet = packet_side(stepped, config)  # NIC latency above the workers, as above one engine's ns-3
        engine = fluid_nvlink(topo, config, packet=packet)
        stepped.follow(engine, packet if config.nic_latency else None)  # rounds past fluid events
        stepped.prechecked = True  # the hybrid checks each batch whole at its submit
        return engine
    for name, on in (("nic_latency", config.nic_latency), ("reuse", config.reuse == "on")):  # fmt: skip
        if on:
            raise InputError(
                f"partition={config.partition}: each worker runs the plain packet engine; {name} is not combined "
                "with it yet (one engine runs it: partition=0; reuse=on runs with nvlink=fluid)",
                field=name,
            )
    return PartitionedSimulator(topo, config, runner)  # type: ignore[return-value]


def packet_side(ns3: Any, config: Any) -> Any:
    """The packet side over one ns-3 engine: with ``reuse=on`` a `ProfileReuseSimulator` over it, and with
    ``nic_latency`` > 0 a `NicLatencySimulator` on top (over reuse, if on: reuse then sees the flows as ns-3 gets
    them, without deps, at their first packet's ns; a decomposition worker is this, so each keeps its own
    episodes), else the engine itself."""
    engine = with_reuse(ns3, config)
    if config.nic_latency:
        from phantora.netsim.nic_latency import NicLatencySimulator

        return NicLatencySimulator(engine, config.nic_latency)
    return engine


def fluid_nvlink(
    topo: Topology,
    config: Any,
    calls: Any = None,
    packet: Any = None,
    hybrid: Any = None,
    links: Sequence[Callable[[], Any]] | None = None,
) -> NetworkSimulator:
    """ns-3 for the fabric, the flow engine for NVLink (phantora.netsim.hybrid), both on `topo`. `packet`: a
    packet side built elsewhere (a decomposed one), else one ns-3 engine; `hybrid`: the hybrid's class, if not
    `FluidNvlinkSimulator`; `links`: with fluid_procs=on, the shards served by the decomposition's workers
    (`DecomposedSimulator.shard_links`), not processes started here."""
    from phantora.netsim.flow import FlowSimulator
    from phantora.netsim.hybrid import FluidNvlinkSimulator
    from phantora.netsim.packet import Ns3Simulator

    if packet is None:
        packet = packet_side(Ns3Simulator(topo, config, calls=calls), config)

    def fresh() -> FlowSimulator:
        return FlowSimulator(topo, payload_efficiency=nvlink_efficiency(config), ecmp_hash=packet.topology.ecmp_hash)

    fluid: Any
    if getattr(config, "fluid_shards", 0):  # (issue 38: the fluid side split by host, exact)
        from phantora.netsim.fluid_shards import ShardedFluid

        if getattr(config, "fluid_procs", "off") == "on":  # (each shard in a process of its own, exact)
            from phantora.netsim.fluid_procs import ProcShardedFluid

            fluid = ProcShardedFluid(topo, config.fluid_shards, fresh, links=links)
        else:
            fluid = ShardedFluid(topo, config.fluid_shards, fresh)
    else:
        fluid = fresh()
    cls = FluidNvlinkSimulator if hybrid is None else hybrid
    engine = cls(packet, fluid, payload_bytes=config.payload_bytes, header_bytes=config.header_bytes)
    if getattr(config, "fluid_chains", "off") == "on" and hybrid is None:  # (issue 38: fluid chains, exact)
        engine.fluid_chains = True
    return engine  # type: ignore[no-any-return]


def fluid_shard_engine(topo: Topology, settings: dict[str, Any]) -> FlowSimulator:
    """A fluid shard's flow engine in a process of its own (`phantora.netsim.fluid_proc_server`), with the settings
    of the engine `fluid_nvlink` made for the driver (`fluid_procs=on`)."""
    from phantora.netsim.flow import FlowSimulator

    return FlowSimulator(topo, **settings)


def flow_engine_like(sim: FlowSimulator) -> FlowSimulator:
    """A fresh flow engine set up as `sim` (its topology and so its ECMP policy, payload efficiency, incremental
    solving, load balancing and stretch): a replay's further run of the same problem (`phantora.replay.fresh_like`)."""
    from phantora.netsim.flow import FlowSimulator

    new = FlowSimulator(sim.topology, payload_efficiency=sim.payload_efficiency, incremental=sim.incremental, lb=sim.lb)
    new.stretch = sim.stretch
    return new


def hybrid_worker(topo: Topology, config: Any) -> NetworkSimulator:
    """A decomposition worker running the whole fluid NVLink hybrid for its flows (`phantora.netsim.hybrid_worker`):
    `fluid_nvlink`'s engine, driven by the driver's rounds."""
    from phantora.netsim.hybrid_worker import HybridWorker

    return fluid_nvlink(topo, config, hybrid=HybridWorker)


def with_reuse(engine: Any, config: Any) -> Any:
    """`engine` itself, or with ``reuse=on`` wrapped in a `ProfileReuseSimulator` (phantora.netsim.reuse). Under
    nvlink=fluid it wraps the packet side only, so the fluid NVLink side stays as it is."""
    if config.reuse != "on":
        return engine
    from phantora.netsim.reuse import ProfileReuseSimulator

    return ProfileReuseSimulator(engine)


def nvlink_efficiency(config: Any) -> float:
    """Payload share of an NVLink port's line rate in the packet model, for its fluid stand-in: every data
    packet carries a header (+ INT when on), and the port also carries the ACKs of the data it receives,
    one header-sized packet per `ack_interval` packets (NVLink collectives send as much as they receive)."""
    from phantora.netsim.cc_registry import wants_int

    int_on = config.int_mode == "on" or (config.int_mode == "auto" and wants_int(config.cc))
    header = config.header_bytes + (config.int_header_bytes if int_on else 0)
    return config.payload_bytes / (config.payload_bytes + header + header / config.ack_interval)
