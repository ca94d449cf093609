"""A user's NCCL groups of sends and receives (batch_isend_irecv, a coalescing block) recorded and replayed as the
live run rated them: one group on the group's communicator, each pair from where its two ends issued.

8 H100s of one host (`--phantom`): 32 p2p channels over 8 ranks give a peer 4 channels (paths.cc), the rounds' bases
are distinct (bit-reversed), so a GPU with k sends (receives) in flight moves each on 4 channels of
`channel_links(k)` NVLinks: 1 with one peer, 0.5 with all 7, linear between (docs/collectives.md). A transfer takes
NCCL's launch and step latency (Simple over NVLink: ring base 6.8 + hop 5 = 11.8 us) plus its bytes over its rate,
set again as the GPU's transfers start and end. Before, the recording kept no group launch: each pair replayed alone
on its pair's own 2-rank communicator (16 channels at a link each: a 16 MiB ring pair in 62.7 us against 215.4 live).
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import msgpack
import pytest
from forked_replay import replay_ranks

from phantora.egraph import ExecGraph, replay_graph
from phantora.egraph.builder import ProgramBuilder, build_graph
from phantora.egraph.chakra import export_chakra, read_chakra
from phantora.egraph.format import LAUNCH_ISSUE, LAUNCH_RELEASE, P2P, T_P2P_GROUP, load, save
from phantora.egraph.live import record_run
from phantora.egraph.p2p_launches import Grouped, LaunchGroups
from phantora.errors import InputError
from phantora.launcher import RunConfig
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host

SCRIPT = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    dev = me % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    MiB = {unit}  # fp32 elements (1 << 18: a MiB)
    local, base = me % {period}, me - me % {period}  # the program repeats every {period} ranks

    def stagger():  # compute that grows with the rank: the ranks issue the next batch apart
        a = torch.ones(512 * (1 + local), 1024, device="cuda")
        a @ a.T

    def batch(ops):
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        torch.cuda.synchronize()

    def fence():
        dist.barrier()
        torch.cuda.synchronize()

    x, y = torch.ones(16 * MiB, device="cuda"), torch.empty(16 * MiB, device="cuda")
    g, h = torch.empty(8 * MiB, device="cuda"), torch.ones(8 * MiB, device="cuda")
    z = torch.ones(24 * MiB, device="cuda")
    fence()
    stagger()
    batch([dist.P2POp(dist.isend, x, (me + 1) % n), dist.P2POp(dist.irecv, y, (me - 1) % n)])  # a ring
    fence()
    peer = me ^ 1  # pipeline stages: send forward 16 MiB and receive backward 8 MiB in one batch
    if me % 2 == 0:
        batch([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, g, peer)])
    else:
        batch([dist.P2POp(dist.irecv, y, peer), dist.P2POp(dist.isend, h, peer)])
    fence()
    stagger()
    if local == 0:  # a fan-out whose receivers issue apart
        batch([dist.P2POp(dist.isend, h, base + j) for j in (1, 2, 3)])
    elif local <= 3:
        batch([dist.P2POp(dist.irecv, g, base)])
    fence()
    with dist._coalescing_manager(device=torch.device("cuda", dev)):  # a coalescing block: the reversed ring
        dist.isend(h, (me - 1) % n)
        dist.irecv(g, (me + 1) % n)
    torch.cuda.synchronize()
    fence()
    first = []  # a long transfer on the world's NCCL stream, not waited for: the rank's next batch waits behind it
    if local == 0:
        first = dist.batch_isend_irecv([dist.P2POp(dist.isend, z, base + 1)])
    elif local == 1:
        first = dist.batch_isend_irecv([dist.P2POp(dist.irecv, z, base)])
    late = []  # a fan-out whose receive on `base` is held behind that transfer there
    if local == 2:
        late = dist.batch_isend_irecv([dist.P2POp(dist.isend, h, base + j) for j in (0, 3, 4)])
    elif local in (0, 3, 4):
        late = dist.batch_isend_irecv([dist.P2POp(dist.irecv, g, base + 2)])
    for q in first + late:
        q.wait()
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""
TOPO = dgx_host(8, gpu="h100")
LINK, LAT_NS, MiB = 20.6, 11_800, 1 << 20  # GB/s a link (bytes per ns), ns, bytes


def links(k: int, peers: int = 7) -> float:
    """`channel_links(k)`: NVLinks a channel with k peers in flight, 1 at one peer and 0.5 at all."""
    return 1.0 - 0.5 * (k - 1) / (peers - 1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], ExecGraph]:
    """The live run's transfer records (cosim.json) and its recording."""
    d = tmp_path_factory.mktemp("batches")
    script = d / "batches.py"
    script.write_text(textwrap.dedent(SCRIPT).format(unit=1 << 18, period=8))
    cfg = RunConfig(str(script), topology=TOPO, nproc=8, tensors="phantom", trace="none", timeout_s=180,
                    out_dir=str(d / "o"))  # fmt: skip
    _, graph = record_run(cfg, d / "g")
    recs = json.loads((d / "o" / "cosim.json").read_text())["collectives"]
    return [r for r in recs if r["kind"] == "send_recv"], graph


