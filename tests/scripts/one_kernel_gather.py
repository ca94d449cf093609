"""An op that runs as one simulated kernel (simcuda/cuda_only.py `one_kernel`: torch's fused RMSNorm here) reading an
all-gather's output on a side stream: each rank fills its shard of N fp32 values with (rank + 1) (-1)^i, all-gathers
it asynchronously behind a 64 MiB all-reduce on that stream (so the gather ends late), waits on the stream, and
normalises each rank's row with `F.rms_norm`. Each row has mean square (k + 1)^2, so each value is (-1)^i (k + 1) /
sqrt((k + 1)^2 + eps), within 1e-7 of +-1; a row read before the gather wrote it is zeros. Rank 0 writes to argv[1]
the largest difference from +-1 over every row.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

N = 4096
rank = int(os.environ["RANK"])
dist.init_process_group("nccl")
world = dist.get_world_size()
torch.cuda.set_device(rank)
signs = torch.tensor([1.0, -1.0]).repeat(N // 2)
shard = ((rank + 1) * signs).cuda()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    dist.all_reduce(torch.ones(1 << 24, device="cuda"))  # a collective the stream's next one follows (64 MiB)
    gathered = torch.empty(world, N, device="cuda")
    work = dist.all_gather_into_tensor(gathered, shard, async_op=True)
    work.wait()
    normed = F.rms_norm(gathered, (N,))
diff = float((normed.cpu() - signs.expand(world, N)).abs().max())
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"max_diff": diff}, f)
dist.destroy_process_group()
