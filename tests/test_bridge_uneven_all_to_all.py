"""A workload's all_to_all with `splits`, co-simulated through the bridge (one replay_rank process a rank), runs as
one NCCL group on the coordinator too: its transfers name the group's communicator and one launch a rank
(`client.p2p_group`), so the coordinator's P2pBatches hands each the others in flight and each pair ends when the
in-process replay's does (which rates them with the closed forms of tests/test_p2p_group.py)."""

from __future__ import annotations

import json
from itertools import permutations
from pathlib import Path
from typing import Any

import pytest
from forked_replay import replay_ranks

from bridge.run import CosimRun
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.flow import FlowSimulator
from phantora.replay import replay_inprocess, replay_settled
from phantora.topology import dgx_host
from phantora.workload import Workload, as_job, load_workload

KiB, MiB = 1 << 10, 1 << 20


def test_a_skewed_split_all_to_all_runs_as_in_process(tmp_path: Path) -> None:
    topo = dgx_host(8, gpu="h100")
    splits = [[0 if i == j else 16 * MiB if (i, j) == (0, 1) else 64 * KiB * (1 + (i + j) % 3) for j in range(8)]
              for i in range(8)]  # fmt: skip
    path = tmp_path / "wl.json"
    path.write_text(json.dumps({"op": [{"name": "d", "kind": "all_to_all", "ranks": "all", "splits": splits}]}))
    wl = load_workload(path, world=8)
    ref = {op.name: (op.start_ns, op.end_ns) for op in replay_inprocess(wl, topo, FlowSimulator(topo)).ops}
    res = CosimRun(topo, **replay_ranks(path), timeout_s=120).run()
    got = {r["name"]: (r["t_start"], r["end_ns"]) for r in res.collectives}
    assert len(got) == 56 and got == ref
    assert {tuple(r["comm"]) for r in res.collectives} == {tuple(range(8))}


APART = Path(__file__).resolve().parents[1] / "bench" / "p2p_apart.json"  # bench/bench_p2p_replay.py --workload


def in_process_and_bridged(tmp_path: Path, spec: EngineSpec, unit: str = "MiB") -> tuple[Workload, dict, dict]:
    """bench/p2p_apart.json (its sizes in `unit`) on 8 H100s: each op's (start, end) ns in process (`replay_settled`)
    and through the bridge's replay ranks, on the engine `spec` names."""
    topo = dgx_host(8, gpu="h100")
    path = tmp_path / "wl.json"
    path.write_text(APART.read_text().replace("MiB", unit))
    wl = load_workload(path, world=8)
    res, sim = replay_settled(wl, topo, lambda: make_engine(spec, topo), window_ns=spec.window_ns)
    sim.close()
    bridged = CosimRun(topo, **replay_ranks(path), timeout_s=600, engine=spec).run()
    return (
        wl,
        {op.name: (op.start_ns, op.end_ns) for op in res.ops},
        {r["name"]: (r["t_start"], r["end_ns"]) for r in bridged.collectives},
    )


def test_groups_whose_ranks_issue_apart_replay_in_process_as_through_the_bridge(tmp_path: Path) -> None:
    """Two uneven all-to-alls whose ranks issue apart (their `after` ops end apart on the ranks, with uneven gaps):
    through the bridge each pair starts at the later of its ranks' issues and is rated with the pairs its coordinator
    knows then; the in-process replay rates each pair so too (`replay_settled`), so every op ends at the same ns
    (before, it rated a group's pairs from one start, all known: 5 of 28 ops equal). Ranks 0 and 1 issue the first group
    64 us before ranks 2 and 3 (which wait for a longer transfer and a second one 30 us after it), so the first
    pairs know only each other."""
    wl, ref, got = in_process_and_bridged(tmp_path, EngineSpec())
    assert len(got) == 3 + 2 * 12 + 1 and got == ref
    assert ref["a2a/0>2"][0] - ref["a2a/0>1"][0] > 60_000  # the ranks issued apart
    from phantora.replay_groups import ratings_of

    topo = dgx_host(8, gpu="h100")
    done = {r.name: r.rank_done_ns for r in replay_inprocess(wl, topo, FlowSimulator(topo)).ops}
    rated = ratings_of(wl, {k: v[0] for k, v in ref.items()}, done)
    assert rated["a2a/0>1"].inflight == rated["a2a/1>0"].inflight == ((0, 1), (1, 0))
    assert len(rated["a2a/0>2"].inflight) == 12