def _key(name: str, src: int, dst: int) -> tuple[str, int, int]:
    return name.split("@")[0], src, dst


def replayed_ends(graph: ExecGraph) -> dict[tuple[str, int, int], int]:
    """Each transfer's end ns in a flow-mode replay, by (call, src, dst) as the live records name it."""
    res = replay_graph(graph, TOPO, FlowSimulator(TOPO))
    ends: dict[tuple[str, int, int], int] = {}
    for c in res.completions:
        if "/p2p" in c.tag:
            name, pair = c.tag.split("/")[0].split("@")
            src, dst = (int(x) for x in pair.split(">"))
            ends[_key(name, src, dst)] = max(ends.get(_key(name, src, dst), 0), c.end_ns)
    return ends


def test_batches_replay_to_their_live_ns(recorded: tuple[list[dict], ExecGraph], tmp_path) -> None:
    """Every transfer of the ring, the pipeline pairs, the fan-out and the coalescing block ends in the replay, and
    after a Chakra round trip, at its live ns; each ran on the 8-rank communicator, 4 channels a peer."""
    recs, graph = recorded
    assert len(recs) == 8 + 8 + 3 + 8 + 4
    assert {tuple(r["comm"]) for r in recs} == {tuple(range(8))}
    assert {r["nccl"]["channels"] for r in recs} == {4}
    live = {_key(r["name"], *r["group"]): r["end_ns"] for r in recs}
    export_chakra(graph, tmp_path / "chakra")
    for g in (graph, read_chakra(tmp_path / "chakra")):
        assert replayed_ends(g) == live


def test_ring_and_pipeline_pairs_move_a_link_a_channel(recorded: tuple[list[dict], ExecGraph]) -> None:
    """In the ring and the pipeline batches each GPU has one send and one receive in flight: 4 channels at a link."""
    recs = recorded[0]
    ring = [r for r in recs if r["nbytes"] == 16 * MiB and (r["group"][1] - r["group"][0]) % 8 == 1]
    assert len(ring) == 8 + 4  # the ring's and the even stages' forward sends
    for r in ring:
        assert r["end_ns"] - r["t_start"] == pytest.approx(LAT_NS + 16 * MiB / (4 * LINK), abs=2)
    back = [r for r in recs if r["name"] == "send#0" and r["group"][0] == r["group"][1] + 1 and r["group"][0] % 2]
    assert len(back) == 4 and {r["nbytes"] for r in back} == {8 * MiB}
    for r in back:
        assert r["end_ns"] - r["t_start"] == pytest.approx(LAT_NS + 8 * MiB / (4 * LINK), abs=2)


