"""Several sends to one peer in one NCCL group run in turn (in_turn.py, as tests/test_p2p_ops_in_turn.py checks on
NVLink hosts) on a described PCIe host, between SHM pairs of NCCL nodes with P2P off, and under rank
deduplication's shifted copies: operation k ends at the launch's base latency, then k + 1 steps of its protocol and
k + 1 operations' bytes at the pair's rate in its pass. Closed forms: with NCCL_P2P_DISABLE=1 a PCIe host's pairs
climb their switch's x16 Gen4 uplink, 24 GB/s, shared by the 8 pairs of a ring under one switch (3 GB/s each,
tests/test_grouped_p2p_pcie.py); an H100 fabric host's SHM pairs climb and descend their switch's x16 Gen5 uplink,
48 GB/s, shared by the pairs that cross it (tests/test_nccl_node_p2p.py); NCCL's Simple launch 8.4 us and a PCIe
Simple step 5.7 us, LL 6.6 and a NVLink LL step 0.6 (tuning.cc). Before, each operation ran side by side with its
pair's others, each rated as its pair's only one: all ended together."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.launch_group import LaunchGroup
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.nccl import choose
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.plan import CallSpec, CollectivePlanner
from phantora.netsim.base import Flow
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, dgx_host, pcie_host, rail_optimized

MiB, KiB = 1 << 20, 1 << 10
P2P_OFF = AlgoOptions(nccl_env=nccl_env({"NCCL_P2P_DISABLE": "1"}))
SIMPLE_US, PCI_STEP_US = 8.4, 5.7  # NCCL's Simple ring base latency and a Simple step over PCIe (tuning.cc)
LL_US, NVL_STEP_US = 6.6, 0.6  # LL's, and a LL step over NVLink
Op = tuple[int, int, int]  # (src, dst, bytes); a pair's in order


def launch(ops: list[Op]) -> LaunchGroup:
    """One group of `ops`, all issued at 0."""
    pairs = sorted({(a, b) for a, b, _ in ops})
    by = {p: [n for a, b, n in ops if (a, b) == p] for p in pairs}
    later = tuple((a, b, k, 0, n) for a, b in pairs for k, n in enumerate(by[(a, b)][1:], 1))
    return LaunchGroup(tuple(pairs), (0,) * len(pairs), tuple(by[p][0] for p in pairs), later=later)


def group_flows(topo: Topology, opts: AlgoOptions, comm: tuple[int, ...], ops: list[Op]) -> list[Flow]:
    """The flows of every operation of `ops` in one group, tagged `src>dst#k`."""
    g, flows, fid = launch(ops), [], 1
    for a, b in g.pairs:
        for k, (_, n) in enumerate(g.ops((a, b))):
            coll = Collective("send_recv", (a, b), n, "uint8", comm=comm, launch=g, launch_op=k)
            dag = decompose(coll, topo, opts, first_flow_id=fid, tag=f"{a}>{b}#{k}")
            fid = dag.next_id
            flows += dag.flows
    return flows


def op_ends(topo: Topology, flows: list[Flow]) -> dict[tuple[int, int, int], float]:
    """Each operation's end (us) on the idle flow network, by (src, dst, k)."""
    sim, ends = FlowSimulator(topo), {}
    sim.submit(flows, at=0)
    for c in sim.drain():
        a, b, k = (int(x) for x in c.tag.split("/")[0].replace(">", "#").split("#"))
        ends[(a, b, k)] = max(ends.get((a, b, k), 0.0), c.end_ns / 1000)
    return ends


def nccl_tests_us(topo: Topology, opts: AlgoOptions, nbytes: int, calls: int) -> float:
    """sendrecv_perf's model time of `calls` calls of `nbytes` in one group on every rank (`-m calls`)."""
    n = topo.num_ranks
    ring = tuple((r, (r + 1) % n) for r in range(n))
    got = choose(Collective("send_recv", (0, 1), nbytes, "fp32", None, tuple(range(n)), ring, group_calls=calls),
                 topo, opts)  # fmt: skip
    assert got is not None
    return got.time_us


