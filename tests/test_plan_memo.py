"""A live run's repeated collectives are copied from their first decomposition (`plan_memo.PlanMemo`): the same
flows, ids, tags, deps, choices and message counters as decomposing each call afresh, and a fresh decomposition
whenever anything that changes the plan differs (bytes, communicator, NCCL_* variables, the queue pairs' turn, the
topology)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core import DONE, CoordinatorCore
from bridge.protocol import decode, encode
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.plan import CallSpec, CollectivePlanner, Plan
from phantora.collectives.spec import AlgoOptions
from phantora.netsim.base import Flow
from phantora.netsim.faults import FaultyFlowSimulator
from phantora.netsim.scenario import parse_scenario
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

N = 4
S = 2**20
RING = (("NCCL_ALGO", "Ring"),)  # (the tuner's pick here is NVLS-Tree: a few flows, no steps to chain)
QPS2 = (*RING, ("NCCL_IB_QPS_PER_CONNECTION", "2"))  # a connection's messages on its 2 queue pairs in turn


def fabric() -> Topology:
    """2 hosts of 2 GPUs (NVSwitch inside), a leaf each, 2 spines: NVLink and network steps."""
    return leaf_spine(2, 2, 2, nic_rate="100Gbps", latency="1us", gpus_per_host=2)


def chunked(env: tuple[tuple[str, str], ...] = RING) -> AlgoOptions:
    return AlgoOptions(granularity="chunked", nccl_env=env)


def planners(topo: Topology, algo: AlgoOptions) -> tuple[CollectivePlanner, CollectivePlanner]:
    """(memo on, memo off) on `topo`."""
    return CollectivePlanner(topo, algo, Mirrors(N, N)), CollectivePlanner(topo, algo, Mirrors(N, N), memo=False)


def same(a: Plan, b: Plan) -> None:
    assert a.flows == b.flows  # every field: ids, ends, bytes, deps, delays, tags, caps, connections, queues
    assert a.last == b.last and a.choice == b.choice and a.copies == b.copies


def plan_both(on: CollectivePlanner, off: CollectivePlanner, call: CallSpec, tag: str) -> Plan:
    got = on.plan(call, tag)
    same(got, off.plan(call, tag))
    assert on.sent == off.sent and on.next_flow == off.next_flow
    return got


def call(nbytes: int = S, group: tuple[int, ...] = (0, 1, 2, 3), kind: str = "all_reduce", **algo: Any) -> CallSpec:
    return CallSpec(kind, group, nbytes, "bf16", algo=algo)


def test_a_repeat_is_copied_to_its_ids_and_tag() -> None:
    on, off = planners(fabric(), chunked())
    first = plan_both(on, off, call(), "all_reduce#0")
    again = plan_both(on, off, call(), "all_reduce#1")
    assert on.memo is not None and (on.memo.misses, on.memo.copies) == (1, 1)
    assert again.flows[0].id == first.flows[-1].id + 1 and again.flows[0].tag.startswith("all_reduce#1@0-3/")
    assert any(f.deps for f in again.flows) and len(again.flows) == len(first.flows) > 100  # chunked: NCCL's steps


def test_other_bytes_or_another_communicator_miss() -> None:
    on, off = planners(fabric(), chunked())
    plan_both(on, off, call(), "a")
    plan_both(on, off, call(2 * S), "b")
    plan_both(on, off, call(group=(0, 2)), "c")
    plan_both(on, off, call(group=(1, 3)), "d")
    assert on.memo is not None and (on.memo.misses, on.memo.copies) == (4, 0)
    plan_both(on, off, call(2 * S), "e")
    assert (on.memo.misses, on.memo.copies) == (4, 1)


def test_nccl_variables_set_between_calls_miss() -> None:
    """A program that sets NCCL_ALGO between two calls of the same bytes (the call's `nccl_env`) gets the other
    algorithm's plan, then the first one's again from the memo."""
    on, off = planners(fabric(), chunked())
    ring = plan_both(on, off, call(), "a")
    tree = plan_both(on, off, call(nccl_env=(("NCCL_ALGO", "Tree"),)), "b")
    assert ring.choice is not None and tree.choice is not None
    assert ring.choice["algorithm"] == "Ring" and tree.choice["algorithm"] == "Tree"
    assert on.memo is not None and (on.memo.misses, on.memo.copies) == (2, 0)
    plan_both(on, off, call(), "c")
    assert (on.memo.misses, on.memo.copies) == (2, 1)


@pytest.mark.parametrize(("kind", "posts", "misses"), [("all_reduce", 6, 1), ("all_gather", 3, 2)])
def test_queue_pairs_in_turn_copy_when_the_counters_agree_and_move_them(kind: str, posts: int, misses: int) -> None:
    """NCCL_IB_QPS_PER_CONNECTION=2: message k of a connection goes on queue pair k mod 2. A repeat is copied only
    when every connection it posts to stands where the first one's did (mod 2), and moves the counters as the first
    did. A 4-rank ring's all-reduce posts 2(n-1) = 6 messages a connection: every repeat is copied; an all-gather
    posts n-1 = 3: the second call starts on the other queue pairs (decomposed), the third as the first (copied)."""
    on, off = planners(fabric(), chunked(QPS2))
    plans = [plan_both(on, off, call(kind=kind), f"{kind}#{i}") for i in range(3)]
    assert len({f.conn for f in plans[0].flows if f.conn}) > 1  # both queue pairs
    assert set(on.sent.values()) == {3 * posts}  # each of the ring's network connections
    assert on.memo is not None and (on.memo.misses, on.memo.copies) == (misses, 3 - misses)
    same_qps = [f.conn for f in plans[1].flows] == [f.conn for f in plans[0].flows]
    assert same_qps == (misses == 1)  # 3 messages a connection: the next call's go on the other queue pairs


def test_the_process_nccl_variables_are_read_where_the_options_hold_none(monkeypatch: pytest.MonkeyPatch) -> None:
    on, off = planners(fabric(), AlgoOptions(granularity="chunked"))
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    ring = plan_both(on, off, call(), "a")
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    tree = plan_both(on, off, call(), "b")
    assert ring.choice is not None and tree.choice is not None and ring.choice["algorithm"] == "Ring"
    assert tree.choice["algorithm"] == "Tree" and on.memo is not None and on.memo.misses == 2


def test_another_topology_misses() -> None:
    """The planner's topology replaced (here one without an uplink: other routes) plans afresh on it."""
    topo = fabric()
    on, off = planners(topo, chunked())
    plan_both(on, off, call(), "a")
    down = topo.with_links_down({topo.links[-1].id})
    on.topology = off.topology = down
    plan_both(on, off, call(), "b")
    assert on.memo is not None and on.memo.topo is down and (on.memo.misses, on.memo.copies) == (1, 0)


class Recording(FaultyFlowSimulator):
    """The flow engine under a scenario, keeping every flow submitted to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submitted: list[Flow] = []

    def submit(self, flows: Any, at: int) -> None:
        flows = list(flows)
        self.submitted += flows
        super().submit(flows, at)


def live(
    memo: bool, env: tuple[tuple[str, str], ...]
) -> tuple[list[Flow], list[Any], dict[int, list[int]], CoordinatorCore]:
    """Ranks calling the same chunked all-reduce three times, one of another size, an all-gather three times, then
    the first all-reduce again, an uplink down (and up) among them: (flows submitted, completions, each call's end,
    the coordinator)."""
    topo = fabric()
    leaf = next(n.name for n in topo.nodes if n.name.startswith("leaf"))
    spine = next(n.name for n in topo.nodes if n.name.startswith("spine"))
    sc = parse_scenario(
        f'reconvergence = "0ns"\n[[events]]\nkind = "link_down"\nat = "200us"\nduration = "300us"\n'
        f'link = ["{leaf}", "{spine}"]\n',
        "memo.toml",
    )
    engine = Recording(topo, sc)
    replies: dict[int, list[Any]] = {r: [] for r in range(N)}
    send = lambda r, raw: replies[r].append(decode(raw))  # noqa: E731
    core = CoordinatorCore(engine, topo, N, window_ns=0, algo=chunked(env), send=send)
    if not memo:
        core.planner.memo = None
    every = (0, 1, 2, 3)
    calls = [("all_reduce", S)] * 3 + [("all_reduce", S // 2)] + [("all_gather", S)] * 3 + [("all_reduce", S)]
    issued = dict.fromkeys(every, 0)
    ends: dict[int, list[int]] = {r: [] for r in every}  # each rank's calls' ends, in order
    for _ in range(100 * len(calls)):
        for r in every:  # a rank whose last call is done issues its next 1 us later and waits for it
            h = issued[r]
            if h > len(ends[r]):  # call h in flight
                got = [m["t_done"] for m in replies[r] if m.type == "result" and m["h"] == h]
                if not got:
                    continue
                ends[r].append(got[0])
            if h < len(calls):
                (kind, nbytes), t = calls[h], ends[r][-1] + 1000 if ends[r] else 0
                issued[r] = h + 1
                fields = {"group": list(every), "seq": h, "kind": kind, "nbytes": nbytes, "dtype": "bf16"}
                core.on_message(r, decode(encode("coll", t, h=h + 1, root=None, name="", algo=None, **fields)))
                core.on_message(r, decode(encode("wait", t, handles=[h + 1], until=2**62)))
            elif h == len(ends[r]) and core.ranks[r].state != DONE:  # its last call done: it finishes
                core.on_message(r, decode(encode("finish", ends[r][-1], results={}, cpu_s=0.0)))
        if all(len(e) == len(calls) for e in ends.values()):
            break
        core.progress()
    return engine.submitted, list(core.completions), ends, core


@pytest.mark.parametrize("env", [RING, QPS2], ids=["one-qp", "qps-in-turn"])
def test_a_live_run_gives_the_same_flows_with_the_memo_on_and_off(env: tuple[tuple[str, str], ...]) -> None:
    flows, done, ends, core = live(True, env)
    flows_off, done_off, ends_off, _ = live(False, env)
    assert flows == flows_off and done == done_off and ends == ends_off
    assert core.planner.memo is not None and core.planner.memo.copies >= 2
    assert bool(core.planner.sent) == (env == QPS2)  # (queue pairs in turn: the counters moved)
    assert all(len(e) == 8 for e in ends.values()) and core.engine.stats()["rerouted_flows"] > 0  # (across the failure)