def fan_out_ends(starts: list[float], nbytes: int) -> list[float]:
    """Closed form of rank 0's sends started at `starts` (ns): while k are in flight each moves 4 channels at
    `links(k)` a link (its receiver, one peer, is faster), rates set again at each start and end."""
    left, ends, t = [float(nbytes)] * len(starts), [0.0] * len(starts), min(starts)
    while not all(ends):
        run = [i for i, s in enumerate(starts) if s <= t and not ends[i]]
        rate = 4 * LINK * links(len(run))
        nxt = min([s for s in starts if s > t] + [t + left[i] / rate for i in run])
        for i in run:
            left[i] -= rate * (nxt - t)
            if left[i] <= 1e-6:
                ends[i] = nxt
        t = nxt
    return ends


def test_a_staggered_fan_out_is_rated_from_each_pairs_start(recorded: tuple[list[dict], ExecGraph]) -> None:
    """Rank 0's sends to 1-3 start as their receivers issue (later with each rank): the first runs alone at a link
    a channel, then shares the GPU's sends, and the replay rates it so (before, the replay started a call's pairs
    together: all three at `links(3)` from the first start)."""
    fan = [r for r in recorded[0] if r["group"][0] == 0 and r["group"][1] in (1, 2, 3) and r["nbytes"] == 8 * MiB]
    recs = sorted(fan, key=lambda r: r["t_start"])
    assert [r["group"][1] for r in recs] == [1, 2, 3]
    starts = [r["t_start"] for r in recs]
    assert starts[0] < starts[1] < starts[2]
    for r, end in zip(recs, fan_out_ends(starts, 8 * MiB), strict=True):
        assert r["end_ns"] == pytest.approx(LAT_NS + end, abs=3)


def test_a_pair_held_behind_its_stream_is_unknown_to_those_launched_before(
    recorded: tuple[list[dict], ExecGraph],
) -> None:
    """Rank 2 sends 8 MiB to ranks 0, 3 and 4 in one batch; rank 0's receive waits on its NCCL stream behind a 24 MiB
    transfer to rank 1 it issued just before. Live the coordinator parks that pair until the transfer ends there, so
    the pairs to 3 and 4 are rated with each other only (2 of rank 2's sends in flight), and the pair to 0 starts
    where that transfer ends, alone by then; the replay rates them so (test_batches_replay_to_their_live_ns; before,
    it counted the pair to 0 as known from its ranks' last joins, starting at their issues: 1 of these 4 transfers at
    its live ns)."""
    fan = [r for r in recorded[0] if r["group"][0] == 2 and r["group"][1] in (0, 3, 4) and r["nbytes"] == 8 * MiB]
    (long,) = [r for r in recorded[0] if r["nbytes"] == 24 * MiB]
    by_dst = {r["group"][1]: r for r in fan}
    assert sorted(by_dst) == [0, 3, 4] and long["group"] == [0, 1]
    for j in (3, 4):
        r = by_dst[j]
        assert r["end_ns"] - r["t_start"] == pytest.approx(LAT_NS + 8 * MiB / (4 * LINK * links(2)), abs=2)
        assert r["end_ns"] < long["end_ns"]
    assert by_dst[0]["t_start"] == long["end_ns"]  # held there until the transfer before it ended
    assert by_dst[0]["end_ns"] - by_dst[0]["t_start"] == pytest.approx(LAT_NS + 8 * MiB / (4 * LINK), abs=2)


def without_launches(graph: ExecGraph) -> ExecGraph:
    """The graph as a recording made before group launches were kept."""
    progs = [
        dataclasses.replace(
            p, nodes=[dataclasses.replace(n, launch=-1, comm=-1) if isinstance(n, P2P) else n for n in p.nodes]
        )
        for p in graph.programs
    ]
    recorded = {k: v for k, v in graph.recorded.items() if k != LAUNCH_ISSUE}
    return dataclasses.replace(graph, programs=progs, recorded=recorded)


