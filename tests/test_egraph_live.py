"""End to end: record real training scripts run by the live runtime, then replay them without torch.

The live runs are real rank processes (torch + gloo + the bridge), so the default tests use 2 ranks and a
tiny model; the 4- and 8-rank checks of issue 8 (DDP and FSDP recorded at 8 ranks and replayed on the same
and on a 2x oversubscribed fabric, scale-up against a live run at 4x the world, and 8 -> 64 ranks) are
marked slow.

The 64-rank side of the 8 -> 64 check is not a real-torch run (64 rank processes cost ~20 GB of RAM): it
is the bridge's coordinator (`bridge.core.CoordinatorCore`, exact mode, flow engine) driven by 64 scripted
ranks that execute the recorded 8-rank program with their collectives over the 64-rank world, as
tests/test_egraph_scale.py does for synthetic programs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_egraph_replay import Op, cosim

from phantora.cli import main
from phantora.egraph import load, replay_graph
from phantora.egraph.format import Coll, Compute, Step, Wait, step_times
from phantora.egraph.live import record_run
from phantora.egraph.scale import scale_dp
from phantora.launcher import RunConfig, launch
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--layers", "2", "--d-model", "64", "--heads", "2", "--seq", "32", "--batch", "2", "--steps", "3"]


def star(n: int):
    return leaf_spine(1, n, 0, nic_rate="100Gbps", latency="1us", name=f"star{n}")


def live_steps(report) -> list[int]:
    return [s["time_ns"] for s in report.summary["steps"]]


def one_per_leaf(n: int, oversub: int):
    """n GPUs, one per leaf, one spine: every ring edge crosses the spine, so a leaf uplink thinner than a NIC binds.

    With two or more GPUs per leaf a ring leaves a leaf on one edge per channel, and that edge's flows
    never need more than one NIC's rate: an oversubscription up to the GPUs per leaf costs a ring nothing.
    """
    return leaf_spine(n, 1, 1, nic_rate="100Gbps", oversubscription=oversub, latency="1us", name=f"leaf1x{n}-{oversub}")


@pytest.fixture(scope="module", params=["gpt_ddp", "gpt_fsdp"])
def recorded8(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A real 8-rank run of the example (tiny model), recorded on the non-blocking one-GPU-per-leaf fabric."""
    script = str(ROOT / "examples" / f"{request.param}.py")
    trace = tmp_path_factory.mktemp(f"rec8-{request.param}") / "trace"
    report, graph = record_run(RunConfig(script, ARGS, one_per_leaf(8, 1), nproc=8, timeout_s=900), trace)
    return request.param, script, report, graph


@pytest.mark.slow
def test_8_rank_recording_replays_exactly_and_predicts_2x_oversubscription(recorded8) -> None:
    example, script, report, graph = recorded8
    fast, slow = one_per_leaf(8, 1), one_per_leaf(8, 2)
    recorded = live_steps(report)
    assert graph.world == 8 and len(graph.programs) == 1  # the 8 ranks share one program
    assert replay_graph(graph, fast, FlowSimulator(fast)).step_times_ns == recorded  # identical, step by step
    live_slow = live_steps(launch(RunConfig(script, ARGS, slow, nproc=8, timeout_s=900)))
    pred = replay_graph(graph, slow, FlowSimulator(slow)).step_times_ns
    assert pred == pytest.approx(live_slow, rel=0.01)
    assert pred[-1] > recorded[-1] and live_slow[-1] > recorded[-1]  # 2x binds on this fabric
    print(f"{example}: recorded {recorded}, 2x live {live_slow}, 2x replay {pred}")


def scripted_ranks(graph, world: int) -> list[list[Op]]:
    """The recorded programs as scripted ranks of a `world`-rank job: rank r runs the program of rank
    r mod (recorded world), every collective over the whole new world (DDP / FSDP have one group) with its recorded
    reduction (FSDP2 reduce-scatters with avg, which NCCL runs on other algorithms than a sum: 1ad4874)."""
    scripts = []
    for r in range(world):
        entry = graph.ranks[r % graph.world]
        ops: list[Op] = []
        where: dict[int, int] = {}  # node index -> op index of its "x"
        for i, node in enumerate(graph.programs[entry.program].nodes):
            assert node.stream == 0 and not node.deps, node  # the runtime records one stream
            if isinstance(node, Compute):
                ops.append(("c", node.name, node.dur_ns))
            elif isinstance(node, Coll):
                group = graph.groups[entry.groups[node.slot]]
                assert sorted(group) == list(range(graph.world)), group
                root = None if node.root is None else node.root  # group-local == global over the world
                where[i] = len(ops)
                ops.append(("x", node.kind, range(world), node.nbytes, node.dtype, root, node.redop))
            elif isinstance(node, Wait):
                ops += [("w", where[j]) for j in node.refs]
            elif isinstance(node, Step):
                ops.append(("s",))
            else:
                raise AssertionError(f"unexpected node {node}")
        scripts.append(ops)
    return scripts


