"""Steps of a matmul and a gradient-sized all-reduce; with `--die-at K`, rank 1 kills itself (SIGKILL, no
goodbye) as step K begins, as a machine reboot or the OOM killer would."""

import argparse
import os
import signal

import torch
import torch.distributed as dist

import phantora.runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--die-at", type=int, default=None)
args = parser.parse_args()
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
w = torch.randn(512, 512, device="cuda")
for step in range(args.steps):
    if step == args.die_at and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.randn(64, 512, device="cuda") @ w
    grad = torch.empty(1 << 18, device="cuda")
    dist.all_reduce(grad)
    phantora.runtime.step()
    print(f"step {step} done", flush=True)
dist.destroy_process_group()
