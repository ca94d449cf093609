"""A workload planned by independent groups of ops (`phantora.plan_split`, issue 38 item 2, docs/packet-model.md
"What moves where" (a)) is the one-process plan, flow for flow: in this process through msgpack as a worker gets it,
and on a decomposition's two workers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest

from bridge.plan_groups import group_reply
from bridge.workers import spawn_workers
from phantora import replay
from phantora.cli import main
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.plan_split import coll_from_wire, coll_to_wire, op_groups, touched_apart
from phantora.replay import ReplayPlan, plan_for, plan_split_by, plan_workload
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from phantora.workload import Workload, WorkloadOp, load_workload

ROOT = Path(__file__).resolve().parents[1]

# four groups of ops sharing no rank, of several kinds, with `after` and gaps inside a group (rail128: 8 GPUs a host)
MIXED = """
name = "mixed-groups"
[defaults]
dtype = "bf16"
[[op]]
name = "ar"
kind = "all_reduce"
bytes = "4MiB"
ranks = [0, 1, 2, 3, 4, 5, 6, 7]
[[op]]
name = "ag"
kind = "all_gather"
bytes = "2MiB"
ranks = [8, 16, 24, 32]
[[op]]
name = "a2a"
kind = "all_to_all"
bytes = "1MiB"
ranks = [9, 17, 25, 33]
[[op]]
name = "rs"
kind = "reduce_scatter"
bytes = "4MiB"
ranks = [0, 1, 2, 3, 4, 5, 6, 7]
after = ["ar"]
gap = "5us"
[[op]]
name = "sr"
kind = "send_recv"
bytes = "1MiB"
src = 40
dst = 48
[[op]]
name = "ag2"
kind = "all_gather"
bytes = "2MiB"
ranks = [8, 16, 24, 32]
after = ["ag"]
"""


def op(name: str, ranks: tuple[int, ...], after: tuple[str, ...] = ()) -> WorkloadOp:
    return WorkloadOp(name, Collective("all_reduce", ranks, 1 << 20), after=after)


def test_op_groups_join_ops_through_shared_ranks() -> None:
    wl = Workload("w", [op("a", (0, 1)), op("b", (2, 3)), op("c", (1, 4), ("a",)), op("d", (5,)), op("e", (4, 3))])
    assert op_groups(wl) == [[0, 1, 2, 4], [3]]  # e joins c's (and so a's) group to b's
    assert op_groups(Workload("w", [op("a", (0,)), op("b", (1,))])) == [[0], [1]]


def test_groups_that_touched_one_connection_are_refused() -> None:
    one, other = {"touched": [[7, 0, 8, 1]]}, {"touched": [[7, 8, 0, 1], [9, 1, 2, 0]]}
    assert touched_apart([one, other])
    assert not touched_apart([one, other, {"touched": [[9, 1, 2, 0]]}])


def test_a_collective_crosses_as_a_map_unchanged() -> None:
    coll = Collective("send_recv", (3, 5), 4096, comm=(3, 5, 7), inflight=((3, 5), (5, 7)),
                      inflight_at=((5, 7, 100, 2048),))  # fmt: skip
    sent = coll_to_wire(coll)
    assert sent is not None
    assert coll_from_wire(msgpack.unpackb(msgpack.packb(sent))) == coll


def in_process(topo: Topology) -> Any:
    """`plan_split_by`'s `run`: each job through msgpack to `group_reply` here, as a worker gets and answers it."""

    def run(jobs: list[dict[str, object]]) -> list[dict[str, object]]:
        sent = [msgpack.unpackb(msgpack.packb(j)) for j in jobs]
        return [msgpack.unpackb(msgpack.packb(group_reply(topo, j)), strict_map_key=True) for j in sent]

    return run


def same_plan(a: ReplayPlan, b: ReplayPlan) -> None:
    assert a.flows == b.flows  # every field of every flow, in order
    assert (a.op_flows, a.op_start_marker, a.op_rank_last, a.op_choice) == (
        b.op_flows, b.op_start_marker, b.op_rank_last, b.op_choice)  # fmt: skip


