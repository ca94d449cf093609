"""Replay of recorded execution graphs against live co-simulation and closed forms.

"Live" here is the real coordinator logic of the bridge (`bridge.core.CoordinatorCore`, exact mode,
flow engine) driven by scripted ranks that keep virtual clocks the way the runtime does (compute lane,
issue at the lane's time, a wait joins the completion) and call `GraphRecorder` as the runtime would.
So the recorded step times are the co-simulation's own answer, never computed by the replay code.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from bridge.core import DONE, CoordinatorCore
from bridge.protocol import INF_NS, decode, encode
from phantora.collectives.spec import AlgoOptions
from phantora.egraph import GraphRecorder, ProgramBuilder, build_graph, finalize_recording, load, replay_graph
from phantora.egraph.format import step_times
from phantora.netsim.base import NetworkSimulator
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine
from phantora.topology.model import Topology

B = 100 * 10**9
LAT = 1000
MiB = 2**20

# ("c", name, dur) | ("x", kind, group, nbytes[, dtype, root[, redop]]) | ("w", index of an "x") | ("s",)
Op = tuple[Any, ...]


def star(n: int, rate: str = "100Gbps") -> Topology:
    return leaf_spine(1, n, 0, nic_rate=rate, latency="1us", name=f"star{n}")


def leaves(n: int, oversub: float) -> Topology:
    """n GPUs, two per leaf, one spine; a leaf's uplink is `oversub` times thinner than its NICs together."""
    return leaf_spine(n // 2, 2, 1, nic_rate="100Gbps", oversubscription=oversub, latency="1us", name="leaves")


def ring_ar_ns(nbytes: int, n: int, hops: int = 2) -> float:
    return 2 * (n - 1) / n * nbytes * 8e9 / B + hops * LAT


def cosim(
    topo: Topology,
    scripts: list[list[Op]],
    record: Path | None = None,
    engine: NetworkSimulator | None = None,
    algo: AlgoOptions | None = None,
    cores: list[CoordinatorCore] | None = None,
) -> list[list[int]]:
    """Run scripted ranks through the bridge coordinator (exact mode); return each rank's step end times.

    With `record`, each rank's `GraphRecorder` writes its part there and the parts are merged (with `algo`, the
    collective options the coordinator ran, as meta.algo, as a live run's recording keeps them). `cores`: the
    coordinator is appended to it (its collective records, as cosim.json's).
    """
    world = len(scripts)
    inbox: dict[int, list[Any]] = {r: [] for r in range(world)}
    core = CoordinatorCore(
        engine or FlowSimulator(topo),
        topo,
        world,
        window_ns=0,
        algo=algo or AlgoOptions(),
        send=lambda r, raw: inbox[r].append(decode(raw)),
    )
    if cores is not None:
        cores.append(core)
    clock = [0] * world
    pc = [0] * world
    handle: list[dict[int, int]] = [{} for _ in range(world)]  # op index -> bridge handle
    done_at: list[dict[int, int]] = [{} for _ in range(world)]  # handle -> completion
    unwaited: list[list[int]] = [[] for _ in range(world)]
    seqs: list[dict[tuple[int, ...], int]] = [{} for _ in range(world)]
    blocked: list[int | None] = [None] * world  # handle a rank waits for
    step_ends: list[list[int]] = [[] for _ in range(world)]
    recs = [GraphRecorder(r, world) for r in range(world)]

    def msg(r: int, type_: str, t: int, **fields: Any) -> None:
        core.on_message(r, decode(encode(type_, t, **fields)))

    def join(r: int, h: int) -> bool:
        """The compute lane waits for handle h; False if its completion is not known yet."""
        if h not in done_at[r]:
            msg(r, "wait", clock[r], handles=[h], until=INF_NS)
            blocked[r] = h
            return False
        clock[r] = max(clock[r], done_at[r][h])
        recs[r].wait(h, done_at[r][h])
        if h in unwaited[r]:
            unwaited[r].remove(h)
        return True

    def run(r: int) -> None:
        ops = scripts[r]
        while pc[r] < len(ops):
            op = ops[pc[r]]
            if op[0] == "c":
                recs[r].compute(op[1], clock[r], op[2])
                clock[r] += op[2]
            elif op[0] == "x":
                _, kind, group, nbytes, *more = op
                dtype, root, *rest = more if more else ("bf16", None)  # root: a global rank, as the client takes it
                redop = rest[0] if rest else "sum"
                extra = {"redop": redop} if redop != "sum" else {}  # sent only when not sum, as RankClient does
                group = tuple(group)
                seq = seqs[r].get(group, 0)
                seqs[r][group] = seq + 1
                h = len(handle[r]) + 1
                handle[r][pc[r]] = h
                msg(r, "coll", clock[r], h=h, group=list(group), seq=seq, kind=kind, nbytes=nbytes, dtype=dtype,
                    root=root, name=f"{kind}{seq}", algo=None, **extra)  # fmt: skip
                recs[r].collective(h, group, seq, kind, nbytes, dtype, root, clock[r], redop=redop)
                unwaited[r].append(h)
            elif op[0] == "w":
                if not join(r, handle[r][op[1]]):
                    return
            elif op[0] == "s":
                for h in list(unwaited[r]):
                    if not join(r, h):
                        return
                recs[r].step(len(step_ends[r]), clock[r])
                step_ends[r].append(clock[r])
            pc[r] += 1
        msg(r, "finish", clock[r], results={}, cpu_s=0.0)
        if record is not None:
            recs[r].finish(record, clock[r])

    for r in range(world):
        run(r)
    while any(rs.state != DONE for rs in core.ranks):
        core.progress()
        woke = False
        for r in range(world):
            for m in inbox[r]:
                if m.type == "result" and m["h"] is not None:
                    done_at[r][m["h"]] = m["t_done"]
            inbox[r].clear()
            if blocked[r] is not None and blocked[r] in done_at[r]:
                blocked[r] = None
                woke = True
                run(r)
        assert woke or all(rs.state == DONE for rs in core.ranks), "scripted ranks made no progress"
    if record is not None:
        kept = {"algo": dataclasses.asdict(algo)} if algo is not None else {}
        finalize_recording(record, meta={"topology": topo.name, "network": "flow", **kept})
    return step_ends


def ddp_script(rank: int, world: int, buckets: int, bucket_bytes: int, bwd_ns: int, steps: int = 2) -> list[Op]:
    """Forward, then backward in chunks each followed by a bucket all-reduce; waits before the optimizer."""
    ops: list[Op] = []
    for _ in range(steps):
        ops.append(("c", "fwd", 3 * bwd_ns))
        first = len(ops)
        for _b in range(buckets):
            ops.append(("c", "bwd", bwd_ns))
            ops.append(("x", "all_reduce", range(world), bucket_bytes))
        for b in range(buckets):
            ops.append(("w", first + 2 * b + 1))
        ops.append(("c", "optimizer", bwd_ns // 2))
        ops.append(("s",))
    return ops


def fsdp_script(world: int, layers: int, shard_bytes: int, layer_ns: int, steps: int = 2) -> list[Op]:
    """FSDP: prefetch all-gathers one layer ahead in forward and backward; reduce-scatter after each backward layer."""
    full = shard_bytes * world
    ops: list[Op] = []
    for _ in range(steps):
        for phase in ("fwd", "bwd"):
            ag = [len(ops)]
            ops.append(("x", "all_gather", range(world), full))
            for layer in range(layers):
                if layer + 1 < layers:
                    ag.append(len(ops))
                    ops.append(("x", "all_gather", range(world), full))
                ops.append(("w", ag[layer]))
                ops.append(("c", f"{phase}{layer}", layer_ns * (2 if phase == "bwd" else 1)))
                if phase == "bwd":
                    ops.append(("x", "reduce_scatter", range(world), full))
        ops.append(("s",))
    return ops


@pytest.fixture
def ddp8() -> list[list[Op]]:
    # 4 buckets of 16 MiB: each all-reduce (~2.4 ms on 100G) outlasts a backward chunk (1 ms), so buckets overlap
    # each other and the compute, and share the NICs.
    return [ddp_script(r, 8, 4, 16 * MiB, 1_000_000) for r in range(8)]


def test_recorded_ddp_replays_to_the_recorded_step_times(tmp_path: Path, ddp8: list[list[Op]]) -> None:
    topo = star(8)
    live = cosim(topo, ddp8, record=tmp_path / "trace")
    graph = load(tmp_path / "trace")
    assert graph.recorded["step_ends_ns"] == live
    res = replay_graph(graph, topo, FlowSimulator(topo))
    assert res.rank_step_ends_ns == live  # exact, rank by rank
    assert res.step_times_ns == step_times(live)
    # Sanity against the closed form: the step is at least compute + the last bucket's all-reduce.
    assert res.step_times_ns[0] > 3e6 + 4e6 + ring_ar_ns(16 * MiB, 8)


def test_recorded_fsdp_replays_exactly_and_tracks_a_slower_network(tmp_path: Path) -> None:
    scripts = [fsdp_script(8, 4, 4 * MiB, 400_000) for _ in range(8)]
    # Rings cross a leaf boundary on one uplink per channel, so 2x oversubscription costs a ring nothing;
    # at 4x the uplink (50 Gb/s) is half a NIC.
    fast, slow = leaves(8, 1), leaves(8, 4)
    live_fast = cosim(fast, scripts, record=tmp_path / "trace")
    graph = load(tmp_path / "trace")
    assert replay_graph(graph, fast, FlowSimulator(fast)).rank_step_ends_ns == live_fast
    # The same recording re-timed on the oversubscribed fabric: slower, and equal to a live run there.
    live_slow = cosim(slow, scripts)
    res = replay_graph(graph, slow, FlowSimulator(slow))
    assert res.step_times_ns[-1] > step_times(live_fast)[-1] * 1.05
    assert res.step_times_ns == pytest.approx(step_times(live_slow), rel=0.01)
    assert res.rank_step_ends_ns == live_slow


def test_tp_dp_groups_share_programs_and_replay_exactly(tmp_path: Path) -> None:
    """2-way TP x 4-way DP: 8 ranks, 2 distinct groups each, one program for every rank."""
    world, tp = 8, 2
    scripts = []
    for r in range(world):
        tp_group = [r - r % tp + i for i in range(tp)]
        dp_group = list(range(r % tp, world, tp))
        ops: list[Op] = [("c", "attn", 200_000), ("x", "all_reduce", tp_group, 2 * MiB), ("w", 1)]
        ops += [("c", "mlp", 300_000), ("x", "all_reduce", dp_group, 8 * MiB), ("c", "opt", 100_000), ("s",)]
        scripts.append(ops)
    topo = star(8)
    live = cosim(topo, scripts, record=tmp_path / "trace")
    graph = load(tmp_path / "trace")
    assert len(graph.programs) == 1 and len(graph.groups) == 4 + 2
    assert replay_graph(graph, topo, FlowSimulator(topo)).rank_step_ends_ns == live


def test_compute_only_chain_is_the_sum_of_durations() -> None:
    durs = [1_234, 50_000, 7, 999_999, 3]
    bs = []
    for r in range(4):
        b = ProgramBuilder(r)
        for i, d in enumerate(durs):
            b.compute(f"k{i}", d * (r + 1))
        b.step()
        bs.append(b)
    res = replay_graph(build_graph(bs), star(4), FlowSimulator(star(4)))
    assert res.rank_step_ends_ns == [[sum(durs) * (r + 1)] for r in range(4)]
    assert res.step_times_ns == [sum(durs) * 4]


def test_ddp_overlap_hides_communication_under_later_compute() -> None:
    """All-reduce issued after bwd0 overlaps bwd1: step = max(bwd0 + AR, bwd0 + bwd1) + opt."""
    size, n = 8 * MiB, 4
    t_ar = ring_ar_ns(size, n)

    def step_ns(bwd1: int) -> int:
        bs = []
        for r in range(n):
            b = ProgramBuilder(r)
            b.compute("bwd0", 100_000)
            h = b.collective("all_reduce", range(n), size)
            b.compute("bwd1", bwd1)
            b.wait([h])
            b.compute("opt", 10_000)
            b.step()
            bs.append(b)
        # t_ar is the ideal model's line-rate ring
        ideal = AlgoOptions(model="ideal")
        return replay_graph(build_graph(bs), star(n), FlowSimulator(star(n)), ideal).step_times_ns[0]

    assert step_ns(100_000) == pytest.approx(100_000 + t_ar + 10_000, abs=2)  # comm exposed
    assert step_ns(3_000_000) == 100_000 + 3_000_000 + 10_000  # comm fully hidden


def test_two_streams_with_a_cross_stream_dependency() -> None:
    """Stream 1 waits (explicit dep) for a kernel on stream 0; the streams otherwise run in parallel."""
    b = ProgramBuilder(0)
    a = b.compute("a", 500, stream=0)
    b.compute("b", 2_000, stream=0)
    b.compute("c", 300, stream=1, deps=[a])
    b.compute("d", 400, stream=1)
    b.step(stream=1)
    res = replay_graph(build_graph([b]), star(2), FlowSimulator(star(2)))
    assert res.rank_step_ends_ns == [[500 + 300 + 400]]
    assert res.rank_end_ns == [2_500]


class _Ticked(FlowSimulator):
    """A flow engine that counts its keepalives (a decomposition engine's workers must hear from it while it plans)."""

    ticks = 0

    def keepalive(self) -> None:
        self.ticks += 1


def test_planning_ticks_the_engine_once_a_second_and_not_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """replay_graph plans with the engine's keepalive as its tick: on a clock that moves 1 s between reads every
    rank's turn in the planner ticks (4 ranks, at least 4 turns); on a clock that stands still it never does."""
    import phantora.egraph.replay as replay_mod

    def graph() -> Any:
        bs = []
        for r in range(4):
            b = ProgramBuilder(r)
            b.compute("k", 1_000)
            b.wait([b.collective("all_reduce", range(4), 1 * MiB)])
            b.step()
            bs.append(b)
        return build_graph(bs)

    clock = iter(range(10**6))
    monkeypatch.setattr(replay_mod.time, "monotonic", lambda: float(next(clock)))
    moving = _Ticked(star(4))
    replay_graph(graph(), star(4), moving)
    assert moving.ticks >= 4
    monkeypatch.setattr(replay_mod.time, "monotonic", lambda: 0.0)
    still = _Ticked(star(4))
    replay_graph(graph(), star(4), still)
    assert still.ticks == 0


def test_mismatched_graph_names_the_ranks() -> None:
    bs = [ProgramBuilder(r) for r in range(2)]
    h0 = bs[0].collective("all_reduce", [0, 1], 1024)
    bs[0].wait([h0])
    h1 = bs[1].collective("all_gather", [0, 1], 1024)
    bs[1].wait([h1])
    with pytest.raises(Exception, match="collective mismatch.*rank 0.*all_reduce.*rank 1.*all_gather"):
        replay_graph(build_graph(bs), star(2), FlowSimulator(star(2)))
    bs = [ProgramBuilder(r) for r in range(2)]
    bs[0].wait([bs[0].collective("all_reduce", [0, 1], 1024)])
    bs[1].compute("x", 10)
    with pytest.raises(Exception, match=r"deadlocks: rank 0 waits on all_reduce on \[0, 1\] #0.*rank\(s\) \[1\]"):
        replay_graph(build_graph(bs), star(2), FlowSimulator(star(2)))


def test_replay_imports_no_torch(tmp_path: Path, ddp8: list[list[Op]]) -> None:
    cosim(star(8), ddp8, record=tmp_path / "trace")
    code = textwrap.dedent(
        f"""
        import sys
        from phantora.cli import main
        rc = main(["replay", {str(tmp_path / "trace")!r}, "--topology", "testbed16"])
        assert rc == 0
        assert "torch" not in sys.modules, "replay imported torch"
        print("NO-TORCH-OK")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "NO-TORCH-OK" in out.stdout and "step" in out.stdout


@pytest.mark.ns3
def test_ns3_recording_replays_within_one_percent(ns3_lib, tmp_path: Path) -> None:
    """Packet mode: a run co-simulated on ns-3 (DCQCN) is recorded, then replayed on a fresh ns-3 fabric."""
    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.packet_config import PacketConfig

    topo = star(4)
    scripts = [ddp_script(r, 4, 2, 1 * MiB, 50_000, steps=1) for r in range(4)]
    with Ns3Simulator(topo, PacketConfig(cc="dcqcn")) as eng:
        live = cosim(topo, scripts, record=tmp_path / "t", engine=eng)
    with Ns3Simulator(topo, PacketConfig(cc="dcqcn")) as eng:
        res = replay_graph(load(tmp_path / "t"), topo, eng)
    assert res.step_times_ns == pytest.approx(step_times(live), rel=0.01)
    # Packet mode is not the flow model: the same graph on the flow engine differs (no headers, no CC).
    flow = replay_graph(load(tmp_path / "t"), topo, FlowSimulator(topo))
    assert flow.step_times_ns[0] < res.step_times_ns[0]