def test_a_recording_without_group_launches_replays_as_before(recorded: tuple[list[dict], ExecGraph], tmp_path) -> None:
    """An older recording (no type 11 nodes, no launch_issue_ns) still loads, and replays each pair alone on its
    pair's 2-rank communicator: 16 channels at a link, 16 MiB in 11.8 + 50.9 us."""
    graph = recorded[1]
    assert LAUNCH_ISSUE in graph.recorded
    save(without_launches(graph), tmp_path / "old")
    old = load(tmp_path / "old")
    assert LAUNCH_ISSUE not in old.recorded
    starts = {_key(r["name"], *r["group"]): r["t_start"] for r in recorded[0]}
    ends = replayed_ends(old)
    ring = [k for k in ends if k[0] == "send#0" and (k[2] - k[1]) % 8 == 1 and k[1] % 2]  # the ring's odd senders
    assert len(ring) == 4
    for k in ring:
        assert ends[k] - starts[k] == pytest.approx(LAT_NS + 16 * MiB / (16 * LINK), abs=2)


def test_a_group_launch_is_type_11_and_bad_issue_times_are_named(tmp_path) -> None:
    """A transfer of a group launch is stored as type 11 (its communicator's slot and the rank's launch number) and
    reads back equal; issue times that do not match the rank's launch transfers are refused naming the field."""
    builders = [ProgramBuilder(0), ProgramBuilder(1)]
    builders[0].p2p(1, True, 4096, comm=(0, 1), launch="batch a")
    builders[1].p2p(0, False, 4096, comm=(0, 1), launch="batch b")
    builders[1].p2p(0, False, 64, tag=3)  # a lone one
    graph = build_graph(builders, recorded={LAUNCH_ISSUE: [[[100, 0]], [[250, 40]]]})
    rows = [msgpack.unpackb(p.encode())["nodes"] for p in graph.programs]
    assert rows[0][0][0] == T_P2P_GROUP and rows[0][0][-1] == [] and rows[1][1][0] == 2
    save(graph, tmp_path / "g")
    back = load(tmp_path / "g")
    assert back.programs[0].nodes == graph.programs[0].nodes and back.programs[0].nodes[0].launch == 0
    assert LaunchGroups(back).of((0, 1, 0, 0)) == Grouped((0, 1), (), ())  # alone in its group
    bad = json.loads((tmp_path / "g" / "graph.json").read_text())
    bad["recorded"][LAUNCH_ISSUE] = [[[100, 0]], [[250, 40], [7, 0]]]
    (tmp_path / "g" / "graph.json").write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"rank 1: expected 1 \[issued, joined\] pairs") as err:
        load(tmp_path / "g")
    assert err.value.field == f"recorded.{LAUNCH_ISSUE}[1]"
    with pytest.raises(InputError, match="needs its communicator"):
        ProgramBuilder(0).p2p(1, True, 8, launch="x")


def test_a_built_fan_out_replays_to_the_closed_form() -> None:
    """The replay alone (no live run): rank 0 sends 8 MiB to ranks 1-3 in one launch on the 8-rank communicator,
    whose receives issue at 20, 40 and 60 us (recorded so): each pair runs from its later end's issue in the group's
    schedule, `fan_out_ends`, plus 11.8 us."""
    world, comm = 8, tuple(range(8))
    builders = [ProgramBuilder(r) for r in range(world)]
    for j in (1, 2, 3):
        builders[0].p2p(j, True, 8 * MiB, comm=comm, launch="fan-out")
        builders[j].compute("stagger", 20_000 * j)
        builders[j].p2p(0, False, 8 * MiB, comm=comm, launch="fan-out")
    for r in range(4, world):
        builders[r].compute("idle", 1)
    times = [[[0, 0]] * 3, [[20_000, 0]], [[40_000, 0]], [[60_000, 0]], [], [], [], []]
    ends = replayed_ends(build_graph(builders, recorded={LAUNCH_ISSUE: times}))
    want = fan_out_ends([20_000, 40_000, 60_000], 8 * MiB)
    assert [ends[("send#0", 0, j)] for j in (1, 2, 3)] == pytest.approx([LAT_NS + w for w in want], abs=3)
    together = replayed_ends(build_graph(builders))  # no issue times: the group's pairs rated from one start
    assert together[("send#0", 0, 1)] - 20_000 == pytest.approx(LAT_NS + 8 * MiB / (4 * LINK * links(3)), abs=3)


