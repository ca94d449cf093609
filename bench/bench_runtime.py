"""Benchmarks of the live runtime: interception overhead and the cost of many ranks.

    .venv/bin/python bench/bench_runtime.py                 # everything (8 and 32 ranks at the end)
    .venv/bin/python bench/bench_runtime.py --ranks 8       # scale part with 8 ranks only
    .venv/bin/python bench/bench_runtime.py --skip-scale    # overheads only
    .venv/bin/python bench/bench_runtime.py --models-only   # per-op cost of each compute model only

Prints:
- per aten op: plain torch vs under the charging dispatch mode, without the bridge (no-network
  client) and with it (a rank of a real 2-rank co-simulation); simulated device memory on and off;
- per op, the cost of each compute model's `cost()` alone (calibrated, roofline) on typical ops;
- per collective (all_reduce of 4 floats, waited): plain gloo vs the phantora backend, without and
  with the bridge;
- wall time and the sum of the ranks' peak RSS for the GPT DDP example at 8 and 32 ranks, ranks forked
  by the fork server and fresh interpreters side by side.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install

RANK_SCRIPT = """
import json, sys, torch, torch.distributed as dist
from phantora.runtime.timepatch import real_perf_counter as clock
OPS, COLLS = int(sys.argv[1]), int(sys.argv[2])
DEV = sys.argv[3] if len(sys.argv) > 3 else "cpu"  # "cuda": the simulated CUDA device's tensors
dist.init_process_group("nccl" if DEV == "cuda" else None)
x, y = torch.ones(4, device=DEV), torch.ones(4, device=DEV)
for _ in range(200):
    torch.add(x, y)
op_us = coll_us = float("inf")
for _ in range(3):  # best of 3: the machine is shared
    t0 = clock()
    for _ in range(OPS):
        torch.add(x, y)
    op_us = min(op_us, (clock() - t0) / OPS * 1e6)
dist.barrier()
t = torch.ones(4, device=DEV)
for _ in range(20):
    dist.all_reduce(t)
for _ in range(3):
    t0 = clock()
    for _ in range(COLLS):
        dist.all_reduce(t)
    coll_us = min(coll_us, (clock() - t0) / COLLS * 1e6)
