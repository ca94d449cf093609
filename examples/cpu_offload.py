"""A GPT trained with DDP whose optimizer steps fp32 master parameters on the host (a hand-written CPU offload).

    PHANTORA_HOST_COMPUTE=on phantora run --topology testbed16 --nproc 2 examples/cpu_offload.py --offload
    phantora run --topology testbed16 --nproc 2 examples/cpu_offload.py                      # AdamW on the GPU
    torchrun --nproc_per_node 2 examples/cpu_offload.py --offload --device cpu               # the same on gloo

With `--offload`, each step copies the gradients into pinned host buffers (non-blocking, then a stream
synchronise, as ZeRO-Offload does), runs torch's AdamW on the host copies of the parameters, and copies the
updated parameters back to the GPU. Under phantora with PHANTORA_HOST_COMPUTE=on the host's AdamW and the PCIe
copies are charged (docs/runtime.md "Host compute").
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from gpt_model import GPT, batch, common_args, config, corpus, log_step, loss_fn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = common_args(__doc__)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: gloo, for a torchrun check")
    p.add_argument("--offload", action="store_true", help="step fp32 master parameters with AdamW on the host")
    args = p.parse_args()
    cuda = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    model = GPT(config(args)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    params = list(model.parameters())
    if args.offload:
        masters = [q.detach().to("cpu").pin_memory() if cuda else q.detach().clone() for q in params]
        for m in masters:
            m.requires_grad_(True)
            m.grad = torch.zeros_like(m).pin_memory() if cuda else torch.zeros_like(m)
        opt = torch.optim.AdamW(masters, lr=args.lr)
    else:
        opt = torch.optim.AdamW(params, lr=args.lr)
    data = corpus()
    for step in range(args.steps):
        timer = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        if timer is not None:
            timer[0].record()
        x, y = batch(data, args.seq, args.batch, seed=args.seed, step=step, rank=rank, device=device)
        ddp.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if args.offload:
            for m, q in zip(masters, params, strict=True):
                assert m.grad is not None and q.grad is not None
                m.grad.copy_(q.grad, non_blocking=True)  # device to pinned host memory
            if cuda:
                torch.cuda.current_stream().synchronize()  # the host waits for the gradients
            opt.step()  # AdamW on the host
            for m, q in zip(masters, params, strict=True):
                q.data.copy_(m.detach(), non_blocking=True)  # pinned host memory to the device
        else:
            opt.step()
        seconds = 0.0
        if timer is not None:
            timer[1].record()
            torch.cuda.synchronize()
            seconds = timer[0].elapsed_time(timer[1]) / 1e3
        log_step(rank, step, loss.item(), seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