@pytest.mark.slow
def test_groups_whose_ranks_issue_apart_replay_in_process_as_through_the_bridge_on_ns3(tmp_path: Path) -> None:
    """The same on ns-3 (KiB for MiB): every op ends in process where it ends through the bridge."""
    _, ref, got = in_process_and_bridged(tmp_path, EngineSpec(network="ns3"), "KiB")
    assert len(got) == 28 and got == ref


def test_window_mode_rounds_rate_a_group_whose_ranks_ran_on_from_one_window_end_together(tmp_path: Path) -> None:
    """In window mode the bridge's coordinator launches in rounds: the `back` group's ranks join their last `a2a`
    transfers 2-11 us apart, all within one window of 20 us, and run on from its end together, so each pair of the
    group knows all 12 (exact mode's rule: `back/1>3`, whose ranks joined first, knows only the pairs whose ranks had
    joined before its start). The in-process replay given the window rates them so (`ratings_of(..., window_ns)`)."""
    from phantora.replay_groups import ratings_of

    topo = dgx_host(8, gpu="h100")
    wl = load_workload(APART, world=8)
    res = replay_inprocess(wl, topo, FlowSimulator(topo))
    starts, done = {r.name: r.start_ns for r in res.ops}, {r.name: r.rank_done_ns for r in res.ops}
    joins = [max(done[f"a2a/{a}>{b}"][r] for a, b in permutations(range(4), 2) if r in (a, b)) for r in range(4)]
    assert max(joins) - min(joins) < 20_000 and max(joins) // 20_000 == min(joins) // 20_000  # one window
    exact, rounds = ratings_of(wl, starts, done), ratings_of(wl, starts, done, window_ns=20_000)
    assert len(exact["back/1>3"].inflight) < 12
    assert {len(g.inflight) for k, g in rounds.items() if k.startswith("back/")} == {12}


@pytest.mark.slow
def test_groups_replay_in_process_in_their_bridge_durations_in_window_mode(tmp_path: Path) -> None:
    """Through the bridge in 20 us windows, bench/p2p_apart.json's transfers start late by the window's error, so
    their ends are not the in-process replay's; given the window, the in-process replay rates each group by the
    coordinator's rounds, and every op takes its bridge duration (before: exact mode's rule, 26 of 28, back/1>3
    and back/3>1 rated with fewer pairs than live)."""
    _, ref, got = in_process_and_bridged(tmp_path, EngineSpec(window_ns=20_000))
    assert len(got) == 28 and {k: e - s for k, (s, e) in got.items()} == {k: e - s for k, (s, e) in ref.items()}
    assert got != ref  # the ends: window mode's lateness


def test_a_split_all_to_all_run_as_steps_keeps_its_group(tmp_path: Path) -> None:
    """`--steps` (`workload.as_job`) keeps a `splits` transfer's NCCL group: through the bridge's replay ranks and in
    process, every pair of the one-step job ends at the ns it ends at without --steps (before, the steps' transfers
    went to the coordinator ungrouped, each rated alone: 64 KiB pairs ended at 14,982 ns, not 18,163)."""
    topo = dgx_host(8, gpu="h100")
    splits = [[0 if i == j else 16 * MiB if (i, j) == (0, 1) else 64 * KiB * (1 + (i + j) % 3) for j in range(8)]
              for i in range(8)]  # fmt: skip
    path = tmp_path / "wl.json"
    path.write_text(json.dumps({"op": [{"name": "d", "kind": "all_to_all", "ranks": "all", "splits": splits}]}))
    plain = {r["name"]: r["end_ns"] for r in CosimRun(topo, **replay_ranks(path), timeout_s=120).run().collectives}
    stepped = CosimRun(topo, **replay_ranks(path, "--steps", "1"), timeout_s=120).run().collectives
    assert len(plain) == 56 and {r["name"].removesuffix("@0"): r["end_ns"] for r in stepped} == plain
    wl = load_workload(path, world=8)
    alone = {op.name: op.end_ns for op in replay_inprocess(wl, topo, FlowSimulator(topo)).ops}
    steps = replay_inprocess(as_job(wl, 1), topo, FlowSimulator(topo)).ops
    assert {op.name.removesuffix("@0"): op.end_ns for op in steps} == alone == plain
    assert {op.group for op in as_job(wl, 2).ops} == {"d@0", "d@1"}