if dist.get_rank() == 0:
    print("BENCH " + json.dumps({"op_us": op_us, "coll_us": coll_us}), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bench_line(text: str) -> dict[str, float]:
    for line in text.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError("no BENCH line in:\n" + text[-3000:])


def in_process(ops: int, colls: int) -> dict[str, float]:
    """Per-op and per-collective cost in this process: plain torch/gloo vs phantora without a network."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroupGloo

    from phantora.perfmodel.gpus import get_gpu
    from phantora.runtime.backend import PhantoraProcessGroup
    from phantora.runtime.compute import Roofline
    from phantora.runtime.dispatch import ChargeMode
    from phantora.runtime.nonet import NoNetworkClient
    from phantora.runtime.session import RankSession

    x, y = torch.ones(4), torch.ones(4)

    def best(loop: Callable[[], None], n: int) -> float:
        """Best of 3 timings of `loop` (n iterations inside), in us per iteration."""
        out = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            loop()
            out = min(out, (time.perf_counter() - t0) / n * 1e6)
        return out

    def ops_loop() -> None:
        for _ in range(ops):
            torch.add(x, y)

    def per_op() -> float:
        for _ in range(200):
            torch.add(x, y)
        return best(ops_loop, ops)

    out = {"op_plain_us": per_op()}
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    pg = PhantoraProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=60), [0], s)
    with ChargeMode(s):
        out["op_mode_us"] = per_op()
        # simulated device memory off and on (each torch.add allocates a new 4-float output, then frees it)
        s.memory.enabled = False
        out["op_mode_nomem_us"] = per_op()
        s.memory.enabled = True
        out["op_mode_mem_us"] = per_op()
        t = torch.ones(4)
        pg.allreduce([torch.ones(4)])  # leave one in flight: every op scans its inputs
        out["op_mode_pending_us"] = per_op()
        s.sync()

        def phantora_loop() -> None:
            for _ in range(colls):
                pg.allreduce([t]).wait()

        out["coll_phantora_us"] = best(phantora_loop, colls)
    gloo = ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=60))

    def gloo_loop() -> None:
        for _ in range(colls):
            gloo.allreduce([t]).wait()  # type: ignore[attr-defined]  # torch stubs omit the C++ method

    out["coll_gloo_us"] = best(gloo_loop, colls)
    return out


def model_costs(reps: int, gpu: str = "h100") -> dict[str, dict[str, float]]:
    """us per `cost()` call of each compute model on typical ops (meta tensors; the cache warm, as in a
    training loop that repeats its shapes), of the roofline without its cache, and of the first
    (uncached) call of the calibrated model (the first op of all also pays for lazy imports)."""
    import torch

    from phantora.runtime.compute import COMPUTE_MODELS, build_model

    aten = torch.ops.aten

    def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    x, w, q = meta(8192, 4096), meta(4096, 4096), meta(4, 32, 2048, 128)
    params = [meta(4096, 4096, dtype=torch.float32) for _ in range(64)]
    cases: dict[str, tuple] = {
        "add (2 tensors)": (aten.add.Tensor, (x, x), {}),
        "mm bf16": (aten.mm.default, (x, w), {}),
        "sum over a dim": (aten.sum.dim_IntList, (x, [1]), {}),
        "flash attention": (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q, 0.0, True), {}),
        "_foreach_mul_ (64 tensors)": (aten._foreach_mul_.Scalar, (params, 0.9), {}),
        "view (free)": (aten.view.default, (x, [4096, 8192]), {}),
    }
    out: dict[str, dict[str, float]] = {}
    for name, (func, args, kwargs) in cases.items():
        res = func(*args, **kwargs)
        row = {}
        for kind in COMPUTE_MODELS:
            model = build_model(kind, gpu)
            t0 = time.perf_counter()
            model.cost(func, args, kwargs, res)
            if kind == "calibrated":
                row["calibrated_first_us"] = (time.perf_counter() - t0) * 1e6
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(reps):
                    model.cost(func, args, kwargs, res)
                best = min(best, (time.perf_counter() - t0) / reps * 1e6)
            row[f"{kind}_us"] = best
            if kind == "roofline":  # the same without the cache
                t0 = time.perf_counter()
                for _ in range(reps):
                    model.compute(func, args, kwargs, res)
                row["roofline_uncached_us"] = (time.perf_counter() - t0) / reps * 1e6
        out[name] = row
    return out


def print_model_costs(reps: int, gpu: str = "h100") -> None:
    print(f"per op on {gpu}, compute model cost() alone, us (cached; then uncached roofline, first calibrated call):")
    print(f"  {'op':28s} {'calibrated':>10s} {'roofline':>10s} {'roof. unc.':>10s} {'cal. first':>10s}")
    for name, r in model_costs(reps, gpu).items():
        print(f"  {name:28s} {r['calibrated_us']:10.2f} {r['roofline_us']:10.2f} {r['roofline_uncached_us']:10.2f}"
              f" {r['calibrated_first_us']:10.1f}")  # fmt: skip


def with_bridge(ops: int, colls: int) -> dict[str, float]:
    """The same loops in rank 0 of a 2-rank run: under phantora + the bridge, and on plain gloo."""
    from phantora.launcher import RunConfig, launch
    from phantora.topology.generators import leaf_spine

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank_bench.py"
        script.write_text(textwrap.dedent(RANK_SCRIPT))
        topo = leaf_spine(1, 2, 0, nic_rate="100Gbps", name="star2")
        rep = launch(RunConfig(str(script), [str(ops), str(colls)], topo, nproc=2, trace="none", timeout_s=600))
        sim = _bench_line(rep.logs["rank 0"])
        rep = launch(RunConfig(str(script), [str(ops), str(colls), "cuda"], topo, nproc=2, trace="none", timeout_s=600))
        cuda = _bench_line(rep.logs["rank 0"])
        port = str(_free_port())
        procs = []
        for r in range(2):
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # this tree's
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            env["PYTHONPATH"] = path
            cmd = [sys.executable, str(script), str(ops), str(colls)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = [p.communicate(timeout=600)[0].decode() for p in procs]
        plain = _bench_line(outs[0])
    return {
        "op_plain_us": plain["op_us"],
        "op_bridge_us": sim["op_us"],
        "coll_gloo_2ranks_us": plain["coll_us"],
        "coll_bridge_2ranks_us": sim["coll_us"],
        "op_bridge_cuda_us": cuda["op_us"],
        "coll_bridge_cuda_2ranks_us": cuda["coll_us"],
    }


def scale(ranks: int, steps: int, tensors: str = "real", fork: bool = True) -> dict[str, float]:
    """Wall time and memory of the GPT DDP example with `ranks` ranks (flow network).

    `tensors="real"`: one process per rank with real data; "phantom": meta tensors and rank
    deduplication (`phantora run`'s default above 16 ranks). `fork`: ranks forked by the fork
    server (the default), else each a fresh interpreter."""
    from phantora.launcher import RunConfig, launch
    from phantora.topology.generators import leaf_spine

    topo = leaf_spine(max(1, ranks // 16), min(ranks, 16), 0 if ranks <= 16 else 2, nic_rate="400Gbps", name="bench")
    t0 = time.monotonic()
    cfg = RunConfig(str(ROOT / "examples" / "gpt_ddp.py"), ["--steps", str(steps)], topo, nproc=ranks, trace="none")
    cfg.tensors, cfg.dedup = tensors, ("off" if tensors == "real" else "auto")
    cfg.fork_server = fork
    rep = launch(cfg)
    wall = time.monotonic() - t0
    rss = [r["peak_rss_mb"] for r in rep.summary["ranks"]]
    return {
        "ranks": ranks,
        "live": rep.summary["live_processes"],
        "wall_s": wall,
        "startup_s": rep.cosim.startup_s,
        "sim_wall_s": rep.cosim.sim_wall_s,
        "peak_rss_mb_total": sum(rss),
        "peak_rss_mb_per_rank": max(rss),
        "pss_mb_total": rep.summary["pss_mb_total"],
        "step_time_ms": rep.summary["step_time_ns"]["mean"] / 1e6,
    }


def overheads(ops: int, colls: int) -> None:
    a = in_process(ops, colls)
    plain = a["op_plain_us"]
    print("per aten op (torch.add of 4 floats), in this process, no network:")
    print(f"  plain torch          {plain:8.2f} us")
    print(f"  phantora mode        {a['op_mode_us']:8.2f} us   (+{a['op_mode_us'] - plain:.2f})")
    mem_on, mem_off = a["op_mode_mem_us"], a["op_mode_nomem_us"]
    print(f"  ... memory tracking  {mem_on:8.2f} us on, {mem_off:.2f} us off   (+{mem_on - mem_off:.2f})")
    print(f"  ... one coll pending {a['op_mode_pending_us']:8.2f} us   (+{a['op_mode_pending_us'] - plain:.2f})")
    print("per all_reduce of 4 floats, waited, 1 rank, no network:")
    gloo, ph = a["coll_gloo_us"], a["coll_phantora_us"]
    print(f"  gloo                 {gloo:8.2f} us")
    print(f"  phantora (no bridge) {ph:8.2f} us   (+{ph - gloo:.2f})")
    b = with_bridge(ops, colls)
    print("rank 0 of 2 ranks, real bridge (flow, exact mode) vs plain gloo:")
    print(f"  per op:         plain {b['op_plain_us']:8.2f} us   phantora+bridge {b['op_bridge_us']:8.2f} us")
    gloo2, ph2 = b["coll_gloo_2ranks_us"], b["coll_bridge_2ranks_us"]
    print(f"  per all_reduce: gloo  {gloo2:8.2f} us   phantora+bridge {ph2:8.2f} us")
    print("the same, on the simulated CUDA device (cuda tensors, NCCL), same run:")
    cu = b["op_bridge_cuda_us"]
    print(f"  per op:         {cu:8.2f} us ({cu / b['op_bridge_us']:.2f}x cpu tensors)")
    print(f"  per all_reduce: {b['coll_bridge_cuda_2ranks_us']:8.2f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--colls", type=int, default=500)
    p.add_argument("--ranks", type=int, nargs="*", default=[8, 32])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--models-only", action="store_true", help="only the per-op cost of each compute model")
    p.add_argument("--gpu", default="h100", help="GPU of the per-op compute-model costs (default h100)")
    args = p.parse_args()
    print_model_costs(2000, args.gpu)
    if args.models_only:
        return
    if not args.skip_overhead:
        overheads(args.ops, args.colls)
    if not args.skip_scale:
        print("GPT DDP example (examples/gpt_ddp.py defaults), flow network; ranks forked by the fork server")
        print("or fresh interpreters (RSS counts the pages forked ranks share once per rank; PSS splits them):")
        runs = [(n, "real", fork) for n in args.ranks for fork in (True, False)]
        for n, tensors, fork in runs + [(n, "phantom", True) for n in args.ranks]:
            r = scale(n, args.steps, tensors, fork)
            how = "forked" if fork else "fresh "
            print(
                f"  {n:3d} ranks, {tensors:7s} {how} ({r['live']:2d} processes): wall {r['wall_s']:6.1f} s"
                f" (start-up {r['startup_s']:.1f} s,"
                f" co-sim {r['sim_wall_s']:.1f} s), peak RSS {r['peak_rss_mb_total'] / 1024:.2f} GB total,"
                f" {r['peak_rss_mb_per_rank']:.0f} MB/rank, PSS at the end {r['pss_mb_total'] / 1024:.2f} GB total,"
                f" simulated step {r['step_time_ms']:.3f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