def window_fan_out(release: bool) -> ExecGraph:
    """Rank 2 sends 8 MiB to ranks 3 and 0 in one launch on the 8-rank communicator at 53,741 ns; rank 3 issued its
    receive at 29,302 ns, rank 0 its at 47,300 after joining a transfer that ended then: a window-mode run's figures
    (20 us windows), where the coordinator released ranks 2 and 3 at 40,000 ns and rank 0 at 60,000 (`release`: kept
    as `recorded.launch_release_ns`)."""
    world, comm = 8, tuple(range(8))
    builders = [ProgramBuilder(r) for r in range(world)]
    builders[2].compute("stagger", 53_741)
    for j in (3, 0):
        builders[2].p2p(j, True, 8 * MiB, comm=comm, launch="fan-out")
    for r, t in ((3, 29_302), (0, 47_300)):
        builders[r].compute("before", t)
        builders[r].p2p(2, False, 8 * MiB, comm=comm, launch="receive")
    for r in (1, 4, 5, 6, 7):
        builders[r].compute("idle", 1)
    times = [[[47_300, 47_300]], [], [[53_741, 29_302]] * 2, [[29_302, 29_302]], [], [], [], []]
    recorded: dict[str, list] = {LAUNCH_ISSUE: times}
    if release:
        recorded[LAUNCH_RELEASE] = [[60_000], [], [40_000, 40_000], [40_000], [], [], [], []]
    return build_graph(builders, recorded=recorded)


def test_a_window_mode_recording_rates_each_round_with_the_pairs_it_held(tmp_path) -> None:
    """Window mode launches in rounds, each once every rank blocks, before the network moves: the pair to rank 3 went
    in the 40 us round, when rank 0 had not issued its receive (it ran on at 60 us), so live it ran alone, 4 channels
    at a link; the pair to 0 went in the 60 us round, with 2 of rank 2's sends known (`links(2)`). The replay reads
    the recording's release ns and rates them so; by exact mode's rule (no releases) the pair to 3 knows the pair to
    0 (rank 0 joined its completion at 47.3 us, before 53.7): both at `links(2)`. The releases survive save / load
    and a Chakra round trip; a rank's releases that are not one per issue time are refused naming the field."""
    start, alone, two = 53_741, LAT_NS + 8 * MiB / (4 * LINK), LAT_NS + 8 * MiB / (4 * LINK * links(2))
    graph = window_fan_out(release=True)
    save(graph, tmp_path / "g")
    export_chakra(graph, tmp_path / "chakra")
    for g in (graph, load(tmp_path / "g"), read_chakra(tmp_path / "chakra")):
        assert g.recorded[LAUNCH_RELEASE] == graph.recorded[LAUNCH_RELEASE]
        ends = replayed_ends(g)
        assert ends[("send#0", 2, 3)] - start == pytest.approx(alone, abs=3)
        assert ends[("send#0", 2, 0)] - start == pytest.approx(two, abs=3)
    exact = replayed_ends(window_fan_out(release=False))
    assert [exact[("send#0", 2, j)] - start for j in (3, 0)] == pytest.approx([two, two], abs=3)
    bad = json.loads((tmp_path / "g" / "graph.json").read_text())
    bad["recorded"][LAUNCH_RELEASE][2] = [40_000]
    (tmp_path / "g" / "graph.json").write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"rank 2: expected 2 release ns") as err:
        load(tmp_path / "g")
    assert err.value.field == f"recorded.{LAUNCH_RELEASE}[2]"


