"""A CUDA + NCCL program that uses torch.distributed's NCCL names (tests/test_nccl_surface.py).

It builds `ProcessGroupNCCL.Options` (a high-priority stream, a CTA limit) for the default group and a subgroup,
checks `dist.is_nccl_available()`, and trains one step of DDP with `bf16_compress_hook`, which DDP refuses unless
NCCL is available. Rank r's gradient is (r + 1) * V; it writes the averaged gradient and what it saw to
`argv[1]/rank{r}.json`.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

V = [1.0, 1.0 / 3.0, 0.1, 1e-3]
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
opts = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
opts.config.max_ctas = 4
dist.init_process_group("nccl", pg_options=opts)
rank, world = dist.get_rank(), dist.get_world_size()
sub = dist.new_group(list(range(world)), pg_options=dist.ProcessGroupNCCL.Options())
ones = torch.ones(4, device="cuda")
dist.all_reduce(ones, group=sub)

model = torch.nn.Linear(4, 1, bias=False).cuda()
with torch.no_grad():
    model.weight.fill_(1.0)
ddp = DDP(model, device_ids=[local])
ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
x = torch.tensor([V], device="cuda") * (rank + 1)
ddp(x).sum().backward()
torch.cuda.synchronize()
seen = {
    "nccl_available": dist.is_nccl_available(),
    "options_type": isinstance(opts, dist.ProcessGroupNCCL.Options),
    "subgroup_sum": ones.tolist(),
    "grad": model.weight.grad.flatten().tolist(),
}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