def test_a_pcie_hosts_ring_runs_each_pairs_operations_in_turn() -> None:
    """8 PCIe GPUs under one switch, P2P off, a ring of 3 x 4 MiB to the next rank: operation k ends at 8.4 + (k +
    1) x (5.7 + 4 MiB at 3 GB/s) us, the last at sendrecv_perf -m 3's time; before, all three at 3 GB/s / 3 side
    by side, ending together."""
    topo = pcie_host(8)
    n = 8
    ends = op_ends(topo, group_flows(topo, P2P_OFF, tuple(range(n)), [(r, (r + 1) % n, 4 * MiB) for r in range(n)] * 3))
    assert len(ends) == 24
    bytes_us = 4 * MiB / 3e3
    for (_, _, k), end in ends.items():
        assert end == pytest.approx(SIMPLE_US + (k + 1) * (PCI_STEP_US + bytes_us), abs=0.002)
    assert max(ends.values()) == pytest.approx(nccl_tests_us(topo, P2P_OFF, 4 * MiB, 3), abs=0.002)


def test_a_pcie_hosts_later_operation_alone_in_its_pass_takes_the_uplink() -> None:
    """The same ring with a second 4 MiB from rank 0 to 1: pass 1 holds it alone, so it climbs the uplink at 24 GB/s,
    a step after the ring's operations end at 3 GB/s."""
    topo = pcie_host(8)
    ring = [(r, (r + 1) % 8, 4 * MiB) for r in range(8)]
    ends = op_ends(topo, group_flows(topo, P2P_OFF, tuple(range(8)), [*ring, (0, 1, 4 * MiB)]))
    first = SIMPLE_US + PCI_STEP_US + 4 * MiB / 3e3
    assert ends[(0, 1, 0)] == pytest.approx(first, abs=0.002)
    assert ends[(0, 1, 1)] == pytest.approx(first + PCI_STEP_US + 4 * MiB / 24e3, abs=0.002)


def test_a_pcie_hosts_ring_with_p2p_on_takes_nccl_tests_group_time() -> None:
    """4 PCIe GPUs, P2P on, a ring of 4 x 8 KiB LL: the operations one PCIe LL step (1.0 us) and one operation's
    bytes apart after NCCL's LL launch, the last at sendrecv_perf -m 4's time (before: all at -m 1's)."""
    topo = pcie_host(4)
    ops = [(r, (r + 1) % 4, 8 * KiB) for r in range(4)] * 4
    ends = op_ends(topo, group_flows(topo, AlgoOptions(), (0, 1, 2, 3), ops))
    one = nccl_tests_us(topo, AlgoOptions(), 8 * KiB, 1)
    bytes_us = one - LL_US - 1.0
    for (_, _, k), end in ends.items():
        assert end == pytest.approx(LL_US + (k + 1) * (1.0 + bytes_us), abs=0.002)
    assert max(ends.values()) == pytest.approx(nccl_tests_us(topo, AlgoOptions(), 8 * KiB, 4), abs=0.002)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["pcie", "shm"])
