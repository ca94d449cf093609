"""Train a small GPT with DistributedDataParallel.

    phantora run --topology testbed16 --nproc 4 examples/gpt_ddp.py --steps 5
    torchrun --nproc_per_node 4 examples/gpt_ddp.py --steps 5      # the same script on gloo

Under phantora, time.perf_counter is simulated, so the printed step times are simulated times.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from gpt_model import GPT, batch, common_args, config, corpus, flops_per_token, log_step, loss_fn, save_state
from torch.nn.parallel import DistributedDataParallel as DDP

import phantora.runtime as pr


def main() -> None:
    p = common_args(__doc__)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size (MB)")
    args = p.parse_args()
    dist.init_process_group()  # "phantora" under phantora run, gloo under torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = GPT(config(args))
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    data = corpus()
    device = next(model.parameters()).device  # "meta" under phantom mode
    tokens = args.batch * args.seq * world
    pr.report_workload(tokens_per_step=tokens, flops_per_step=flops_per_token(model) * tokens)
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = batch(data, args.seq, args.batch, seed=args.seed, step=step, rank=rank, device=device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if args.save and step == args.steps - 1:
            grads = {f"grad/{n}": q.grad for n, q in model.named_parameters()}
        opt.step()
        pr.step()
        log_step(rank, step, loss.item(), time.perf_counter() - t0)
    if args.save:
        save_state(args.save, rank, {**grads, **{f"param/{n}": q for n, q in model.named_parameters()}})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
