"""Train a small GPT with FSDP2 (`fully_shard`): parameters sharded, all-gathered per block.

phantora run --topology testbed16 --nproc 4 examples/gpt_fsdp.py --steps 5
torchrun --nproc_per_node 4 examples/gpt_fsdp.py --steps 5     # the same script on gloo
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from gpt_model import GPT, batch, common_args, config, corpus, flops_per_token, log_step, loss_fn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import phantora.runtime as pr


def main() -> None:
    args = common_args(__doc__).parse_args()
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(args.seed)
    model = GPT(config(args))
    flops = flops_per_token(model)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = corpus()
    device = next(model.parameters()).device  # "meta" under phantom mode
    tokens = args.batch * args.seq * world
    pr.report_workload(tokens_per_step=tokens, flops_per_step=flops * tokens)
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = batch(data, args.seq, args.batch, seed=args.seed, step=step, rank=rank, device=device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        pr.step()
        log_step(rank, step, loss.item(), time.perf_counter() - t0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
