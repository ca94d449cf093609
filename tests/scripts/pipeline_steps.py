"""A CUDA program whose iterations are a pipeline schedule's `step()`, with or without an optimizer step after it.

usage: pipeline_steps.py OUT MODE [ITERATIONS]; MODE is `schedule` (2 pipeline stages, GPipe, no optimizer),
`optimizer` (the same, then an optimizer step each iteration) or `explicit` (the schedule, then
`phantora.runtime.step()`). Rank 0 writes OUT: its simulated clock (time.perf_counter_ns, device synchronised)
at the end of each iteration.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import phantora.runtime

out, mode = sys.argv[1], sys.argv[2]
iterations = int(sys.argv[3]) if len(sys.argv) > 3 else 3
rank = int(os.environ["RANK"])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl")
torch.manual_seed(0)
stage_module = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).to(device)
x = torch.randn(32, 512, device=device)
target = torch.randn(32, 512, device=device)
stage = PipelineStage(stage_module, rank, dist.get_world_size(), device)
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
opt = torch.optim.SGD(stage_module.parameters(), lr=0.01) if mode == "optimizer" else None
ends: list[int] = []
for _ in range(iterations):
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=target)
    if opt is not None:
        opt.step()
    if mode == "explicit":
        phantora.runtime.step()
    torch.cuda.synchronize()
    ends.append(time.perf_counter_ns())
if rank == 0:
    with open(out, "w") as f:
        json.dump(ends, f)
dist.destroy_process_group()
