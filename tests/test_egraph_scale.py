"""--scale-dp: a DDP / FSDP graph recorded at 8 ranks predicts a live co-simulated run at 4x and 8x the world."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_egraph_replay import MiB, Op, cosim, ddp_script, fsdp_script, ring_ar_ns, star

from phantora.collectives.spec import AlgoOptions
from phantora.egraph import ProgramBuilder, build_graph, load, replay_graph
from phantora.egraph.format import Compute, step_times
from phantora.egraph.scale import scale_dp
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator


def test_ddp_8_to_32_matches_a_live_run_at_32(tmp_path: Path) -> None:
    scripts = [ddp_script(r, 8, 4, 16 * MiB, 1_000_000) for r in range(8)]
    cosim(star(8), scripts, record=tmp_path / "t")
    scaled, rep = scale_dp(load(tmp_path / "t"), 32)
    assert rep.parallelism == "ddp" and (rep.dp_old, rep.dp_new, rep.mp) == (8, 32, 1)
    assert any("weak scaling" in a for a in rep.assumptions)
    topo = star(32)
    live = step_times(cosim(topo, [ddp_script(r, 32, 4, 16 * MiB, 1_000_000) for r in range(32)]))
    pred = replay_graph(scaled, topo, FlowSimulator(topo)).step_times_ns
    assert pred == pytest.approx(live, rel=0.03)
    # The all-reduces are exposed here: the step grows with the ring factor 2(n-1)/n from 8 to 32 ranks.
    at8 = replay_graph(load(tmp_path / "t"), star(8), FlowSimulator(star(8))).step_times_ns
    assert pred[-1] > at8[-1]


def test_fsdp_8_to_32_matches_a_live_run_at_32(tmp_path: Path) -> None:
    """FSDP units keep their full size: the all-gather output and reduce-scatter input do not depend on n."""
    shard = 4 * MiB
    cosim(star(8), [fsdp_script(8, 4, shard, 400_000) for _ in range(8)], record=tmp_path / "t")
    scaled, rep = scale_dp(load(tmp_path / "t"), 32)
    assert rep.parallelism == "fsdp" and any("optimizer step" in a for a in rep.assumptions)
    topo = star(32)
    live = step_times(cosim(topo, [fsdp_script(32, 4, shard * 8 // 32, 400_000) for _ in range(32)]))
    assert replay_graph(scaled, topo, FlowSimulator(topo)).step_times_ns == pytest.approx(live, rel=0.03)


def test_ddp_8_to_64_matches_a_64_rank_graph_and_the_closed_form() -> None:
    size, n_big = 32 * MiB, 64

    def graph(n: int):
        bs = []
        for r in range(n):
            b = ProgramBuilder(r)
            b.compute("bwd", 200_000)
            h = b.collective("all_reduce", range(n), size)
            b.compute("bwd_rest", 100_000)
            b.wait([h])
            b.compute("opt", 50_000)
            b.step()
            bs.append(b)
        return build_graph(bs)

    scaled, _ = scale_dp(graph(8), n_big)
    topo = star(n_big)
    for algo in (AlgoOptions(), AlgoOptions(model="ideal")):
        pred = replay_graph(scaled, topo, FlowSimulator(topo), algo).step_times_ns[0]
        direct = replay_graph(graph(n_big), topo, FlowSimulator(topo), algo).step_times_ns[0]
        assert pred == pytest.approx(direct, rel=0.03)
    # the closed form is the ideal model's line-rate ring (the last `pred`)
    assert pred == pytest.approx(200_000 + ring_ar_ns(size, n_big) + 50_000, rel=0.01)


def test_tp_times_dp_scales_only_the_data_parallel_dimension(tmp_path: Path) -> None:
    def scripts(world: int, tp: int = 2) -> list[list[Op]]:
        out = []
        for r in range(world):
            tp_group = [r - r % tp + i for i in range(tp)]
            dp_group = list(range(r % tp, world, tp))
            ops: list[Op] = [("c", "attn", 200_000), ("x", "all_reduce", tp_group, 2 * MiB), ("w", 1)]
            ops += [("c", "mlp", 300_000), ("x", "all_reduce", dp_group, 8 * MiB), ("w", 4), ("s",)]
            out.append(ops)
        return out

    cosim(star(8), scripts(8), record=tmp_path / "t")
    scaled, rep = scale_dp(load(tmp_path / "t"), 16)
    assert rep.mp == 2 and (rep.dp_old, rep.dp_new) == (4, 8)
    assert scaled.group_of(13, 0) == (12, 13) and scaled.group_of(13, 1) == tuple(range(1, 16, 2))
    topo = star(16)
    live = cosim(topo, scripts(16))
    assert replay_graph(scaled, topo, FlowSimulator(topo)).rank_step_ends_ns == live


def test_scale_rejects_what_it_cannot_retarget() -> None:
    bs = [ProgramBuilder(r) for r in range(4)]
    for b in bs:
        b.wait([b.collective("all_reduce", range(4), 1024)])
    g = build_graph(bs)
    with pytest.raises(InputError, match="multiple of the recorded world"):
        scale_dp(g, 6)
    bs = [ProgramBuilder(r) for r in range(4)]  # a group {0, 1, 2} is none of world / block / dp
    for r, b in enumerate(bs):
        if r < 3:
            b.wait([b.collective("all_reduce", [0, 1, 2], 1024)])
    with pytest.raises(InputError, match=r"group \[0, 1, 2\]"):
        scale_dp(build_graph(bs), 8)


def test_fsdp_scale_up_shrinks_the_optimizer_step_on_smaller_shards() -> None:
    """Compute after the step's last reduce-scatter wait works on shards k times smaller: launch + the
    op class's kernel floor (the default calibrated model's; "adamw" is an unknown name, so elementwise)
    + the rest / k."""
    from phantora.egraph.scale import kernel_floors

    floor = int(kernel_floors({})["elementwise"])
    assert 500 < floor < 3000
    bs = []
    for r in range(8):
        b = ProgramBuilder(r)
        b.compute("fwd_bwd", 400_000)
        h = b.collective("reduce_scatter", range(8), 8 * MiB)
        b.compute("overlapped", 30_000)  # before the wait: backward work on full-size tensors
        b.wait([h])
        b.compute("adamw", 81_000)
        b.compute("tiny", 800)  # below the launch overhead: unchanged
        b.step()
        bs.append(b)
    scaled, rep = scale_dp(build_graph(bs), 32)
    durs = {n.name: n.dur_ns for n in scaled.programs[scaled.ranks[5].program].nodes if isinstance(n, Compute)}
    adamw = 1_000 + floor + -(-(80_000 - floor) // 4)
    assert durs == {"fwd_bwd": 400_000, "overlapped": 30_000, "adamw": adamw, "tiny": 800}


def test_fsdp_optimizer_step_shrinks_above_launch_and_kernel_floor() -> None:
    """After the step's last reduce-scatter wait, a kernel keeps its launch overhead and its op class's
    floor and 1/k of the rest; a kernel that is all floor keeps its time; compute before the wait and
    in the next step's forward is untouched."""
    from phantora.egraph.scale import shrink_optimizer_step

    launch, floor, k = 1000, 1200, 4
    b = ProgramBuilder(0)
    b.compute("aten.mm", 50_000)  # backward: not the optimizer step
    rs = b.collective("reduce_scatter", (0, 1), 4 * MiB, "bf16", None)
    b.wait([rs])
    big = b.compute("aten.addcdiv_", launch + floor + 40_000)
    tiny = b.compute("aten.mul_", launch + 700)
    b.step(0)
    prog, _ = b.build()
    out = shrink_optimizer_step(prog, k, launch, {"elementwise": floor, "gemm": 1500})
    assert out.nodes[0].dur_ns == 50_000
    assert out.nodes[big].dur_ns == launch + floor + 40_000 // k
    assert out.nodes[tiny].dur_ns == launch + 700
