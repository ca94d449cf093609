"""`cap_slack` is on by default in every flow engine that moves no flows or capacities (`FlowSimulator.carries`, ECMP
routes), and off where it cannot apply. The traffic of the README's live torchtitan run (FSDP on 2 GPUs of testbed16:
NCCL's Ring/LL and Ring/Simple all-gathers and reduce-scatters, each flow under NCCL's rate cap, overlapping as one
layer's reduce-scatter runs beside the next layer's all-gather) ends every flow as the full solve does
(`incremental=False`: every transmitting flow solved from scratch at every event), each rate checked (`verify`)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology

MIB = 1 << 20


def test_slack_is_on_where_nothing_moves_and_off_under_multipath() -> None:
    topo = load_topology("testbed16")
    assert FlowSimulator(topo).cap_slack
    assert not FlowSimulator(topo, lb="spray").cap_slack  # (multipath never takes the slack path)

    class Moving(FlowSimulator):
        carries = False  # (as a subclass that moves flows or capacities says: `FaultyFlowSimulator`)

    assert not Moving(topo).cap_slack


def fsdp_steps(protocol: str, layers: int, gap_ns: int) -> list[tuple[int, list[Flow]]]:
    """(submit ns, flows) of `layers` FSDP layers on GPUs 0 and 1: each layer's all-gather, then `gap_ns` later its
    reduce-scatter, while the next layer's all-gather starts `gap_ns // 2` after it (sizes of a small model's
    layers, 0.5-3 MiB, and one 24 MiB embedding)."""
    topo = load_topology("testbed16")
    opts = AlgoOptions(algorithm="ring", protocol=protocol, nccl_env=nccl_env({}))
    batches: list[tuple[int, list[Flow]]] = []
    first = 0
    for layer in range(layers):
        nbytes = 24 * MIB if layer == 0 else (MIB // 2) * (1 + layer % 6)
        for kind, at in (("all_gather", layer * gap_ns // 2), ("reduce_scatter", layer * gap_ns // 2 + gap_ns)):
            dag = decompose(Collective(kind, (0, 1), nbytes, "bf16"), topo, opts, first_flow_id=first)
            first += len(dag.flows)
            batches.append((at, list(dag.flows)))
    batches.sort(key=lambda b: b[0])
    return batches


def run(batches: list[tuple[int, list[Flow]]], **kw: object) -> tuple[list[Completion], FlowSimulator]:
    sim = FlowSimulator(load_topology("testbed16"), **kw)  # type: ignore[arg-type]
    done: list[Completion] = []
    for at, flows in batches:
        done += sim.advance(at)
        sim.submit(flows, at)
    done += sim.drain()
    return sorted(done, key=lambda c: c.flow_id), sim


@pytest.mark.parametrize("protocol", ["LL", "Simple"])
def test_fsdp_collectives_on_two_gpus_end_as_the_full_solve(protocol: str) -> None:
    batches = fsdp_steps(protocol, 12, 40_000)
    want, full = run(batches, incremental=False)
    got, sim = run(batches, verify=True)
    assert sim.cap_slack and [(c.flow_id, c.start_ns, c.end_ns) for c in got] == [
        (c.flow_id, c.start_ns, c.end_ns) for c in want
    ]
    assert sim.channel_bytes() == full.channel_bytes() and sim.channel_busy_ns() == full.channel_busy_ns()
    st = sim.stats()
    assert st["slack_resolves"] > 0 and full.stats()["slack_resolves"] == 0
