"""The flow engine's shortcuts, each pinned against the full solve (`incremental=False`: every transmitting flow
solved from scratch at every event) to the ns: events whose capped flows leave their channels slack solve nothing
(`cap_slack`, on by default, at the events not carried), and a carrier that re-reads whole rounds of many small
components gives way to the component solves (`carry_drops`)."""

from __future__ import annotations

import random

import pytest

from phantora.netsim import flow as flow_mod
from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology.model import Topology

G = 10**9


def run(topo: Topology, flows: list[Flow], **kw: object) -> tuple[list[Completion], FlowSimulator]:
    slack = bool(kw.pop("cap_slack", False))
    sim = FlowSimulator(topo, **kw)
    sim.cap_slack = slack  # (on by default; set before the first flow)
    sim.submit(flows, 0)
    return sim.drain(), sim


def leaf_spine(seed: int) -> Topology:
    """2-4 leaves of 4 hosts, 2 spines, 100G NICs (one of 25G), uplinks of 100 or 200G, latencies 500-1,200 ns."""
    rng = random.Random(seed)
    topo = Topology("ls")
    leaves = rng.randint(2, 4)
    hosts = [topo.add_node("host") for _ in range(4 * leaves)]
    lf = [topo.add_node("switch", tier=1) for _ in range(leaves)]
    sp = [topo.add_node("switch", tier=2) for _ in range(2)]
    for i, h in enumerate(hosts):
        topo.add_link(h, lf[i // 4], 25 * G if i == 1 else 100 * G, 500 + 100 * (i % 3))
    up = rng.choice([100, 200]) * G
    for a in lf:
        for b in sp:
            topo.add_link(a, b, up, 1000)
    return topo.validate()


def cts_traffic(seed: int, topo: Topology, n: int = 400) -> list[Flow]:
    """Chunked-collective-like traffic: chains of steps (capped at 10-45 Gb/s, or not), each step after a 64 B
    clear-to-send from its receiver (uncapped), some chains on a queue, a few large uncapped flows beside them."""
    rng = random.Random(seed)
    eps = topo.endpoints
    flows: list[Flow] = []
    while len(flows) < n:
        src, dst = rng.sample(eps, 2)
        cap = rng.choice([0, 10 * G, 20 * G, 30 * G, 45 * G, 45 * G])
        queue = rng.choice([0, len(flows) + 1])
        prev: tuple[int, ...] = ()
        for _ in range(rng.randint(1, 8)):
            cts = Flow(len(flows), dst, src, 64, prev, tag="cts", key=rng.randint(0, 3))
            flows.append(cts)
            size = rng.choice([65536, 131072, rng.randint(1, 1 << 20)])
            delay = rng.choice([0, 0, 150])
            step = Flow(len(flows), src, dst, size, (cts.id,), delay, "step", rate_bps=cap, queue=queue, key=cts.key)
            flows.append(step)
            prev = (step.id,)
        if rng.random() < 0.1:
            a, b = rng.sample(eps, 2)
            flows.append(Flow(len(flows), a, b, rng.randint(1, 4 << 20), tag="bulk"))
    return flows


@pytest.mark.parametrize("seed", range(6))
def test_slack_events_end_every_flow_as_the_full_solve(seed: int) -> None:
    """Random chains of capped steps and their clear-to-sends: with every rate checked against a from-scratch solve
    after each event (`verify`), the same completions, bytes and busy times as `incremental=False`; some events
    were slack (solved nothing)."""
    topo = leaf_spine(seed)
    flows = cts_traffic(seed, topo)
    want, full = run(topo, flows, incremental=False)
    got, sim = run(topo, flows, verify=True, cap_slack=True)
    assert got == want
    assert sim.channel_bytes() == full.channel_bytes() and sim.channel_busy_ns() == full.channel_busy_ns()
    st = sim.stats()
    assert st["slack_resolves"] > 0 and st["resolves"] > 0
    assert full.stats()["slack_resolves"] == 0


def test_capped_steps_on_a_slack_link_end_at_their_caps_with_no_solve() -> None:
    """Two chains of 4 x 1 MiB steps from host 0 to host 1 (one switch, 100G links of 1 us), capped at 40 and 25
    Gb/s: 65 of 100 Gb/s, so each step runs at its cap, 1 MiB x 8 / cap rounded up to the ns, and arrives 2 us
    later; every start and every transmit end is a slack event (no two of them fall on one ns)."""
    topo = Topology("pair")
    a, b = topo.add_node("host"), topo.add_node("host")
    sw = topo.add_node("switch")
    topo.add_link(a, sw, 100 * G, 1000)
    topo.add_link(b, sw, 100 * G, 1000)
    topo.validate()
    mib = 1 << 20
    flows = []
    for cap in (40 * G, 25 * G):
        prev: tuple[int, ...] = ()
        for _ in range(4):
            flows.append(Flow(len(flows), a, b, mib, prev, rate_bps=cap))
            prev = (len(flows) - 1,)
    done, sim = run(topo, flows, cap_slack=True)
    ends = {c.flow_id: c.end_ns for c in done}
    for chain, cap in enumerate((40 * G, 25 * G)):
        step = -(-mib * 8 * G // cap) + 2000
        assert [ends[4 * chain + k] for k in range(4)] == [step * (k + 1) for k in range(4)]
    st = sim.stats()
    assert st["resolves"] == 0 and st["slack_resolves"] == 15  # the first starts, 6 other starts and 8 ends


def pairs_and_hub(pairs: int, hub: int, steps: int, seed: int, capped: int = 0) -> tuple[Topology, list[Flow]]:
    """`pairs` host pairs, each behind its own switch (the switches joined by a core), each with two chains of
    `steps` uncapped flows of random sizes (so every end is its own event), and a hub: `hub` flows from one host to
    another. The pairs' flows all run at one level (half a link) in `pairs` components of 2; the hub is one of
    `hub`. Then `capped` more pairs, each with one chain of `steps` flows capped at 30 Gb/s (slack events), every
    other one beside an uncapped flow of 64 MiB from 1 us (whose channels are not slack)."""
    rng = random.Random(seed)
    topo = Topology("pairs")
    flows: list[Flow] = []
    core = topo.add_node("switch", tier=2)  # (the fabric must be connected; no flow crosses it)
    for _ in range(pairs + 1 + capped):
        a, b, sw = topo.add_node("host"), topo.add_node("host"), topo.add_node("switch", tier=1)
        topo.add_link(a, sw, 100 * G, 1000)
        topo.add_link(b, sw, 100 * G, 1000)
        topo.add_link(sw, core, 100 * G, 1000)
    topo.validate()
    for p in range(pairs):
        a, b = 1 + 3 * p, 2 + 3 * p
        for _ in range(2):
            prev: tuple[int, ...] = ()
            for _ in range(steps):
                flows.append(Flow(len(flows), a, b, rng.randint(1 << 18, 1 << 20), prev))
                prev = (len(flows) - 1,)
    a, b = 1 + 3 * pairs, 2 + 3 * pairs
    flows += [Flow(len(flows) + i, a, b, 1 << 30) for i in range(hub)]
    for p in range(pairs + 1, pairs + 1 + capped):
        if p % 2:  # (an uncapped flow beside the chain from 1 us: the links are no longer slack)
            flows.append(Flow(len(flows), 1 + 3 * p, 2 + 3 * p, 64 << 20, delay_ns=1000))
        prev = ()
        for _ in range(steps):
            flows.append(Flow(len(flows), 1 + 3 * p, 2 + 3 * p, rng.randint(1 << 18, 1 << 20), prev, rate_bps=30 * G))
            prev = (len(flows) - 1,)
    return topo, flows


def test_a_carrier_rereading_small_components_gives_way_to_component_solves() -> None:
    """A component of `CARRY_GIANT` flows starts the carrier; the 80 pairs' flows beside it all sit in one round,
    which each pair's event reads again in full: the carrier is dropped, and the completions, bytes and busy times
    are the full solve's. Capped chains beside them start and end on slack links, carried and not, and some beside
    an uncapped flow that joined while carried: the slack sums, not kept while carried, are counted again when the
    carrier goes (every rate checked, `verify`)."""
    topo, flows = pairs_and_hub(80, flow_mod.CARRY_GIANT + 6, 8, 1, capped=6)
    want, full = run(topo, flows, incremental=False)
    got, sim = run(topo, flows, verify=True, cap_slack=True)
    assert got == want
    assert sim.channel_bytes() == full.channel_bytes() and sim.channel_busy_ns() == full.channel_busy_ns()
    st = sim.stats()
    assert st["carried_resolves"] >= 32 and st["carry_drops"] >= 1 and st["slack_resolves"] > 0
