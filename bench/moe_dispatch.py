"""An MoE-like skewed token dispatch: one uneven all_to_all_single, splits drawn with a fixed seed.

Every rank draws the same matrix (numpy, `--seed`): the bytes rank s sends rank d, log-uniform between `--min-mib`
and `--max-mib` MiB (rows of 4 KiB), the way a router's skew makes a few experts' shares large and most small. Run
it live (`phantora run --tensors phantom --nproc N bench/moe_dispatch.py`); it prints the call's span on rank 0 in
ns of simulated time, and results.json / cosim.json hold each transfer's record (docs/collectives.md, "Uneven
all-to-all, gather, scatter and batches"). Tensors are made and a barrier passed before the call, so every rank
issues it at once. `--capped-rank R`: rank R sends and receives exactly `--max-mib` MiB to and from every rank, itself
included (an expert at its capacity limit), so its own splits are all equal while the others' are not.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist

ROW = 4096  # bytes: 1024 float32


def splits(n: int, seed: int, lo_mib: float, hi_mib: float, capped: int | None = None) -> np.ndarray:
    """The rows rank s sends rank d (diagonal: kept local, 0; rank `capped`'s row and column: `hi_mib`, all)."""
    rng = np.random.default_rng(seed)
    mib = np.exp(rng.uniform(np.log(lo_mib), np.log(hi_mib), size=(n, n)))
    rows = np.maximum(1, np.round(mib * 2**20 / ROW)).astype(int)
    np.fill_diagonal(rows, 0)
    if capped is not None:
        rows[capped, :] = rows[:, capped] = round(hi_mib * 2**20 / ROW)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-mib", type=float, default=1.0)
    ap.add_argument("--max-mib", type=float, default=64.0)
    ap.add_argument("--capped-rank", type=int, default=None, help="a rank whose splits are all --max-mib")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    n, me = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(me % torch.cuda.device_count())
    rows = splits(n, args.seed, args.min_mib, args.max_mib, args.capped_rank)
    ins, outs = [int(x) for x in rows[me]], [int(x) for x in rows[:, me]]
    x = torch.ones(sum(ins), ROW // 4, device="cuda")
    y = torch.empty(sum(outs), ROW // 4, device="cuda")
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    dist.all_to_all_single(y, x, outs, ins)
    torch.cuda.synchronize()
    if me == 0:
        print(f"moe_dispatch: {n} ranks, {int(rows.sum()) * ROW} bytes, span {time.perf_counter_ns() - t0} ns")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