WINDOW_SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "p2p_window.py"  # ranks 0-3 as its docstring says


@pytest.mark.slow
def test_a_window_mode_recording_replays_each_transfer_in_its_live_time(tmp_path) -> None:
    """bench/p2p_window.py on 4 ranks in 20 us windows, recorded and replayed: every transfer takes its live time (its
    end cannot match: window mode starts a transfer late by its own error, `late_ns`, which the replay does not repeat).
    Rank 2 sends to 3 after rank 0 joined its small transfer's end but before the round rank 0 ran on in: live the
    pair to 3 runs alone (8 channels of the 4-rank communicator at a link) and the pair to 0 knows it (links(2) of 3
    peers: 0.75); before the recording kept the rounds, the replay rated the pair to 3 with the pair to 0 (79,669 ns
    against 62,702 live, 2026-12-01)."""
    from phantora.netsim.engine_spec import EngineSpec

    cfg = RunConfig(str(WINDOW_SCRIPT), topology=TOPO, nproc=4, tensors="phantom", trace="none", timeout_s=300,
                    out_dir=str(tmp_path / "o"), engine=EngineSpec(window_ns=20_000))  # fmt: skip
    _, graph = record_run(cfg, tmp_path / "g")
    assert LAUNCH_RELEASE in graph.recorded
    recs = [
        r for r in json.loads((tmp_path / "o" / "cosim.json").read_text())["collectives"] if r["kind"] == "send_recv"
    ]
    live = {(r["group"][0], r["group"][1]): r["end_ns"] - r["t_start"] for r in recs}
    assert sorted(live) == [(0, 1), (2, 0), (2, 3)]
    issued = {(r["group"][0], r["group"][1]): dict(r["issue"]) for r in recs}
    joined = next(r["end_ns"] for r in recs if r["group"] == [0, 1])
    assert joined < issued[(2, 0)][0] < issued[(2, 0)][2] < 60_000  # the program's premise (bench/p2p_window.py)
    assert live[(2, 3)] == pytest.approx(LAT_NS + 8 * MiB / (8 * LINK), abs=2)
    assert live[(2, 0)] == pytest.approx(LAT_NS + 8 * MiB / (8 * LINK * links(2, peers=3)), abs=2)
    res = replay_graph(graph, TOPO, FlowSimulator(TOPO), fresh=lambda: FlowSimulator(TOPO))
    delay = {f.id: f.delay_ns for f in res.plan_flows}
    span: dict[tuple[int, int], tuple[int, int]] = {}
    for c in res.completions:
        if "/p2p" in c.tag:
            src, dst = (int(x) for x in c.tag.split("/")[0].split("@")[1].split(">"))
            lo, hi = span.get((src, dst), (c.start_ns - delay[c.flow_id], c.end_ns))
            span[(src, dst)] = (min(lo, c.start_ns - delay[c.flow_id]), max(hi, c.end_ns))
    assert {k: hi - lo for k, (lo, hi) in span.items()} == live


