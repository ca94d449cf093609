"""A program that starts its own ranks (`phantora run --spawn`) with mp.start_processes(start_method=argv[1]), seeding
nothing: the launching process draws once from torch's CPU generator, then each rank prints one JSON line of its torch
and `random` draws."""

import json
import os
import random
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12356"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    draws = {"rank": rank, "torch": torch.randint(0, 2**62, (2,)).tolist(), "random": random.random()}
    dist.all_reduce(torch.ones(4, device="cuda"))
    print(json.dumps(draws), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    print(json.dumps({"launcher": torch.randint(0, 2**62, (1,)).tolist()}), flush=True)
    mp.start_processes(rank_main, args=(2,), nprocs=2, start_method=sys.argv[1])
