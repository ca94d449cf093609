"""Tensor parallelism written for CUDA + NCCL: DTensor's Colwise/Rowwise plan on a cuda DeviceMesh, whose
collectives are the functional ones (their outputs must stay on the GPU for autograd). `cpu`: gloo."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
if dev == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if dev == "cuda" else "gloo")
mesh = init_device_mesh(dev, (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).to(dev)
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(100 + step)).to(dev)  # the same on every rank
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step} loss {loss.item():.6f} on {out.device.type}", flush=True)
dist.destroy_process_group()
