"""Record once, replay many: replay speed against the live run of the same steps, and trace size.

    python bench/bench_egraph.py [--example gpt_fsdp] [--ranks 4] [--steps 3] [--ns3] [--keep DIR]

1. Runs examples/<example>.py live (`phantora run`, flow network) with every rank recorded, then replays
   the recording in flow mode: wall-clock ratio live / replay, and the replayed vs recorded step time.
2. With --ns3, the same in packet mode (live run on ns-3 with DCQCN, replay on a fresh ns-3 fabric).
3. Trace size per rank per step of those recordings, and of a synthetic Llama-3-8B-like FSDP step on
   64 ranks (32 blocks, op counts of a typical eager step) built with the recorder's builder.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phantora.egraph import ProgramBuilder, build_graph, load, replay_graph, save  # noqa: E402
from phantora.egraph.format import ExecGraph, dir_size_bytes  # noqa: E402
from phantora.egraph.live import record_run  # noqa: E402
from phantora.launcher import RunConfig  # noqa: E402
from phantora.netsim.cli_config import engine_spec_from_flags  # noqa: E402
from phantora.netsim.engine_spec import EngineSpec  # noqa: E402
from phantora.netsim.factory import make_engine  # noqa: E402
from phantora.netsim.packet_config import PacketConfig  # noqa: E402
from phantora.topology.generators import leaf_spine  # noqa: E402
from phantora.topology.model import Topology  # noqa: E402

MODEL = ["--layers", "4", "--d-model", "128", "--heads", "4", "--seq", "64", "--batch", "4"]


def replay_wall(graph_dir: Path, topo: Topology, network: str, cc: str | None, repeat: int) -> tuple[float, list[int]]:
    walls, steps = [], []
    for _ in range(repeat):
        graph = load(graph_dir)
        sim = make_engine(EngineSpec(network, PacketConfig(cc=cc or "none")), topo)
        t0 = time.perf_counter()
        try:
            res = replay_graph(graph, topo, sim)
        finally:
            sim.close()
        walls.append(time.perf_counter() - t0)
        steps = res.step_times_ns
    return statistics.median(walls), steps


def live_vs_replay(args: argparse.Namespace, tmp: Path, network: str, cc: str | None) -> None:
    topo = leaf_spine(1, args.ranks, 0, nic_rate="100Gbps", latency="1us", name=f"star{args.ranks}")
    script = str(ROOT / "examples" / f"{args.example}.py")
    # exact co-simulation (window 0, the default), so the recording is the packet model's own answer
    engine = engine_spec_from_flags(network, cc=cc, window_ns=0)
    cfg = RunConfig(script, [*MODEL, "--steps", str(args.steps)], topo, engine=engine, nproc=args.ranks)
    out = tmp / f"trace-{network}"
    t0 = time.perf_counter()
    report, graph = record_run(cfg, out)
    live_wall = time.perf_counter() - t0
    live_steps = [s["time_ns"] for s in report.summary["steps"]]
    wall, steps = replay_wall(out, topo, network, cc, 1 if network == "ns3" else 3)
    diff = max(abs(a - b) / b for a, b in zip(steps, live_steps, strict=True)) * 100
    size = dir_size_bytes(out)
    nodes = graph.num_nodes()
    print(f"[{network}{'/' + cc if cc else ''}] {args.example}, {args.ranks} ranks, {args.steps} steps")
    own = report.summary["run"]["wall_s"]
    print(f"  live run (with recording): {live_wall:8.2f} s wall   (phantora's own figure {own:.2f} s)")
    print(f"  replay:                    {wall:8.3f} s wall   -> {live_wall / wall:,.0f}x faster")
    print(f"  step times live   (ms): {[round(t / 1e6, 4) for t in live_steps]}")
    print(f"  step times replay (ms): {[round(t / 1e6, 4) for t in steps]}   max diff {diff:.4f}%")
    per = size / graph.world / args.steps
    print(f"  trace: {size:,} B for {graph.world} ranks x {args.steps} steps = {per:,.0f} B "
          f"per rank per step; {len(graph.programs)} distinct program(s), {nodes:,} nodes in all, "
          f"{size / max(1, nodes):.2f} B/node")  # fmt: skip


def llama_like_fsdp(world: int, blocks: int = 32) -> ExecGraph:
    """One FSDP step of a Llama-3-8B-shaped model: per block ~60 forward and ~120 backward aten ops."""
    fwd = ["aten.pow", "aten.mean", "aten.add", "aten.rsqrt", "aten.mul", "aten.mul", "aten.mm", "aten.mm", "aten.mm",
           "aten.view", "aten.mul", "aten.cat", "aten.mul", "aten.add", "aten._scaled_dot_product_flash_attention",
           "aten.mm", "aten.add", "aten.pow", "aten.mean", "aten.add", "aten.rsqrt", "aten.mul", "aten.mul",
           "aten.mm", "aten.silu", "aten.mm", "aten.mul", "aten.mm", "aten.add"] * 2  # fmt: skip
    bwd = [f"{op}_backward" if i % 3 == 0 else op for i, op in enumerate(fwd * 2)]
    params_bytes = 218 * 2**20 * 2  # ~218M parameters per block (bf16)
    bs = []
    for r in range(world):
        b = ProgramBuilder(r)
        b.compute("aten.embedding", 120_000)
        for _ in range(blocks):
            h = b.collective("all_gather", range(world), params_bytes)
            b.wait([h])
            for j, op in enumerate(fwd):
                b.compute(op, 20_000 + 997 * j)
        b.compute("aten.nll_loss_forward", 300_000)
        pending = []
        for _ in range(blocks):
            h = b.collective("all_gather", range(world), params_bytes)
            b.wait([h])
            for j, op in enumerate(bwd):
                b.compute(op, 25_000 + 991 * j)
            pending.append(b.collective("reduce_scatter", range(world), params_bytes * 2, dtype="fp32"))
        b.wait(pending)
        for op in ["aten._foreach_mul_", "aten._foreach_add_", "aten._foreach_addcmul_", "aten._foreach_sqrt",
                   "aten._foreach_div_", "aten._foreach_addcdiv_"] * 4:  # fmt: skip
            b.compute(op, 400_000)
        b.step()
        bs.append(b)
    return build_graph(bs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default="gpt_fsdp", choices=("gpt_ddp", "gpt_fsdp"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ns3", action="store_true", help="also measure packet mode (slow)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the recordings here")
    args = ap.parse_args()
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench-egraph-"))
    live_vs_replay(args, tmp, "flow", None)
    if args.ns3:
        live_vs_replay(args, tmp, "ns3", "dcqcn")
    g = llama_like_fsdp(64)
    save(g, tmp / "llama8b-fsdp64")
    size = dir_size_bytes(tmp / "llama8b-fsdp64")
    print(f"[synthetic] Llama-3-8B-like FSDP step, 64 ranks: {g.num_nodes():,} nodes, {len(g.programs)} program, "
          f"{size:,} B on disk ({size / 64:,.0f} B per rank per step)")  # fmt: skip


if __name__ == "__main__":
    main()