@pytest.mark.slow
def test_8_rank_recording_scales_to_64_ranks(recorded8) -> None:
    """--scale-dp 64 on the real 8-rank recording against a 64-rank co-simulation of the same program."""
    example, _script, _report, graph = recorded8
    scaled, rep = scale_dp(graph, 64)
    assert rep.parallelism == ("ddp" if example == "gpt_ddp" else "fsdp")
    topo = one_per_leaf(64, 1)
    pred = replay_graph(scaled, topo, FlowSimulator(topo)).step_times_ns
    live = step_times(cosim(topo, scripted_ranks(graph, 64)))  # each collective with its recorded reduction
    rs = {n.redop for p in graph.programs for n in p.nodes if isinstance(n, Coll) and n.kind == "reduce_scatter"}
    assert rs == ({"avg"} if example == "gpt_fsdp" else set()), rs  # FSDP2 averages its gradients' shards
    assert pred == pytest.approx(live, rel=0.03)
    print(f"{example} 8 -> 64: replayed {pred}, co-simulated {live}, recorded at 8 {graph.recorded_step_times()}")


def test_recorded_ddp_run_replays_to_its_step_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`phantora run --record` then `phantora replay` on the same topology gives the live step times exactly."""
    import json

    from phantora.topology import load_topology

    script = str(ROOT / "examples" / "gpt_ddp.py")
    trace, out = tmp_path / "trace", tmp_path / "live"
    rc = main(
        ["run", "-t", "testbed16", "--nproc", "2", "-q", "--record", str(trace), "--out", str(out), script, *ARGS]
    )
    assert rc == 0
    live = [s["time_ns"] for s in json.loads((out / "results.json").read_text())["steps"]]
    graph = load(trace)
    assert len(live) == 3 and len(graph.programs) == 1  # both DDP ranks run one program
    assert graph.recorded_step_times() == live and graph.recorded["idle_ns"] == [0, 0]
    topo = load_topology("testbed16")
    res = replay_graph(graph, topo, FlowSimulator(topo))
    assert res.step_times_ns == live  # exact in flow mode
    kinds = {n.kind for n in graph.programs[0].nodes if hasattr(n, "kind")}
    assert "all_reduce" in kinds
    # The same through the command line.
    assert main(["replay", str(trace), "--topology", "testbed16", "--out", str(tmp_path / "o")]) == 0
    assert "recorded" in capsys.readouterr().out and (tmp_path / "o" / "results.json").is_file()


def test_deduplicated_recording_stores_every_rank_and_replays_exactly(tmp_path: Path) -> None:
    """TP 2 x FSDP 2 on 4 ranks run by 2 live processes (phantom tensors), recorded: the mirrored ranks
    get the live ranks' program on shifted TP groups and the same FSDP groups, and the replay of the
    4-rank graph on the recording topology gives the live step times exactly (a wrong group would make
    the collectives of the replay mismatch or hang)."""
    from phantora.topology import load_topology

    args = ["--model", "tiny", "--seq", "64", "--batch", "2", "--steps", "2", "--parallel", "tp-fsdp", "--tp", "2"]
    cfg = RunConfig(str(ROOT / "examples" / "llama_train.py"), args, "testbed16", nproc=4, trace="none", timeout_s=300)
    cfg.tensors, cfg.dedup = "phantom", "2"
    report, graph = record_run(cfg, tmp_path / "trace")
    assert report.summary["live_processes"] == 2 and graph.world == 4
    assert [e.program for e in graph.ranks[2:]] == [e.program for e in graph.ranks[:2]]
    members = {r: {frozenset(graph.group_of(r, s)) for s in range(len(graph.ranks[r].groups))} for r in range(4)}
    assert frozenset({0, 1}) in members[0] and frozenset({2, 3}) in members[2]  # TP groups shifted
    assert frozenset({0, 2}) in members[0] and frozenset({0, 2}) in members[2]  # the FSDP group shared
    assert frozenset({2, 3}) not in members[0] and frozenset({0, 1}) not in members[2]
    live = live_steps(report)
    topo = load_topology("testbed16")
    assert replay_graph(graph, topo, FlowSimulator(topo)).step_times_ns == live


@pytest.mark.slow
def test_recorded_fsdp_run_tracks_an_oversubscribed_fabric(tmp_path: Path) -> None:
    script = str(ROOT / "examples" / "gpt_fsdp.py")
    fast = leaf_spine(2, 2, 1, nic_rate="100Gbps", oversubscription=1, latency="1us", name="fast")
    slow = leaf_spine(2, 2, 1, nic_rate="100Gbps", oversubscription=4, latency="1us", name="slow")
    report, graph = record_run(RunConfig(script, ARGS, fast, nproc=4, timeout_s=600), tmp_path / "trace")
    assert replay_graph(graph, fast, FlowSimulator(fast)).step_times_ns == live_steps(report)
    live_slow = live_steps(launch(RunConfig(script, ARGS, slow, nproc=4, timeout_s=600)))
    pred = replay_graph(graph, slow, FlowSimulator(slow)).step_times_ns
    assert pred == pytest.approx(live_slow, rel=0.01)
    assert pred[-1] > live_steps(report)[-1]


@pytest.mark.slow
@pytest.mark.parametrize("example", ["gpt_ddp", "gpt_fsdp"])
def test_scale_up_predicts_a_live_run_at_4x(tmp_path: Path, example: str) -> None:
    script = str(ROOT / "examples" / f"{example}.py")
    _, graph = record_run(RunConfig(script, ARGS, star(2), nproc=2, timeout_s=600), tmp_path / "trace")
    scaled, rep = scale_dp(graph, 8)
    assert rep.parallelism == ("ddp" if example == "gpt_ddp" else "fsdp")
    pred = replay_graph(scaled, star(8), FlowSimulator(star(8))).step_times_ns
    live = live_steps(launch(RunConfig(script, ARGS, star(8), nproc=8, timeout_s=900)))
    assert pred == pytest.approx(live, rel=0.03)
    assert step_times(graph.recorded["step_ends_ns"])[-1] < live[-1]  # the larger ring costs more


PHANTOM_SCALE_CASES = {
    # Llama-3-8B shapes with 2 blocks, FSDP2 (llama_train.py)
    "fsdp": ("llama_train.py", ["--model", "llama3-8b", "--layers", "2", "--seq", "2048", "--batch", "1"], [], []),
    # GPT-3 1.7B shapes with 2 blocks, torch DDP, one micro-batch per rank (weak scaling: global batch grows)
    "ddp": (
        "megatron_gpt.py",
        ["--model", "gpt3-1.7b", "--layers", "2", "--tp", "1", "--micro-batch", "1", "--dp-impl", "torch"],
        ["--global-batch", "8"],
        ["--global-batch", "64"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", sorted(PHANTOM_SCALE_CASES))
def test_scale_up_matches_a_live_phantom_run_at_64_ranks(tmp_path: Path, parallelism: str) -> None:
    """Recorded on 8 ranks; --scale-dp 64 against a live 64-rank run (phantom tensors, 8 live processes
    standing for the 64 ranks) on the same fabric: within 3%."""
    name, args, at8, at64 = PHANTOM_SCALE_CASES[parallelism]
    script, args = str(ROOT / "examples" / name), [*args, "--steps", "3"]
    common = {"trace": "none", "timeout_s": 900, "tensors": "phantom"}
    _, graph = record_run(RunConfig(script, args + at8, "rail128", nproc=8, dedup="off", **common), tmp_path / "t")
    scaled, rep = scale_dp(graph, 64)
    assert rep.parallelism == parallelism
    from phantora.topology import load_topology

    topo = load_topology("rail128")
    pred = replay_graph(scaled, topo, FlowSimulator(topo)).step_times_ns
    live = live_steps(launch(RunConfig(script, args + at64, topo, nproc=64, dedup="8", **common)))
    assert pred[-1] == pytest.approx(live[-1], rel=0.03)
    print(f"{parallelism} 8 -> 64: replayed {pred}, live {live}")
