"""torch's context-parallel key/value all-gather (`cplib::flex_cp_allgather`, torchtitan's CP with FlexAttention) and
its backward on the simulated GPU: each rank's (2, 4, 8, 16) key and value shards, gathered along the sequence
(dim 2) and reduced back. Writes to argv[1] rank 0's gathered values' equality with the closed form (real mode) and
the gradients."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank)
real = sys.argv[2] == "real"


def shard(r: int, salt: float) -> torch.Tensor:
    return torch.arange(2 * 4 * 8 * 16, dtype=torch.float32).reshape(2, 4, 8, 16) * (r + 1) + salt


k = shard(rank, 0.0).cuda().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()  # not contiguous
v = shard(rank, 0.5).cuda().requires_grad_()
gk, gv = flex_cp_allgather(k, v, 2, dist.group.WORLD.group_name)
(gk * 2 + gv * 3).sum().backward()
torch.cuda.synchronize()
seen = {"shape": list(gk.shape)}
if real:
    want_k = torch.cat([shard(r, 0.0) for r in range(world)], 2)
    want_v = torch.cat([shard(r, 0.5) for r in range(world)], 2)
    seen["gathered"] = bool(torch.equal(gk.cpu(), want_k) and torch.equal(gv.cpu(), want_v))
    # each rank's shard reaches every rank's output once: its gradient is the world's sum of the constant
    seen["grads"] = [float(k.grad.cpu().unique().item()), float(v.grad.cpu().unique().item())]
if rank == 0:
    json.dump(seen, open(sys.argv[1], "w"))
dist.destroy_process_group()
