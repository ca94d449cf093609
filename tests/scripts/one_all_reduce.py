"""One all-reduce of `argv[1]` bytes (fp32) over every rank, as a CUDA + NCCL script (tests/test_run_granularity.py)."""

import sys

import torch
import torch.distributed as dist

import phantora.runtime as pr

dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
x = torch.empty(int(sys.argv[1]) // 4, dtype=torch.float32, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
pr.step()
