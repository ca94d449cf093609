"""The flow engine's slack path (`FlowSimulator.cap_slack`, on for the hybrid's fluid NVLink side): an event whose
flows all have rate caps that sum under their channels' capacity sets the new flows at their caps and solves
nothing. Checked against closed forms (a capped ring's steps; NVLink's fair share where the caps do not fit), each
rate against a full progressive-filling solve (`verify`), and completions against the engine without it and the
flow engine alone, to the ns."""

from __future__ import annotations

import random

from phantora.netsim.base import Completion, Flow
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.topology.loader import load_topology

MIB = 1 << 20
HOPS_NS = 50  # GPU -> NVSwitch -> GPU on testbed16, 25 ns a hop
NVLINK_BPNS = 450.0  # 3.6 Tb/s in bytes a ns


def fluid(cap_slack: bool) -> FlowSimulator:
    """The flow engine as the hybrid sets up its fluid side (not carried), every re-solve checked (`verify`)."""
    sim = FlowSimulator(load_topology("testbed16"), verify=True)
    sim.carries = False
    sim.cap_slack = cap_slack
    return sim


def key(done: list[Completion]) -> list[tuple[int, int, int]]:
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)


def ring(steps: int, channels: int, cap_bps: int) -> list[Flow]:
    """A ring over host 0's 8 GPUs: in each step each GPU sends 1 MiB to the next on each channel, after the flow
    of that channel that reached it in the step before (as NCCL's ring steps chain)."""
    flows: list[Flow] = []
    n = 8
    for s in range(steps):
        for ch in range(channels):
            for g in range(n):
                deps = () if s == 0 else (((s - 1) * channels + ch) * n + (g - 1) % n,)
                flows.append(Flow(len(flows), g, (g + 1) % n, MIB, deps=deps, rate_bps=cap_bps))
    return flows


