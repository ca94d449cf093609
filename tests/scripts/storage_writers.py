"""Checkpoint files written by one rank, then by every rank at once, each in a step of its own.

Step 1: rank 0 alone torch.saves argv[1]/rank0.pt (as a DDP program saves its model); step 2: every rank saves
argv[1]/all<rank>.pt, the same bytes, after a barrier (they start together). A 2**20-float tensor, real mode.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
w = torch.nn.Parameter(torch.zeros(2**20, device="cuda"))
opt = torch.optim.SGD([w], lr=0.1)


def train() -> None:
    w.square().sum().backward()
    opt.step()
    opt.zero_grad()


train()
if rank == 0:
    torch.save({"w": w.detach()}, out / "rank0.pt")
dist.barrier()
train()
dist.barrier()
torch.save({"w": w.detach()}, out / f"all{rank}.pt")
dist.barrier()
train()
dist.destroy_process_group()
