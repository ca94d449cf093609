"""Launch order of a live run does not depend on the order the ranks' messages arrive in (issue 39).

Two identical jobs of two ranks each share the one uplink of each leaf of a 2-leaf star of 100 Gb/s, 1 us links
(each job has a rank under each leaf). Scripted ranks, stepped by a seeded shuffle and with the coordinator's
`progress` called at random points, stand for the operating system's scheduling. Every order must give the
engine the same flows, with the same ids, at the same times, in the same order, and the same records; the
records' times are checked against the max-min closed form (ideal model: line rate, no NCCL latency).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge.core import CoordinatorCore
from bridge.jobs import JobTable
from bridge.protocol import INF_NS, decode, encode
from phantora.collectives.spec import AlgoOptions
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

B = 100 * 10**9
LAT = 1000
S = 8 * 2**20  # all-reduce bytes per rank
P = 2**20  # send/recv bytes
COMPUTE = 10_000
STEPS = 3
HOPS = 4  # GPU -> leaf -> spine -> leaf -> GPU


class LoggedFlowSimulator(FlowSimulator):
    """The flow engine, keeping every submission it was given (time, then each flow's id, ends, size, key)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[int, tuple[tuple[int, int, int, int, int | None], ...]]] = []

    def submit(self, flows: Sequence[Flow], at: int) -> None:  # type: ignore[override]
        self.log.append((at, tuple((f.id, f.src, f.dst, f.size, f.key) for f in flows)))
        super().submit(flows, at)


@dataclass
class ScriptedRank:
    """A rank running `actions` (("compute", ns) | ("coll", seq) | ("p2p", peer, send, seq) | ("wait",)); it
    reports its clock when it passes its lease, as `bridge.client` does (window mode: and waits at the barrier)."""

    rank: int
    local: int
    actions: list[tuple[Any, ...]]
    window: int = 0
    clock: int = 0
    lease: int = INF_NS
    blocked: bool = False
    done: bool = False
    handles: list[int] = field(default_factory=list)
    next_handle: int = 0

    def step(self) -> tuple[str, int, dict[str, Any]] | None:
        """Run actions up to the next message (None: nothing to send yet)."""
        while self.actions:
            act = self.actions.pop(0)
            if act[0] == "compute":
                self.clock += act[1]
                if self.clock >= self.lease:
                    self.lease = INF_NS
                    self.blocked = bool(self.window)
                    return "clock", self.clock, {"block": self.blocked}
                continue
            if act[0] == "wait":
                self.blocked = True
                hs, self.handles = self.handles, []
                return "wait", self.clock, {"handles": hs, "until": INF_NS}
            self.next_handle += 1
            h = self.next_handle
            self.handles.append(h)
            if act[0] == "coll":
                return "coll", self.clock, dict(h=h, group=[0, 1], seq=act[1], kind="all_reduce", nbytes=S,
                                                dtype="bf16", root=None, name=f"ar{act[1]}", algo=None)  # fmt: skip
            _, peer, send, seq = act
            return "p2p", self.clock, dict(h=h, peer=peer, send=send, tag=0, seq=seq, nbytes=P, name=f"p2p{seq}")
        self.done = True
        return "finish", self.clock, {"results": {}, "cpu_s": 0.0}


def script(local: int, p2p: bool) -> list[tuple[Any, ...]]:
    acts: list[tuple[Any, ...]] = []
    for k in range(STEPS):
        acts += [("compute", COMPUTE), ("coll", k), ("wait",)]
        if p2p:
            acts += [("p2p", 1 - local, local == 0, k), ("wait",)]
    return acts


def run(
    seed: int,
    p2p: bool,
    window: int = 0,
    engine_for: Callable[[Topology], Any] = LoggedFlowSimulator,
    replies: list[tuple[Any, ...]] | None = None,
) -> tuple[CoordinatorCore, Any]:
    """Both jobs to the end, messages delivered in an order drawn from `seed` (`engine_for`: the engine;
    `replies`: gets each rank's replies, as (rank, type, t, fields), in the order each rank got them)."""
    rng = random.Random(seed)
    # global ranks 0, 1 (job a) and 2, 3 (job b); each job has one rank under each leaf
    topo = leaf_spine(2, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us").with_rank_order([0, 2, 1, 3])
    engine = engine_for(topo)
    ranks = [ScriptedRank(g, g % 2, script(g % 2, p2p), window, lease=window or INF_NS) for g in range(4)]

    def deliver(r: int, raw: bytes) -> None:
        msg = decode(raw)
        if replies is not None:
            replies.append((r, msg.type, msg.t, msg.fields))
        if msg.type == "result":
            ranks[r].blocked = False
            ranks[r].clock = max(ranks[r].clock, msg["t_done"] or 0)
            ranks[r].lease = msg["lease"]
        assert msg.type in ("result", "ack"), msg

    jobs = JobTable([{"name": "a", "offset": 0, "ranks": 2}, {"name": "b", "offset": 2, "ranks": 2}])
    algo = AlgoOptions(model="ideal")
    core = CoordinatorCore(engine, topo, 4, window_ns=window, algo=algo, send=deliver, jobs=jobs)

    while not core.all_finished():
        ready = [rs for rs in ranks if not rs.blocked and not rs.done]
        if not ready or rng.random() < 0.3:
            core.progress()
            continue
        rs = rng.choice(ready)
        sent = rs.step()
        if sent is not None:
            kind, t, fields = sent
            core.on_message(rs.rank, decode(encode(kind, t, **fields)))
    core.progress()
    return core, engine


def outcome(core: CoordinatorCore) -> list[tuple[Any, ...]]:
    return [
        (r.name, r.job, r.kind, r.t_start, r.end_ns, r.first_flow, r.key0, sorted(r.rank_done.items()))
        for r in core.records
    ]


@pytest.mark.parametrize("p2p", [False, True], ids=["all_reduce", "all_reduce+send_recv"])
def test_message_order_changes_nothing(p2p: bool) -> None:
    """Eight arrival orders: the same engine input and records; every collective of both jobs at its closed form."""
    runs = [run(seed, p2p) for seed in range(8)]
    logs = [eng.log for _, eng in runs]
    outs = [outcome(core) for core, _ in runs]
    assert all(log == logs[0] for log in logs[1:])
    assert all(out == outs[0] for out in outs[1:])
    core = runs[0][0]
    finals = [core.finalize()["collectives"] for core, _ in runs]
    assert all(f == finals[0] for f in finals[1:])
    # Both jobs' all-reduces (2 channels each way, 8 MiB per direction per job) share each uplink direction at
    # 100 Gb/s: 16 MiB at line rate, then four hops; a send/recv of each job shares it too: 2 MiB.
    ar = -(-2 * S * 8 * 10**9 // B) + HOPS * LAT
    tr = -(-2 * P * 8 * 10**9 // B) + HOPS * LAT
    step = COMPUTE + ar + (tr if p2p else 0)
    for rec in core.records:
        k = int(rec.name[-1])
        took = rec.end_ns - rec.t_start
        if rec.kind == "all_reduce":
            assert rec.t_start == k * step + COMPUTE
            assert abs(took - ar) <= 2
        else:
            assert rec.t_start == k * step + COMPUTE + ar
            assert abs(took - tr) <= 2
    # job a's records come first at each start: the order is (start, key), and a's group has the lower ranks
    starts = [(rec.t_start, rec.job) for rec in core.records]
    assert starts == sorted(starts)


@pytest.mark.parametrize("window", [5_000, 100_000])
def test_message_order_changes_nothing_in_window_mode(window: int) -> None:
    """Window mode launches what is complete once every rank is blocked: eight orders, one engine input."""
    runs = [run(seed, True, window) for seed in range(8)]
    assert all(eng.log == runs[0][1].log for _, eng in runs[1:])
    assert all(outcome(core) == outcome(runs[0][0]) for core, _ in runs[1:])
    assert any(rec.t_start > rec.t_requested for rec in runs[0][0].records)  # late starts: window mode indeed


@pytest.mark.parametrize("window", [0, 5_000, 100_000], ids=["exact", "5us", "100us"])
@pytest.mark.parametrize("p2p", [False, True], ids=["all_reduce", "all_reduce+send_recv"])
def test_rounds_and_replies_do_not_depend_on_message_order(p2p: bool, window: int) -> None:
    """The engine advances only while every rank is blocked, so what it knows then is the same in every arrival
    order: eight orders give the same number of advances and every rank the same replies (times, deliveries,
    the network's time). In exact mode that is one advance per time a waiting rank wakes at (every rank waits
    on each of its calls as soon as it issued it, and nothing else needs the network): each step's all-reduce,
    both jobs' ending together, and its send/recv."""
    runs = []
    for seed in range(8):
        replies: list[tuple[Any, ...]] = []
        core, _ = run(seed, p2p, window, replies=replies)
        per_rank = [[m[1:] for m in replies if m[0] == r] for r in range(4)]
        runs.append((core.rounds, core.messages, per_rank))
    assert all(r == runs[0] for r in runs[1:])
    if window == 0:
        wakes = {t for rec in core.records for t in rec.rank_done.values()}
        assert core.rounds == len(wakes) == STEPS * (2 if p2p else 1)


@pytest.mark.ns3
def test_packet_mode_figures_do_not_depend_on_message_order(ns3_lib: Any) -> None:
    """ns-3 with HPCC breaks the two jobs' symmetry (one job's packets reach a queue first), which is what made
    identical jobs trade figures between runs: four arrival orders, one set of per-job figures (and flows)."""
    from phantora.netsim.cli_config import packet_config_from_flags
    from phantora.netsim.packet import Ns3Simulator

    class LoggedNs3(Ns3Simulator):
        def __init__(self, topo: Topology) -> None:
            super().__init__(topo, packet_config_from_flags(cc="hpcc"))
            self.log: list[tuple[int, tuple[int, ...]]] = []

        def submit(self, flows: Sequence[Flow], at: int, dports: Any = None) -> None:
            self.log.append((at, tuple(f.id for f in flows)))
            super().submit(flows, at, dports)

    figures, logs = [], []
    for seed in range(4):
        core, eng = run(seed, True, engine_for=LoggedNs3)
        figures.append(outcome(core))
        logs.append(eng.log)
        eng.close()
    assert all(f == figures[0] for f in figures[1:]) and all(g == logs[0] for g in logs[1:])
    took = {job: [r[4] - r[3] for r in figures[0] if r[1] == job] for job in (0, 1)}
    assert took[0] != took[1]  # the jobs do differ in packet mode: the order decides which is which


def step_run(order: tuple[int, int], window: int) -> tuple[CoordinatorCore, list[tuple[int, str, int]]]:
    """Ranks 0 and 1 all-reduce at 0 and start step 1 at 3 us and 2 us, their reports arriving in `order`; a
    scenario takes a spine link down at step 1; ranks 2 and 3 finish at once. The core and every reply."""
    from phantora.netsim.faults import FaultyFlowSimulator
    from phantora.netsim.scenario import parse_scenario

    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps", latency="1us", nvswitch=False)
    sc = parse_scenario('reconvergence = "0ns"\n[[events]]\nkind = "link_down"\nat_step = 1\n'
                        'link = ["leaf0", "spine0"]\nduration = "50us"\n', "test.toml")  # fmt: skip
    sent: list[tuple[int, str, int]] = []
    core = CoordinatorCore(FaultyFlowSimulator(topo, sc), topo, 4, window_ns=window, algo=AlgoOptions(model="ideal"),
                           send=lambda r, raw: sent.append((r, decode(raw).type, decode(raw).t)))  # fmt: skip

    def msg(rank: int, type_: str, t: int, **fields: Any) -> None:
        core.on_message(rank, decode(encode(type_, t, **fields)))

    for r in (0, 1):
        msg(r, "coll", 0, h=1, group=[0, 1], seq=0, kind="all_reduce", nbytes=S, dtype="bf16", root=None,
            name="ar", algo=None)  # fmt: skip
    for r in order:
        msg(r, "clock", 3_000 - 1_000 * r, block=False, step=1)
    for r in order:
        msg(r, "wait", 3_000 - 1_000 * r, handles=[1], until=INF_NS)
    for r in (2, 3):
        msg(r, "finish", 0, results={}, cpu_s=0.0)
    core.progress()
    return core, sent


@pytest.mark.parametrize("window", [0, 5_000], ids=["exact", "5us"])
def test_a_step_event_applies_at_the_earliest_start_whatever_report_arrives_first(window: int) -> None:
    """The step's event applies at 2 us, the earlier of the two starts, in both arrival orders, and the run (records,
    replies, rounds) is the same in both."""
    runs = []
    for order in ((0, 1), (1, 0)):
        core, sent = step_run(order, window)
        assert core.steps_started == {1: 2_000}
        runs.append((outcome(core), sorted(sent), core.rounds))
    assert runs[0] == runs[1]