def test_netsim_flows_rates_a_workload_group_as_the_replay(tmp_path: Path) -> None:
    """`phantora netsim --flows WORKLOAD` plans bench/p2p_apart.json with its NCCL groups rated as the replay rates
    them (`replay.settle_groups` on the run's engine), so every op ends at the ns `phantora replay`'s runs give it;
    planned as before, all from one start with every pair known, they end elsewhere."""
    from phantora.commands.netsim import _run_flow, read_netsim_input
    from phantora.commands.replay import workload_engine

    topo = dgx_host(8, gpu="h100")
    engine = EngineSpec(flow_goodput=True)  # as netsim runs the flow engine
    wl = load_workload(APART, world=8)
    res, sim = replay_settled(wl, topo, lambda: workload_engine(engine, topo, None))
    sim.close()
    ref = {op.name: op.end_ns for op in res.ops if op.kind == "send_recv"}

    def ends(inp: Any) -> dict[str, int]:
        done = _run_flow(topo, inp, engine)["done"]
        return {n: max(done[f.id].end_ns for f in inp.flows if f.tag.startswith(f"{n}/p2p/")) for n in ref}

    assert ends(read_netsim_input(APART, topo, lambda: workload_engine(engine, topo, None))) == ref
    before = ends(read_netsim_input(APART, topo))
    assert before != ref  # 8 of the 27 transfers, on 2026-12-01


def test_a_jobs_workload_job_rates_each_pair_as_the_replay(tmp_path: Path) -> None:
    """`--jobs` rates a workload job's NCCL groups (`splits`) each pair from its own start with the pairs known then,
    by runs of the job alone on its GPUs (`replay.settle_groups`), so bench/p2p_apart.json as a job ends every op at
    the ns `phantora replay` gives it (before, its groups were rated from one start, all known: the transfers of the
    group whose ranks issue apart ended elsewhere); its steps keep their groups (one LaunchGroup a step's)."""
    from phantora.jobs.recorded import plan_recorded
    from phantora.jobs.run import launch_jobs
    from phantora.jobs.spec import JobSpec, parse_jobs
    from phantora.launcher import RunConfig

    topo = dgx_host(8, gpu="h100")
    res, sim = replay_settled(load_workload(APART, world=8), topo, lambda: FlowSimulator(topo))
    sim.close()
    ref = {op.name: (op.start_ns, op.end_ns) for op in res.ops}
    spec = parse_jobs(f'[[job]]\nname = "moe"\nworkload = "{APART}"\nranks = 4\nplacement = "0-3"\n',
                      str(tmp_path / "jobs.toml"), tmp_path)  # fmt: skip
    launch_jobs(spec, RunConfig(script="", topology=topo, out_dir=tmp_path / "o", trace="none"), live_ok=False)
    doc = json.loads((tmp_path / "o" / "jobs" / "moe" / "results.json").read_text())
    got = {c["name"]: (c["t_start"], c["end_ns"]) for c in doc["collectives"]}
    assert len(got) == 28 and got == ref
    assert ref["a2a/0>2"][0] - ref["a2a/0>1"][0] > 60_000  # the ranks issued apart
    job = JobSpec("moe", "workload", str(APART), ranks=4, steps=2)
    rec = plan_recorded(job, 0, topo, [0, 1, 2, 3], None, make=FlowSimulator)
    assert rec.workload is not None
    assert {op.group for op in rec.workload.ops} == {"", "a2a@0", "back@0", "a2a@1", "back@1"}
    launches = {op.group: op.coll.launch for op in rec.workload.ops if op.name.startswith("a2a/0>2@")}
    assert all(g is not None and len(g.pairs) == 12 for g in launches.values())
