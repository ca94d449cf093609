"""The program joins a thread that all-reduced on a side stream and waited (its wait told the coordinator a time past
the program's compute lane), then receives from any source on a gloo group (test_thread_collectives.py)."""

import json
import sys
import threading

import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(r)
x = torch.ones(1 << 20, device="cuda")
side = torch.cuda.Stream()
gloo = dist.new_group(backend="gloo")


def background() -> None:
    with torch.cuda.stream(side):
        dist.all_reduce(x)


t = threading.Thread(target=background)
t.start()
t.join()
got = torch.zeros(4)
seen: dict = {}
if r == 0:
    seen["src"] = dist.recv(got, group=gloo)  # from any source
    seen["got"] = got.tolist()
else:
    dist.send(torch.full((4,), 7.0), 0, group=gloo)
torch.cuda.synchronize()
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(seen, f)