def test_a_ring_past_the_plan_budget_pays_a_launch_a_plan(where: str) -> None:
    """A ring of 300 x 8 B (LL) on 4 PCIe GPUs with P2P on, and inside socket 0 of an H100 fabric host over SHM:
    a PCIe peer's most channels are 2 (paths.cc "PCIe connection"), so a plan holds 254 - 2 + 1 = 253 operations
    (tests/test_nccl_p2p_plans.py); each rank's send and receive share round 1, one operation a pass. Operation k
    ends one PCIe LL step (1.0 us) and one operation's bytes after k - 1, and 253 a launch (6.6 us) more: NCCL's
    second plan (before: no cut). On PCIe the last ends at sendrecv_perf -m 300's time. Over SHM the 8 ranks of
    the host with P2P off are two NCCL nodes of 4 (each rank's ring first rank, init.cc; 8c781359), so the ring of
    ranks 0-3 is inside node 0 and its rounds are the PCIe host's: rank 0 sends to 1 and receives from 3 in round 1
    (local delta 1), one operation a pass, cut at 253 as there (before 8c781359 numbered hosts, rank 0 received from
    3 in round 5 of an 8-rank node, and pair 3 -> 0 was cut a pass earlier, at 252)."""
    if where == "pcie":
        topo, opts, comm = pcie_host(4), AlgoOptions(), (0, 1, 2, 3)
    else:
        topo, opts, comm = rail_optimized(1, 8, 2, gpu="h100", nic_rate="400Gbps"), P2P_OFF, tuple(range(8))
    ends = op_ends(topo, group_flows(topo, opts, comm, [(r, (r + 1) % 4, 8) for r in range(4)] * 300))
    per_plan = (4096 - 32) // 16 - 2 + 1
    first, step = ends[(0, 1, 0)], (ends[(0, 1, per_plan - 1)] - ends[(0, 1, 0)]) / (per_plan - 1)
    assert first == pytest.approx(LL_US + step, abs=0.002) and 1.0 < step < 1.01  # a step and 8 B's bytes
    assert len(ends) == 4 * 300
    for (a, b, k), end in ends.items():
        assert end == pytest.approx(first + k * step + (k >= per_plan) * LL_US, abs=0.003), (a, b, k)
    if where == "pcie":
        assert max(ends.values()) == pytest.approx(nccl_tests_us(topo, opts, 8, 300), abs=0.003)


def test_shm_pairs_of_nccl_nodes_run_each_pairs_operations_in_turn() -> None:
    """8 H100s of one fabric host, P2P off (its sockets are NCCL nodes), on the 8-rank communicator: a ring inside
    socket 0 (0 -> 1 -> 2 -> 3 -> 0), 3 x 4 MiB a pair over SHM. Each switch's uplink carries two pairs each way,
    48 / 2 = 24 GB/s a pair: operation k ends at 8.4 + (k + 1) x (5.7 + 4 MiB at 24 GB/s); then a fourth from 0 to
    1, alone in its pass: its switch's uplink both ways, 48 GB/s."""
    topo = rail_optimized(1, 8, 2, gpu="h100", nic_rate="400Gbps")
    ring = [(r, (r + 1) % 4, 4 * MiB) for r in range(4)]
    flows = group_flows(topo, P2P_OFF, tuple(range(8)), [*ring * 3, (0, 1, 4 * MiB)])
    ends = op_ends(topo, flows)
    per_op = PCI_STEP_US + 4 * MiB / 24e3
    for (a, b, k), end in ends.items():
        if k < 3:
            assert end == pytest.approx(SIMPLE_US + (k + 1) * per_op, abs=0.002), (a, b, k)
    assert ends[(0, 1, 3)] == pytest.approx(SIMPLE_US + 3 * per_op + PCI_STEP_US + 4 * MiB / 48e3, abs=0.002)
    coll = Collective("send_recv", (0, 1), 4 * MiB, "uint8", comm=tuple(range(8)), launch=launch(ring), launch_op=0)
    got = choose(coll, topo, P2P_OFF)
    assert got is not None and dict(got.transport) == {"SHM": 1}


def test_shifted_copies_run_each_pairs_operations_in_turn() -> None:
    """Rank deduplication, 2 live ranks for 4 H100s: the live pairs 0 -> 1 and 1 -> 2 of a ring of 4 x 8 KiB stand
    for 2 -> 3 and 3 -> 0 as well, the ring's shifted copies. Every copy's operation k ends at NCCL's LL launch and
    k + 1 LL steps and operations' bytes, as without deduplication (before: all at one operation's end)."""
    topo, comm = dgx_host(4, gpu="h100"), (0, 1, 2, 3)
    one = nccl_tests_us(topo, AlgoOptions(), 8 * KiB, 1)
    bytes_us = one - LL_US - NVL_STEP_US
    ends: dict[tuple[int, int, int], float] = {}
    for live in (2, 4):
        planner = CollectivePlanner(topo, AlgoOptions(), Mirrors(4, live))
        g = launch([(r, (r + 1) % 4, 8 * KiB) for r in range(live)] * 4)
        flows = []
        for a, b in g.pairs:
            for k in range(4):
                call = CallSpec("send_recv", (a, b), 8 * KiB, "uint8", comm=comm, launch=g, launch_op=k)
                flows += planner.plan(call, f"s{k}").flows
        sim = FlowSimulator(topo)
        sim.submit(flows, at=0)
        got: dict[tuple[int, int, int], float] = {}
        for c in sim.drain():
            name, pair = c.tag.split("/")[0].split("@")
            a, b = (int(x) for x in pair.split(">"))
            got[(a, b, int(name[1:]))] = max(got.get((a, b, int(name[1:])), 0.0), c.end_ns / 1000)
        assert len(got) == 16
        for k3, end in got.items():
            assert end == pytest.approx(LL_US + (k3[2] + 1) * (NVL_STEP_US + bytes_us), abs=0.002), (live, k3)
        ends = ends or got
        assert got == ends