@pytest.mark.parametrize("granularity", ["coarse", "chunked"])
def test_mixed_groups_split_equal_one_process(tmp_path: Path, granularity: str) -> None:
    topo = load_topology("rail128")
    (tmp_path / "w.toml").write_text(MIXED)
    wl = load_workload(tmp_path / "w.toml", world=topo.num_ranks)
    assert [len(g) for g in op_groups(wl)] == [2, 2, 1, 1]
    opts = AlgoOptions(granularity=granularity)
    split = plan_split_by(wl, topo, opts, in_process(topo))
    assert split is not None
    one = plan_workload(wl, topo, opts)
    assert len(one.flows) > 100 and any(f.deps and min(f.deps) > 0 for f in one.flows[len(one.flows) // 2 :])
    same_plan(split, one)


def test_moe_on_rails_split_equals_one_process() -> None:
    topo = load_topology("rail128")
    wl = load_workload(ROOT / "workloads" / "moe_rail_alltoall.toml", world=topo.num_ranks)
    opts = AlgoOptions(granularity="chunked")
    split = plan_split_by(wl, topo, opts, in_process(topo))
    assert split is not None
    same_plan(split, plan_workload(wl, topo, opts))


def test_one_group_is_planned_in_one_process() -> None:
    topo = load_topology("rail128")
    wl = load_workload(ROOT / "workloads" / "rail_allreduce.toml", world=topo.num_ranks)

    def run(jobs: list[dict[str, object]]) -> list[dict[str, object]]:
        raise AssertionError("a workload of one group was sent to be planned")

    assert plan_split_by(wl, topo, None, run) is None


def test_decomposition_workers_plan_the_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan_for` on two workers (`--set workers=2`, nvlink=fluid; `PLAN_ON_WORKERS`) not given the groups at their
    start: while they start the driver plans (no worker CPU in the stats); once started they plan, the busiest one's
    CPU in the decomposition's stats. The one-process plan both times."""
    monkeypatch.setattr(replay, "PLAN_ON_WORKERS", True)
    topo = load_topology("rail128")
    wl = moe_1mib(tmp_path, topo)
    opts = AlgoOptions(granularity="chunked")
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    sim = make_engine(EngineSpec("ns3", replace(config, workers=2)), topo, spawner=spawn_workers, whole_dag=True)
    try:
        assert sim.packet._pool.starting  # type: ignore[attr-defined]  # (an interpreter and ns-3 to load)
        here = plan_for(wl, topo, opts, sim)
        before = sim.packet.stats()["decompose"]  # type: ignore[attr-defined]
        sim.packet._pool._ready()  # type: ignore[attr-defined]
        split = plan_for(wl, topo, opts, sim)
        stats = sim.packet.stats()["decompose"]  # type: ignore[attr-defined]
    finally:
        sim.close()
    assert before["plan_cpu_s"] == 0
    assert stats["plan_cpu_s"] > 0 and stats["plan_wall_s"] >= stats["plan_cpu_s"] / 4
    one = plan_workload(wl, topo, opts)
    same_plan(here, one)
    same_plan(split, one)


class _Elsewhere:
    """An engine whose workers would plan on another topology: `plan_for` must not send them the groups."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def plan_groups(self, jobs: list[dict[str, object]]) -> list[dict[str, object]]:
        raise AssertionError("the groups were sent to workers of another topology")


def test_workers_of_another_topology_do_not_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay, "PLAN_ON_WORKERS", True)
    topo = load_topology("rail128")
    wl = load_workload(ROOT / "workloads" / "moe_rail_alltoall.toml", world=topo.num_ranks)
    opts = AlgoOptions(granularity="coarse")
    got = plan_for(wl, topo, opts, _Elsewhere(load_topology("rail256")))  # type: ignore[arg-type]
    same_plan(got, plan_workload(wl, topo, opts))


@pytest.mark.slow  # two CLI replays, one of them starting 2 workers that load ns-3 (about 15 CPU s)
def test_a_replay_planned_on_workers_writes_one_engines_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`phantora replay` of the MoE workload with `--set workers=2`, its groups planned on the workers
    (`PLAN_ON_WORKERS`), writes one engine's files byte for byte."""
    monkeypatch.setattr(replay, "PLAN_ON_WORKERS", True)
    text = (ROOT / "workloads" / "moe_rail_alltoall.toml").read_text().replace('bytes = "16MiB"', 'bytes = "1MiB"')
    (tmp_path / "moe.toml").write_text(text)
    args = ["replay", str(tmp_path / "moe.toml"), "--topology", "rail128", "--network", "ns3", "--cc", "dcqcn"]
    args += ["--set", "nvlink=fluid", "--set", "wire=roce4k", "--set", "nic_latency=1us"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert main([*args, "--set", "workers=2", "--out", str(tmp_path / "two")]) == 0
    planned = json.loads((tmp_path / "two" / "results.json").read_text())["engine"]["decompose"]
    assert planned["plan_cpu_s"] > 0 and planned["plan_wall_s"] > 0  # (the groups went to the workers)
    for name in ("flows.csv", "pfc.csv", "drops.csv", "cnps.csv", "ecn_marks.csv", "links.csv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert (tmp_path / "one" / "flows.csv").read_text().count("\n") > 1000


def test_a_worker_that_dies_ends_the_plan_named() -> None:
    """A worker killed before it answers its groups: the plan ends with `WorkerDiedError` naming it, not a hang."""
    from phantora.netsim.decompose import WorkerDiedError
    from phantora.plan_split import split_jobs

    topo = load_topology("rail128")
    wl = load_workload(ROOT / "workloads" / "moe_rail_alltoall.toml", world=topo.num_ranks)
    split = split_jobs(wl, AlgoOptions())
    assert split is not None
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    sim = make_engine(EngineSpec("ns3", replace(config, workers=2)), topo, spawner=spawn_workers, whole_dag=True)
    try:
        packet: Any = sim.packet  # type: ignore[attr-defined]
        packet._pool._ready()
        victim = packet.workers[1]
        victim.proc.kill()  # (a process this test started, by its handle)
        victim.proc.wait()
        with pytest.raises(WorkerDiedError, match=r"decomposition worker 1 \(pid \d+"):
            packet.plan_groups(split[1])
    finally:
        sim.close()


def moe_1mib(tmp_path: Path, topo: Topology) -> Workload:
    """The MoE replay on rails at 1 MiB per GPU (8 groups of ops, one a rail)."""
    text = (ROOT / "workloads" / "moe_rail_alltoall.toml").read_text().replace('bytes = "16MiB"', 'bytes = "1MiB"')
    (tmp_path / "moe.toml").write_text(text)
    return load_workload(tmp_path / "moe.toml", world=topo.num_ranks)


def two_workers_ahead(topo: Topology, jobs: list[dict[str, Any]]) -> Any:
    """The MoE runs' engine on two local workers (nvlink=fluid), started inside `jobs_ahead(jobs)`."""
    from phantora.plan_split import jobs_ahead

    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    with jobs_ahead(jobs):
        return make_engine(EngineSpec("ns3", replace(config, workers=2)), topo, spawner=spawn_workers, whole_dag=True)


def test_workers_plan_ahead_before_they_load_ns3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers started inside `jobs_ahead` plan their groups as they start, before they build their engine (each
    log says so in that order: 8 groups dealt to 2 workers, 4 each), and `plan_for` reads the plan from their files:
    the one-process plan, their CPU in the stats."""
    from phantora.plan_split import split_jobs

    monkeypatch.setattr(replay, "PLAN_ON_WORKERS", True)
    topo = load_topology("rail128")
    wl = moe_1mib(tmp_path, topo)
    opts = AlgoOptions(granularity="chunked")
    split = split_jobs(wl, opts)
    assert split is not None and len(split[1]) == 8
    sim = two_workers_ahead(topo, split[1])
    try:
        got = plan_for(wl, topo, opts, sim, split)
        pool = sim.packet._pool  # type: ignore[attr-defined]
        pool._ready()
        logs = [w.log.read_text() for w in pool.workers]
        stats = sim.packet.stats()["decompose"]  # type: ignore[attr-defined]
    finally:
        sim.close()
    for text in logs:
        assert "planned 4 groups of ops" in text and text.index("planned 4 groups") < text.index(" ready in "), text
    assert stats["plan_cpu_s"] > 0
    same_plan(got, plan_workload(wl, topo, opts))


def test_a_worker_counts_its_planning_not_numpys_first_import(tmp_path: Path) -> None:
    """`bridge.plan_first` imports numpy (which `rank_last` needs) before the plan's CPU is counted, as the driver and
    one engine have before their clocks: in a fresh interpreter numpy is not loaded by the worker's imports, and is
    loaded when `write_planned` starts counting."""
    import subprocess
    import sys

    from bridge.workers import worker_spec
    from phantora.plan_split import split_jobs

    topo = load_topology("rail128")
    split = split_jobs(moe_1mib(tmp_path, topo), AlgoOptions())
    assert split is not None
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    worker_spec(topo, replace(config, workers=2), plan_jobs=split[1][:1]).write(tmp_path / "setup.msgpack")
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "import bridge.plan_first as pf\n"
        "before = 'numpy' in sys.modules\n"
        "seen = []\n"
        "def write_planned(path, topo, jobs, limit):\n"
        "    seen.append('numpy' in sys.modules)\n"
        "    return 0.0\n"
        "pf.write_planned = write_planned\n"
        "pf.plan_ahead(Path(sys.argv[1]))\n"
        "print(before, seen)\n"
    )
    got = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "setup.msgpack")], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert got.stdout.split("\n")[-2] == "False [True]", got.stdout + got.stderr


def test_a_worker_that_dies_before_it_plans_ends_the_plan_named(tmp_path: Path) -> None:
    """A worker given its groups at its start, killed before it planned them: the plan ends with `WorkerDiedError`
    naming it, not a wait."""
    from phantora.netsim.decompose import WorkerDiedError
    from phantora.plan_split import split_jobs

    topo = load_topology("rail128")
    split = split_jobs(moe_1mib(tmp_path, topo), AlgoOptions())
    assert split is not None
    sim = two_workers_ahead(topo, split[1])
    try:
        packet: Any = sim.packet  # type: ignore[attr-defined]
        victim = packet.workers[1]
        victim.proc.kill()  # (a process this test started, by its handle, before its interpreter could plan)
        victim.proc.wait()
        with pytest.raises(WorkerDiedError, match=r"decomposition worker 1 \(pid \d+, pieces .*\) exited with code"):
            packet.plan_groups(split[1])
    finally:
        sim.close()


def test_a_stopped_worker_ends_the_plan_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker given its groups at its start and stopped (SIGSTOP) before it planned: silent and idle past
    `WORKER_SILENCE_S` (1 s here), it ends the plan with `WorkerDiedError` naming it."""
    import os
    import signal

    from bridge import workers
    from phantora.netsim.decompose import WorkerDiedError
    from phantora.plan_split import split_jobs

    monkeypatch.setattr(workers, "WORKER_SILENCE_S", 1.0)
    topo = load_topology("rail128")
    split = split_jobs(moe_1mib(tmp_path, topo), AlgoOptions())
    assert split is not None
    sim = two_workers_ahead(topo, split[1])
    try:
        packet: Any = sim.packet  # type: ignore[attr-defined]
        os.kill(packet.workers[0].pid, signal.SIGSTOP)  # (a process this test started; killed stopped at close)
        with pytest.raises(WorkerDiedError, match=r"decomposition worker 0 \(pid \d+.* silent for 1 s before it plan"):
            packet.plan_groups(split[1])
    finally:
        sim.close()


def test_a_planned_file_round_trips_and_bad_ones_are_named(tmp_path: Path) -> None:
    """`write_planned` then `read_planned`: the replies `packed_replies` makes; a job that cannot be planned is
    refused, not raised; a file that is not a worker's answer is named."""
    from bridge.plan_groups import packed_replies, read_planned, write_planned
    from phantora.plan_split import split_jobs

    topo = load_topology("rail128")
    split = split_jobs(moe_1mib(tmp_path, topo), AlgoOptions())
    assert split is not None
    jobs = split[1][:2]
    write_planned(tmp_path / "a.msgpack", topo, jobs, 1 << 30)
    replies, cpu = read_planned(tmp_path / "a.msgpack", 2)
    assert replies == msgpack.unpackb(packed_replies(topo, jobs, 1 << 30), raw=False) and cpu >= 0
    write_planned(tmp_path / "b.msgpack", topo, [{"ops": []}], 1 << 30)  # (no "env": a KeyError in plan_group)
    (refused,), _ = read_planned(tmp_path / "b.msgpack", 1)
    assert refused["refused"].startswith("planning on the worker failed: KeyError")
    (tmp_path / "c.msgpack").write_bytes(msgpack.packb({"replies": 3}))
    with pytest.raises(ValueError, match=r"c\.msgpack: not a worker's planned groups"):
        read_planned(tmp_path / "c.msgpack", 1)
    with pytest.raises(ValueError, match=r"a\.msgpack: 3 planned groups expected"):
        read_planned(tmp_path / "a.msgpack", 3)
