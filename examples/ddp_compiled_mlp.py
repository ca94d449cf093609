"""DDP of a compiled MLP, written for CUDA + NCCL as a user would write it: no phantora API.

    phantora run --topology testbed16 --nproc 4 examples/ddp_compiled_mlp.py

A 1024 -> 8192 -> 1024 MLP (GELU) in `torch.compile`, wrapped in DDP, bf16 autocast, fused AdamW, an MSE loss on
a fixed random batch of 1,024 rows; each step timed with CUDA events, rank 0 printing its loss and time and at the
end the mean of steps 1-5. A reconstruction of the user-trial script of docs/runtime.md ("User trials"), which was
not kept: its description and its gradient bucket of 33,558,528 B (a 1024 x 8192 weight and a 1024 bias).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, HIDDEN, BATCH, STEPS = 1024, 8192, 1024, 6


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)).cuda()
    model = DDP(torch.compile(mlp), device_ids=[torch.cuda.current_device()])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(BATCH, WIDTH, device="cuda")
    y = torch.randn(BATCH, WIDTH, device="cuda")
    times = []
    for step in range(STEPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} {times[-1]:.3f} ms", file=sys.stderr)
    if rank == 0:
        print(f"event timer, steps 1-{STEPS - 1}: {sum(times[1:]) / (STEPS - 1):.3f} ms", file=sys.stderr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
