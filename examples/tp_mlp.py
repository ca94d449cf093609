"""Tensor-parallel MLP with DTensor: column-parallel up-projection, row-parallel down-projection.

    phantora run --topology testbed16 --nproc 4 examples/tp_mlp.py --steps 5
    torchrun --nproc_per_node 4 examples/tp_mlp.py --steps 5        # the same script on gloo

Each layer's forward ends in an all-reduce of the activations (RowwiseParallel), its backward in
an all-reduce of the input gradients (ColwiseParallel): the functional-collective path.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import phantora.runtime as pr


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--tokens", type=int, default=256, help="tokens per step (the whole TP group shares them)")
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    dist.init_process_group()
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = nn.Sequential(*(MLP(args.d_model, args.hidden) for _ in range(args.layers)))
    n_params = sum(q.numel() for q in model.parameters())
    plan = {f"{i}.up": ColwiseParallel() for i in range(args.layers)}
    plan.update({f"{i}.down": RowwiseParallel() for i in range(args.layers)})
    parallelize_module(model, mesh, plan)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    pr.report_workload(tokens_per_step=args.tokens, flops_per_step=6.0 * n_params * args.tokens)
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randn(args.tokens, args.d_model, generator=g)
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        pr.step()
        if dist.get_rank() == 0:
            print(f"step {step:3d}  loss {loss.item():.5f}  time {(time.perf_counter() - t0) * 1e3:.3f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