def _live_and_replayed(tmp_path, topo, nproc: int, unit: int, period: int, **cfg_kw) -> tuple[dict, dict, ExecGraph]:
    """SCRIPT run live and recorded: each transfer's live end ns, its replayed end ns (on the run's engine), and the
    graph."""
    from phantora.netsim.factory import make_engine

    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "batches.py"
    script.write_text(textwrap.dedent(SCRIPT).format(unit=unit, period=period))
    cfg = RunConfig(str(script), topology=topo, nproc=nproc, tensors="phantom", trace="none", timeout_s=900,
                    out_dir=str(tmp_path / "o"), **cfg_kw)  # fmt: skip
    _, graph = record_run(cfg, tmp_path / "g")
    recs = json.loads((tmp_path / "o" / "cosim.json").read_text())["collectives"]
    live = {_key(r["name"], *r["group"]): r["end_ns"] for r in recs if r["kind"] == "send_recv"}
    sim = make_engine(cfg.engine, topo)
    try:
        res = replay_graph(graph, topo, sim, fresh=lambda: make_engine(cfg.engine, topo))
    finally:
        sim.close()
    ends: dict[tuple[str, int, int], int] = {}
    for c in res.completions:
        if "/p2p" in c.tag:
            name, pair = c.tag.split("/")[0].split("@")
            key = _key(name, *(int(x) for x in pair.split(">")))
            ends[key] = max(ends.get(key, 0), c.end_ns)
    assert set(live) <= set(ends)  # every transfer replayed (a deduplicated run's records: its live ranks')
    return live, ends, graph


@pytest.mark.slow
def test_batches_replay_to_their_live_ns_in_packet_mode(tmp_path) -> None:
    """The same program (16 KiB for a MiB) recorded on ns-3 and replayed on a fresh ns-3 fabric: every transfer ends
    at its live ns."""
    from phantora.netsim.engine_spec import EngineSpec

    live, replayed, _ = _live_and_replayed(tmp_path, TOPO, 8, 1 << 12, 8, engine=EngineSpec(network="ns3"))
    assert replayed == live


@pytest.mark.slow
def test_deduplicated_batches_run_and_replay_as_without(tmp_path) -> None:
    """16 ranks on testbed16 (2 hosts of 8), the program repeating every 8 ranks: with rank deduplication (8 live
    processes, each standing for itself and the rank 8 above; a pair's mirror runs on the group's communicator, the
    world's) every transfer ends where it does with every rank live, and both recordings replay to those ends."""
    from phantora.topology.loader import load_topology

    topo = load_topology("testbed16")
    off, off_replayed, _ = _live_and_replayed(tmp_path / "off", topo, 16, 1 << 16, 8, dedup="off")
    on, on_replayed, graph = _live_and_replayed(tmp_path / "on", topo, 16, 1 << 16, 8, dedup="auto")
    assert graph.world == 16 and len(off) == 2 * (16 + 8 + 3 + 4)
    assert on == {k: off[k] for k in on}  # the live ranks' records: as without
    assert off_replayed == off and on_replayed == off


@pytest.mark.slow
def test_a_ring_batch_as_workload_splits_takes_the_live_rings_time(tmp_path) -> None:
    """The batch ring written as a workload's `splits` (one entry a row): in process and through the bridge's
    replay_rank (one group launch a rank on the 8-rank communicator), each pair takes what the live batch's does,
    11.8 us + 16 MiB over 4 channels at a link."""

    from bridge.run import CosimRun
    from phantora.replay import replay_inprocess
    from phantora.workload import load_workload

    splits = [[16 * MiB if j == (i + 1) % 8 else 0 for j in range(8)] for i in range(8)]
    path = tmp_path / "ring.json"
    path.write_text(json.dumps({"op": [{"name": "ring", "kind": "all_to_all", "ranks": "all", "splits": splits}]}))
    wl = load_workload(path, world=8)
    took = {op.name: op.end_ns - op.start_ns for op in replay_inprocess(wl, TOPO, FlowSimulator(TOPO)).ops}
    res = CosimRun(TOPO, **replay_ranks(path), timeout_s=120).run()
    bridged = {r["name"]: r["end_ns"] - r["t_start"] for r in res.collectives}
    assert sorted(took) == sorted(bridged) == sorted(f"ring/{i}>{(i + 1) % 8}" for i in range(8))
    for t in (*took.values(), *bridged.values()):
        assert t == pytest.approx(LAT_NS + 16 * MiB / (4 * LINK), abs=2)
