"""A program that starts its own ranks, as pytorch/examples' ddp-tutorial-series/multigpu.py does: the parent asks
torch.cuda how many GPUs its host has and `mp.spawn`s one process per GPU; each process sets its device, joins the
NCCL group on its own fixed localhost port and all-reduces a cuda tensor of N fp32 values (argv[1]) holding rank + 1.

Words after N: "fail=R" (after a barrier of every rank, rank R raises before the all-reduce, so the others wait in
it), "nprocs=K" (spawn K processes whatever the GPU count), "no-spawn" (the parent never starts ranks), "process" (one
`multiprocessing.get_context("spawn").Process` per rank instead of mp.spawn, joined by the parent), "hold=S" (each
rank waits S real seconds after the all-reduce).
"""

import multiprocessing
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(rank: int, world: int, n: int, fail: int, hold: float = 0.0) -> None:
    print(f"rank {rank} pid {os.getpid()}", flush=True)
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"  # fixed, as the tutorial's: phantora serves it on the run's own port
    torch.cuda.set_device(rank)
    dist.init_process_group(backend="nccl", rank=rank, world_size=world)
    if fail >= 0:
        dist.barrier()  # every rank started (and said its pid) before rank `fail` gives up
    if rank == fail:
        raise ValueError(f"rank {rank} gives up")
    x = torch.full((n,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"rank {rank} on cuda:{torch.cuda.current_device()} of {torch.cuda.device_count()}: sum {x[0].item():g}")
    time.sleep(hold)  # real time (time.sleep is not simulated)
    dist.destroy_process_group()


if __name__ == "__main__":
    words = dict(w.partition("=")[::2] for w in sys.argv[2:])
    world = torch.cuda.device_count()
    print(f"parent pid {os.getpid()} sees {world} GPUs, available {torch.cuda.is_available()}", flush=True)
    args = (world, int(sys.argv[1]), int(words.get("fail", -1)), float(words.get("hold", 0)))
    if "process" in words:
        procs = [multiprocessing.get_context("spawn").Process(target=main, args=(r, *args)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print("parent: every rank finished")
    elif "no-spawn" not in words:
        mp.spawn(main, args=args, nprocs=int(words.get("nprocs", world)))
        print("parent: every rank finished")