@pytest.mark.ns3
@pytest.mark.parametrize("where", ["pcie", "shm"])
def test_operations_in_turn_take_the_closed_forms_through_ns3(ns3_lib, where: str) -> None:
    """The PCIe and SHM rings of 3 x 1 MiB and a fourth from 0 to 1, through ns-3 (one connection's messages in
    turn): the last ends within 0.1 % of the flow engine's, which is the closed form (the rates as above)."""
    from tests.engine_pair import flow_and_ns3_end_ns

    topo, m, ring_rate, alone = (
        (pcie_host(8), 8, 3e3, 24e3)
        if where == "pcie"
        else (rail_optimized(1, 8, 2, gpu="h100", nic_rate="400Gbps"), 4, 24e3, 48e3)
    )
    ring = [(r, (r + 1) % m, MiB) for r in range(m)]
    times = flow_and_ns3_end_ns(topo, group_flows(topo, P2P_OFF, tuple(range(8)), [*ring * 3, (0, 1, MiB)]))
    want = SIMPLE_US + 3 * (PCI_STEP_US + MiB / ring_rate) + PCI_STEP_US + MiB / alone
    assert times["flow"] / 1000 == pytest.approx(want, abs=0.002)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.001)


LIVE = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(me % torch.cuda.device_count())
    M, BASE, K = {m}, me - me % {m}, {nbytes} // 4  # a ring of M ranks from BASE, K fp32 elements an operation
    nxt, prv = BASE + (me + 1) % M, BASE + (me - 1) % M
    xs = [torch.full((K,), float(me), device="cuda") for _ in range(4)]
    ys = [torch.empty(K, device="cuda") for _ in range(4)]
    ops = []
    if me < {ring_ranks}:
        extra = int(me % M == 0), int(me % M == 1)  # rank 0 sends a fourth to 1
        ops = [dist.P2POp(dist.isend, x, nxt) for x in xs[: 3 + extra[0]]]
        ops += [dist.P2POp(dist.irecv, y, prv) for y in ys[: 3 + extra[1]]]
    dist.barrier()
    torch.cuda.synchronize()
    if ops:
        for q in dist.batch_isend_irecv(ops):
            q.wait()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""


def live_and_replayed(tmp_path, topo: Topology, nproc: int, m: int, ring_ranks: int, nbytes: int, **kw) -> tuple:
    """LIVE run live and recorded: each transfer's (src, dst, k) -> end us after its pair's start (a rank issuing more
    calls launches later), the live ends (name, src, dst, ns) and the recording's flow replay's."""
    import json
    import textwrap

    from phantora.egraph import replay_graph
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig

    script = tmp_path / "ops.py"
    script.write_text(textwrap.dedent(LIVE).format(m=m, ring_ranks=ring_ranks, nbytes=nbytes))
    cfg = RunConfig(str(script), topology=topo, nproc=nproc, tensors="phantom", trace="none", timeout_s=600,
                    out_dir=str(tmp_path / "o"), **kw)  # fmt: skip
    _, graph = record_run(cfg, tmp_path / "g")
    recs = [
        r for r in json.loads((tmp_path / "o" / "cosim.json").read_text())["collectives"] if r["kind"] == "send_recv"
    ]
    ends: dict[tuple[int, int, int], float] = {}
    for a, b in {tuple(r["group"]) for r in recs}:
        mine = sorted((r["end_ns"], r["t_start"]) for r in recs if tuple(r["group"]) == (a, b))
        ends.update({(a, b, k): (e - mine[0][1]) / 1000 for k, (e, _) in enumerate(mine)})
    live = sorted((r["name"].split("@")[0], *r["group"], r["end_ns"]) for r in recs)
    res = replay_graph(graph, topo, FlowSimulator(topo))
    got: dict[tuple[str, int, int], int] = {}
    for c in res.completions:
        if "/p2p" in c.tag:
            name, pair = c.tag.split("/")[0].split("@")
            src, dst = (int(x) for x in pair.split(">"))
            got[(name, src, dst)] = max(got.get((name, src, dst), 0), c.end_ns)
    return ends, live, sorted((*k, e) for k, e in got.items())


