"""DDP of a model on the simulated GPU over `init_process_group("gloo")`, as torch's DDP tutorial runs it.

Each rank trains on its own batch (seeded by its rank); after backward, DDP's gradients must be the mean over the
ranks of each batch's own gradient, which every rank recomputes without DDP. Rank 0 writes to argv[1] the largest
difference and the group's backend name.
"""

import copy
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)).to(rank)
plain = copy.deepcopy(model)


def batch(r: int) -> torch.Tensor:
    return torch.randn(20, 10, generator=torch.Generator().manual_seed(r)).to(rank)


ddp = DDP(model, device_ids=[rank])
ddp(batch(rank)).square().sum().backward()
for r in range(world):
    plain(batch(r)).square().sum().backward()
pairs = zip(model.parameters(), plain.parameters(), strict=True)
diff = max(float((p.grad - q.grad / world).abs().max()) for p, q in pairs)
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"max_diff": diff, "backend": dist.get_backend()}, f)
dist.destroy_process_group()
