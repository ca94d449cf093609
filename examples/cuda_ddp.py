"""A GPT trained with DDP, written for CUDA + NCCL as a GPU cluster runs it: no phantora API.

    phantora run --topology testbed16 --nproc 4 examples/cuda_ddp.py --steps 5      # simulated H100s
    torchrun --nproc_per_node 4 examples/cuda_ddp.py --steps 5 --device cpu         # the same on gloo

It sets the device from LOCAL_RANK, moves the model and batches with ``.cuda()``/``.to(device)``,
times steps with CUDA events and logs ``torch.cuda.max_memory_allocated()``, as real training
scripts do. Under phantora these are simulated figures.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from gpt_model import GPT, batch, common_args, config, corpus, loss_fn, save_state
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = common_args(__doc__)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: gloo, for a torchrun check")
    args = p.parse_args()
    cuda = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    model = GPT(config(args)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    data = corpus()
    if rank == 0 and cuda:
        print(f"training on {world} x {torch.cuda.get_device_name()} ({torch.cuda.device_count()} per host)")
    for step in range(args.steps):
        start, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (0, 0)
        if cuda:
            start.record()
        x, y = batch(data, args.seq, args.batch, seed=args.seed, step=step, rank=rank, device=device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if args.save and step == args.steps - 1:
            grads = {f"grad/{n}": q.grad for n, q in model.named_parameters()}
        opt.step()
        if cuda:
            end.record()
            torch.cuda.synchronize()
        ms = start.elapsed_time(end) if cuda else 0.0
        mem = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
        if rank == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}  time {ms:.3f} ms  max memory {mem:.1f} MiB", flush=True)
    if args.save:
        save_state(args.save, rank, {**grads, **{f"param/{n}": q.cpu() for n, q in model.named_parameters()}})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
