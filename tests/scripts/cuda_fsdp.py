"""FSDP2 written for CUDA + NCCL: meta-device init, to_empty("cuda"), a cuda DeviceMesh. `--device cpu`: gloo."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
if dev == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if dev == "cuda" else "gloo")
mesh = init_device_mesh(dev, (dist.get_world_size(),))
with torch.device("meta"):
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
model.to_empty(device=dev)
torch.manual_seed(0)
with torch.no_grad():
    for p in model.parameters():
        full = torch.randn(p.shape) * 0.1  # the same full weights on every rank and device, then this rank's shard
        p.copy_(torch.distributed.tensor.distribute_tensor(full.to(dev), mesh, p.placements))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(3):
    g = torch.Generator().manual_seed(100 + step * 10 + dist.get_rank())
    x = torch.randn(4, 64, generator=g).to(dev)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step} loss {loss.item():.6f} on {next(model.parameters()).device.type}", flush=True)
dist.destroy_process_group()
