"""Two NCCL groups over ranks 0 and 1, crossed between a thread and the program (test_thread_collectives.py).

Rank 0's thread all-reduces x on group G1 (A) and waits while rank 0's program all-reduces y on group G2 (B); rank 1's
program all-reduces y on G2 and synchronises before its thread all-reduces x on G1. Each all-reduce's end is an
event on its own thread's stream (the threads' on a side stream), timed from an event before both; then gloo
all-reduces the same values (argv[2] "phantom": no values).
"""

import json
import sys
import threading

import torch
import torch.distributed as dist

out, phantom = sys.argv[1], sys.argv[2:] == ["phantom"]
dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(r)
g1, g2 = dist.new_group([0, 1]), dist.new_group([0, 1])
x = torch.full((1 << 20,), float(r + 1), device="cuda")
y = torch.full((1 << 20,), float(10 * (r + 1)), device="cuda")
hosts = None if phantom else (x.cpu(), y.cpu())
side = torch.cuda.Stream()
seen: dict = {}
go = threading.Event()


def timed(key: str, tensor: torch.Tensor, group: object) -> None:
    """All-reduce `tensor` on `group` and wait; its end on the calling thread's stream, from `k0`."""
    dist.all_reduce(tensor, group=group)
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    seen[key] = round(k0.elapsed_time(end) * 1e6)


def background() -> None:
    if r == 1:
        go.wait()  # after its program's B
    with torch.cuda.stream(side):
        timed("A", x, g1)


torch.cuda.synchronize()
k0, k1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
k0.record()
t = threading.Thread(target=background, name="A on G1")
t.start()
z = torch.ones(2048, 2048, device="cuda")
z @ z  # a kernel, then a synchronise: the program's host time past rank 0's thread's, which issues A and waits
torch.cuda.synchronize()
k1.record()
seen["K"] = round(k0.elapsed_time(k1) * 1e6)
timed("B", y, g2)
if r == 1:
    torch.cuda.synchronize()
    go.set()
t.join()
torch.cuda.synchronize()
if hosts is not None:  # real mode: the values gloo gives
    gloo = dist.new_group(backend="gloo")
    for h in hosts:
        dist.all_reduce(h, group=gloo)
    seen["equal"] = [torch.equal(x.cpu(), hosts[0]), torch.equal(y.cpu(), hosts[1])]
    seen["values"] = [x[0].item(), y[0].item()]
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(seen, f)
