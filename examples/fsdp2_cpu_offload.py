"""FSDP2 with torch's own CPU offload: sharded parameters, gradients and AdamW's step on the host.

    PHANTORA_HOST_COMPUTE=on phantora run --topology testbed16 --nproc 2 examples/fsdp2_cpu_offload.py --offload
    phantora run --topology testbed16 --nproc 2 examples/fsdp2_cpu_offload.py                 # sharded on the GPU

Eight `Linear(1024, 1024)` layers, each `fully_shard`-ed (with `CPUOffloadPolicy()` under `--offload`), trained 4
steps on one random batch of 16. Under phantora with PHANTORA_HOST_COMPUTE=on the host's AdamW and the copies over
PCIe are charged (docs/runtime.md "Host compute").
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--offload", action="store_true", help="FSDP2's CPUOffloadPolicy")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]).cuda()
    policy = CPUOffloadPolicy() if args.offload else OffloadPolicy()  # OffloadPolicy(): fully_shard's default, none
    for layer in model:
        fully_shard(layer, offload_policy=policy)
    fully_shard(model, offload_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, args.width, device="cuda")
    for step in range(args.steps):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        if dist.get_rank() == 0:
            print(f"step {step}  loss {loss.item():.5f}  parameters on {next(model.parameters()).device}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
