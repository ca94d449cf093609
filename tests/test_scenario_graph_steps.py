"""Events at a step boundary (`at_step`) in a graph replay (issue 36): they apply as the graph's steps start, as in a
live run; a step the graph never reaches is refused. Closed forms on the flow engine."""

from __future__ import annotations

import pytest

from phantora.collectives.spec import AlgoOptions
from phantora.egraph import ProgramBuilder, build_graph, replay_graph
from phantora.egraph.format import ExecGraph
from phantora.errors import InputError
from phantora.netsim.faults import FaultyFlowSimulator
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.scenario import Scenario, parse_scenario
from phantora.replay import compute_stretch
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

C = 300_000  # compute per step (ns)
S = 4 << 20  # all-reduce bytes per step


def fabric() -> Topology:
    return leaf_spine(2, 1, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)


def graph(steps: int = 3, with_steps: bool = True) -> ExecGraph:
    """2 ranks, one per leaf: each step C ns of compute, an all-reduce of S bytes, its wait, the step's end."""
    bs = []
    for r in range(2):
        b = ProgramBuilder(r)
        for _ in range(steps):
            b.compute("fwd", C)
            b.wait([b.collective("all_reduce", [0, 1], S)])
            if with_steps:
                b.step()
        bs.append(b)
    return build_graph(bs)


def scenario(body: str) -> Scenario:
    return parse_scenario(body, "sc.toml")


def replay(sc: Scenario | None, g: ExecGraph | None = None) -> tuple[list[int], dict[int, int]]:
    topo = fabric()
    sim = FlowSimulator(topo) if sc is None else FaultyFlowSimulator(topo, sc)
    if sc is not None and sc.gpu_slow():
        sim.stretch = compute_stretch(sc.throttles(), topo)
    res = replay_graph(g or graph(), topo, sim, AlgoOptions(model="ideal"), scenario=sc)  # flows start at issue
    return res.step_times_ns, res.steps_started


def test_a_nic_down_at_a_step_delays_that_step_by_what_outlasts_its_compute() -> None:
    """rank 0's only NIC fails as step 1 starts, for D > C: step 1's all-reduce waits for it, so step 1 takes
    D - C longer, exactly; steps 0 and 2 are the clean run's."""
    clean, _ = replay(None)
    d = 1_000_000
    sc = scenario(f'[[events]]\nkind = "nic_down"\nrank = 0\nat_step = 1\nduration = "{d}ns"\n')
    faulty, started = replay(sc)
    assert started == {1: clean[0]}  # step 1 starts where step 0 ended (both ranks at once here)
    assert faulty[0] == clean[0] and faulty[2] == clean[2]
    assert faulty[1] == clean[1] + d - C


def test_a_link_event_at_step_zero_fires_at_the_start() -> None:
    clean, _ = replay(None)
    sc = scenario('[[events]]\nkind = "nic_down"\nrank = 1\nat_step = 0\nduration = "500us"\n')
    faulty, started = replay(sc)
    assert started == {0: 0} and faulty[0] == clean[0] + 500_000 - C and faulty[1:] == clean[1:]


def test_a_slow_gpu_from_a_step_stretches_its_compute_by_k() -> None:
    """rank 1 computes k times slower from its start of step 2: step 2 takes (k - 1) x C longer, exactly."""
    clean, _ = replay(None)
    k = 3.0
    faulty, _ = replay(scenario(f'[[events]]\nkind = "gpu_slow"\nrank = 1\nfactor = {k}\nat_step = 2\n'))
    assert faulty[:2] == clean[:2]
    assert faulty[2] == clean[2] + round((k - 1) * C)


@pytest.mark.parametrize(
    ("steps", "with_steps", "at_step", "text"),
    [(2, False, 1, "has no steps"), (2, True, 3, "2 steps: step 3 never starts")],
)
def test_a_step_the_graph_never_starts_is_refused(steps: int, with_steps: bool, at_step: int, text: str) -> None:
    sc = scenario(f'\n[[events]]\nkind = "nic_down"\nrank = 0\nat_step = {at_step}\n')
    with pytest.raises(InputError) as err:
        replay(sc, graph(steps, with_steps))
    msg = str(err.value)
    assert text in msg and "sc.toml:2" in msg and "events[0].at_step" in msg


# ----- ns-3: the same step events inside the packet fabric ----------------------------------------------------
def replay_ns3(sc: Scenario | None) -> tuple[list[int], dict[int, int]]:
    """The graph on ns-3 (the default packet config), under `sc` with its timed slow GPUs installed as the CLI
    does (`install_throttles`)."""
    from phantora.commands.scenario_option import install_throttles
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet_config import PacketConfig

    topo = fabric()
    sim = make_engine(EngineSpec("ns3", PacketConfig()), topo, scenario=sc)
    with sim:  # type: ignore[attr-defined]
        install_throttles(sim, sc, topo, "ns3")
        res = replay_graph(graph(), topo, sim, AlgoOptions(model="ideal"), scenario=sc)
    return res.step_times_ns, res.steps_started


@pytest.mark.ns3
@pytest.mark.parametrize("k", [2.0, 3.0])
def test_a_slow_gpu_from_a_step_stretches_its_compute_by_k_in_ns3(ns3_lib, k: float) -> None:
    """In ns-3, rank 1 k times slower from its start of step 2 (the window opens inside the fabric as its step 1
    marker completes): step 2 takes exactly (k - 1) x C longer than the clean ns-3 run, steps 0 and 1 are the
    clean run's to the ns (the all-reduce is the same packets, 2C later on an idle fabric)."""
    clean, _ = replay_ns3(None)
    faulty, _ = replay_ns3(scenario(f'[[events]]\nkind = "gpu_slow"\nrank = 1\nfactor = {k}\nat_step = 2\n'))
    assert faulty[:2] == clean[:2]
    assert faulty[2] == clean[2] + round((k - 1) * C)


@pytest.mark.ns3
def test_a_slow_gpu_from_step_zero_and_a_link_event_at_a_step_in_ns3(ns3_lib) -> None:
    """In ns-3, x2 from step 0 for C ns slows step 0's compute only: C/2 of its work done in the window, the other C/2
    at full speed after it, so C/2 more, exactly; and a NIC down at step 1
    fires as step 1 starts (where step 0 ended), leaving step 0 as it was and making step 1 at least D - C longer
    (the all-reduce waits for the NIC; go-back-N recovery comes on top)."""
    clean, _ = replay_ns3(None)
    slow, _ = replay_ns3(
        scenario(f'[[events]]\nkind = "gpu_slow"\nrank = 0\nfactor = 2.0\nat_step = 0\nduration = "{C}ns"\n')
    )
    assert slow[0] == clean[0] + C // 2 and slow[1:] == clean[1:]
    d = 1_000_000
    faulty, started = replay_ns3(
        scenario(f'[[events]]\nkind = "nic_down"\nrank = 0\nat_step = 1\nduration = "{d}ns"\n')
    )
    assert started == {1: clean[0]} and faulty[0] == clean[0]
    assert faulty[1] >= clean[1] + d - C