def test_a_capped_ring_under_nvlink_solves_nothing_and_ends_at_its_closed_form() -> None:
    """2 channels at 400 Gb/s each on every GPU pair (800 of 3,600 Gb/s): every flow at its cap, each step
    1 MiB x 8 / 400 Gb/s (20,971.52 ns, so 20,972 whole ns) + the two hops, end to end."""
    steps = 4
    slack = fluid(True)
    slack.submit(ring(steps, 2, 400_000_000_000), 0)
    got = key(slack.drain())
    step_ns = -(-MIB * 8 * 1_000_000_000 // 400_000_000_000) + HOPS_NS
    assert [end for _, _, end in got] == [(i // 16 + 1) * step_ns for i in range(16 * steps)]
    st = slack.stats()
    assert st["slack_resolves"] == 2 * steps and st["resolves"] == 0  # a step's start and its end, none solved
    plain = fluid(False)
    plain.submit(ring(steps, 2, 400_000_000_000), 0)
    assert key(plain.drain()) == got
    assert plain.stats()["resolves"] and plain.stats()["slack_resolves"] == 0


def test_caps_over_nvlink_are_solved_at_the_fair_share() -> None:
    """Three flows of a GPU pair capped at 1.5 Tb/s each (4.5 of 3.6 Tb/s): the caps do not fit, so the event is
    solved: a third of NVLink each (150 bytes/ns), 1 MiB / 150 = 6,990.5 ns, so 6,991 whole ns, + the hops."""
    flows = [Flow(i, 0, 1, MIB, rate_bps=1_500_000_000_000) for i in range(3)]
    sim = fluid(True)
    sim.submit(flows, 0)
    got = key(sim.drain())
    share = NVLINK_BPNS / 3
    assert got == [(i, 0, -(-MIB // share) + HOPS_NS) for i in range(3)]
    assert sim.stats()["slack_resolves"] == 0
    plain = fluid(False)
    plain.submit(flows, 0)
    assert key(plain.drain()) == got


def test_an_uncapped_flow_fills_its_channels_so_they_are_not_slack_while_it_sends() -> None:
    """A 4 MiB flow at 400 Gb/s beside an uncapped one on a GPU pair, and a 1 MiB flow at 400 Gb/s starting at
    1,000 ns: the uncapped flow takes what the caps leave (400 bytes/ns, then 350), so each event is solved while it
    sends; the two capped flows' ends, after it, are slack."""
    flows = [
        Flow(0, 0, 1, 4 * MIB, rate_bps=400_000_000_000),
        Flow(1, 0, 1, 4 * MIB),
        Flow(2, 0, 1, MIB, rate_bps=400_000_000_000, delay_ns=1_000),
    ]
    sim = fluid(True)
    sim.submit(flows, 0)
    got = key(sim.drain())
    assert sim.stats()["slack_resolves"] == 2
    # the capped flows at 50 bytes/ns all along (4 MiB: 83,886.08 ns; 1 MiB: 20,971.52); the uncapped one 400,000
    # bytes by 1,000 ns, then the 3,794,304 left at 350 bytes/ns: 10,840.87 ns
    assert got == [(0, 0, 83_887 + HOPS_NS), (1, 0, 1_000 + 10_841 + HOPS_NS), (2, 1_000, 1_000 + 20_972 + HOPS_NS)]
    plain = fluid(False)
    plain.submit(flows, 0)
    assert key(plain.drain()) == got


def test_the_hybrid_matches_the_flow_engine_alone_to_the_ns() -> None:
    """Both hosts of testbed16: a capped ring in each and, after each host's first step, a fabric flow from it to
    the other host that the other's next step waits on; the hybrid's fluid side takes its slack path and gives the
    completions of the flow engine alone (its NVLink and fabric flows share no channel)."""
    one = ring(3, 2, 400_000_000_000)
    per_host = len(one)
    flows = [
        Flow(
            f.id + off,
            f.src + off // per_host * 8,
            f.dst + off // per_host * 8,
            f.size,
            deps=tuple(d + off for d in f.deps),
            rate_bps=f.rate_bps,
        )
        for off in (0, per_host)
        for f in one
    ]
    fabric = [
        Flow(len(flows), 3, 11, 4 * MIB, deps=(15,)),  # after host 0's first step, to host 1
        Flow(len(flows) + 1, 11, 3, 4 * MIB, deps=(per_host + 15,)),
    ]
    into = ((0, fabric[1].id), (8, fabric[0].id))
    late = [  # a last step in each host, after the fabric flow into it
        Flow(len(flows) + 2 + 8 * k + i, host + i, host + (i + 1) % 8, MIB, deps=(dep,), rate_bps=400_000_000_000)
        for k, (host, dep) in enumerate(into)
        for i in range(8)
    ]
    dag = flows + fabric + late
    topo = load_topology("testbed16")
    side = FlowSimulator(topo, verify=True)
    hybrid = FluidNvlinkSimulator(FlowSimulator(topo), side, payload_bytes=4096, header_bytes=48)
    assert side.cap_slack
    hybrid.submit(dag, 0)
    got = key(hybrid.drain())
    assert side.stats()["slack_resolves"] and side.stats()["resolves"] == 0
    alone = FlowSimulator(topo)
    alone.submit(dag, 0)
    assert key(alone.drain()) == got


def test_random_capped_traffic_in_a_host_every_rate_verified() -> None:
    """Random NVLink flows among a host's 8 GPUs (caps from far under NVLink to over it, a few uncapped, chains and
    delays): every event's rates checked against a full solve bit for bit (`verify`), and the same completions as
    the engine without the slack path."""
    rng = random.Random(11)
    taken = solved = 0
    for trial in range(40):
        caps = [0, 100_000_000_000, 400_000_000_000, 1_200_000_000_000, 1_800_000_000_000, 3_600_000_000_000]
        pick = caps[: rng.randint(2, len(caps))]
        flows: list[Flow] = []
        for i in range(rng.randint(5, 60)):
            src, dst = rng.sample(range(8), 2)
            deps = (rng.randrange(i),) if i and rng.random() < 0.4 else ()
            size = rng.choice([4096, 65_536, MIB, rng.randint(1, 4 * MIB)])
            cap = rng.choice(pick[1:]) if rng.random() < 0.9 else 0
            flows.append(Flow(i, src, dst, size, deps=deps, delay_ns=rng.randint(0, 3_000), rate_bps=cap))
        slack, plain = fluid(True), fluid(False)
        for sim in (slack, plain):
            sim.submit(flows, 0)
        assert key(slack.drain()) == key(plain.drain()), trial
        taken += slack.stats()["slack_resolves"]
        solved += slack.stats()["resolves"]
    assert taken > 100 and solved > 100  # (both paths ran, often)
