"""The fluid shards in processes of their own (`fluid_procs=on`, `phantora.netsim.fluid_procs`): every start and end
that of one flow engine and of the hybrid over one fluid engine, with and without fluid chains; each shard's CPU
comes from its own process; a shard process that dies is an error naming it; bad settings are refused."""

from __future__ import annotations

import os
import random
import signal

import pytest

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.fluid_procs import ProcShardedFluid
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.loader import load_topology
from tests.random_dags import MIB, gpus_by_host
from tests.test_fluid_chains import any_dag, chain_dag, chained
from tests.test_fluid_shards import two_batches_agree


def in_procs(topo_name: str, shards: int, chains: bool) -> FluidNvlinkSimulator:
    topo = load_topology(topo_name)
    fluid = ProcShardedFluid(topo, shards, lambda: FlowSimulator(topo, verify=True), timeout_s=120)
    sim = FluidNvlinkSimulator(FlowSimulator(topo), fluid, payload_bytes=1000, header_bytes=48)  # type: ignore[arg-type]
    sim.fluid_chains = chains
    return sim


def agree(topo_name: str, shards: int, chains: bool, trials: int) -> None:
    """Random DAGs (random hosts, and chains of one host's steps), two batches each: the hybrid over shard processes
    against one flow engine and the hybrid over one fluid engine without chains; channel bytes equal; each shard's
    CPU measured in its process, their critical path at most their sum."""
    hosts = gpus_by_host(topo_name)
    topo = load_topology(topo_name)
    rng = random.Random(41 + shards)
    for trial in range(trials):
        dag = chain_dag if trial % 2 else any_dag
        first = dag(rng, hosts, 0, rng.randint(40, 160), [])
        second = dag(rng, hosts, len(first), rng.randint(20, 60), [f.id for f in first])
        one, base, sim = FlowSimulator(topo), chained(topo_name, 0, chains=False), in_procs(topo_name, shards, chains)
        try:
            two_batches_agree((one, base, sim), first, second, trial)
            fluid = sim.fluid
            assert isinstance(fluid, ProcShardedFluid)
            assert sim.in_flight() == 0 and not sim._ext and not sim._ext_step
            assert [r.bytes for r in fluid.channel_usage()] == [r.bytes for r in base.fluid.channel_usage()]
            assert fluid.channel_busy_ns() == base.fluid.channel_busy_ns()
            assert sum(c > 0 for c in fluid.shard_cpu_s) >= 2  # (measured in the shards' own processes)
            assert 0 < fluid.critical_cpu_s <= sum(fluid.shard_cpu_s) + 1e-9
        finally:
            sim.close()


@pytest.mark.parametrize(("topo_name", "shards", "chains"), [("testbed16", 2, True), ("rail128", 3, False),
                                                             ("rail128", 5, True)])  # fmt: skip
def test_shard_processes_give_one_flow_engines_completions(topo_name: str, shards: int, chains: bool) -> None:
    agree(topo_name, shards, chains, trials=2)


@pytest.mark.slow
def test_sixteen_shard_processes_give_one_flow_engines_completions() -> None:
    agree("rail128", 16, True, trials=4)


CAP = 400_000_000_000  # bits/s: the marker case's NVLink flows


def marker_case() -> list[Flow]:
    """Two NVLink flows capped at 400 Gb/s on testbed16's two hosts (1 and 2 MiB), a marker on host 1 after both
    (300 ns delay) and a 1 MiB NVLink flow on host 1 after it."""
    hosts = gpus_by_host("testbed16")
    (a, b), (c, d) = hosts[0][:2], hosts[1][:2]
    return [
        Flow(0, a, b, MIB, rate_bps=CAP),
        Flow(1, c, d, 2 * MIB, rate_bps=CAP),
        Flow(2, c, c, 0, (0, 1), 300),
        Flow(3, c, d, MIB, (2,), rate_bps=CAP),
    ]


def test_a_marker_across_shard_processes_ends_at_its_closed_form() -> None:
    """A 1 MiB NVLink flow on each of testbed16's two hosts (capped at 400 Gb/s), then a marker on host 1 after
    both (300 ns delay: held across the shards) and a 1 MiB NVLink flow on host 1 after it: the marker starts and
    ends at the later end + 300 ns and the last flow ends one capped transfer + its 2 hops of 25 ns after it."""
    flows = marker_case()
    for chains in (False, True):
        sim = in_procs("testbed16", 2, chains)
        try:
            sim.submit(flows, 0)
            got = {x.flow_id: x for x in sim.drain()}
        finally:
            sim.close()
        xfer = -(-MIB * 8 * 1_000_000_000 // CAP) + 50
        assert got[0].end_ns == xfer
        assert got[1].end_ns == -(-2 * MIB * 8 * 1_000_000_000 // CAP) + 50
        assert got[2].start_ns == got[2].end_ns == got[1].end_ns + 300
        assert (got[3].start_ns, got[3].end_ns) == (got[2].end_ns, got[2].end_ns + xfer)


def test_a_shard_process_that_dies_is_an_error_naming_it() -> None:
    hosts = gpus_by_host("testbed16")
    sim = in_procs("testbed16", 2, True)
    fluid = sim.fluid
    assert isinstance(fluid, ProcShardedFluid)
    try:
        os.kill(fluid.procs[1]._proc.pid, signal.SIGKILL)
        fluid.procs[1]._proc.wait()
        with pytest.raises(PhantoraError, match=r"fluid shard 1 \(pid \d+\) .*exited with code -9"):
            sim.submit([Flow(0, hosts[1][0], hosts[1][1], MIB)], 0)
            sim.drain()
    finally:
        sim.close()


def test_fluid_procs_needs_fluid_shards() -> None:
    with pytest.raises(InputError, match="fluid_procs.*fluid_shards"):
        PacketConfig(nvlink="fluid", fluid_procs="on")
    with pytest.raises(InputError, match="fluid_procs"):
        PacketConfig(nvlink="fluid", fluid_shards=2, fluid_procs="yes")
    assert PacketConfig(nvlink="fluid", fluid_shards=2, fluid_procs="on").fluid_procs == "on"