@pytest.mark.slow
def test_live_pcie_and_shm_rings_run_in_turn_and_replay_so(tmp_path) -> None:
    """Live batch_isend_irecv rings with NCCL_P2P_DISABLE=1, 3 x 4 MiB to the next rank and a fourth from rank 0 to
    1: on 8 PCIe GPUs under one switch (3 GB/s a pair in the ring's passes, 24 alone) and inside socket 0 of an H100
    fabric host (SHM, 24 GB/s a pair, 48 alone), each operation ends as the closed forms above, and the recording
    replays every transfer to its live ns. Slow: two live 8-rank runs."""
    env = {"NCCL_P2P_DISABLE": "1"}
    for name, topo, m, ring_rate, alone in (
        ("pcie", pcie_host(8), 8, 3e3, 24e3),
        ("shm", rail_optimized(1, 8, 2, gpu="h100", nic_rate="400Gbps"), 4, 24e3, 48e3),
    ):
        (tmp_path / name).mkdir()
        ends, live, replayed = live_and_replayed(tmp_path / name, topo, 8, m, m, 4 * MiB, env=env)
        assert len(ends) == 3 * m + 1, name
        per_op = PCI_STEP_US + 4 * MiB / ring_rate
        for (a, b, k), end in ends.items():
            if k < 3:
                assert end == pytest.approx(SIMPLE_US + (k + 1) * per_op, abs=0.002), (name, a, b, k)
        assert ends[(0, 1, 3)] == pytest.approx(SIMPLE_US + 3 * per_op + PCI_STEP_US + 4 * MiB / alone, abs=0.002)
        assert replayed == live, name


@pytest.mark.slow
def test_a_deduplicated_live_ring_runs_in_turn_and_replays_as_every_rank(tmp_path) -> None:
    """16 H100s on testbed16 (2 hosts of 8), rank deduplication (8 live processes, each standing for the rank 8
    above): a ring inside each host on the world communicator, 3 x 8 KiB to the next rank and a fourth from 0 to 1
    (and, mirrored, from 8 to 9). Every pair's operations end one NVLink LL step and one operation's bytes apart
    after NCCL's LL launch, host 1's copies as host 0's, and the recording (extended to every rank) replays every
    transfer to its live ns with no deduplication. Slow: a live run."""
    from phantora.topology.loader import load_topology

    topo = load_topology("testbed16")
    ends, live, replayed = live_and_replayed(tmp_path, topo, 16, 8, 8, 8 * KiB, dedup="auto")
    assert {a for a, _, _ in ends} == set(range(8))  # the live ranks' records
    bytes_us = ends[(2, 3, 0)] - LL_US - NVL_STEP_US
    for (a, b, k), end in ends.items():
        if k < 3:
            assert end == pytest.approx(LL_US + (k + 1) * (NVL_STEP_US + bytes_us), abs=0.002), (a, b, k)
    assert ends[(0, 1, 3)] > ends[(0, 1, 2)] + NVL_STEP_US  # alone in its pass: its own rate
    mirrored = {(n, a % 8, b % 8, e) for n, a, b, e in replayed if a >= 8}
    assert {(n, a, b, e) for n, a, b, e in replayed if a < 8} == set(live) == mirrored
