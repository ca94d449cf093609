"""A thread the program starts all-reduces 4 MiB on the default group (nccl), on the stream given by argv[2]
("default" or "side"), timed by its own events; then gloo all-reduces the same values (test_thread_collectives.py;
argv[3] "phantom": no values).
With argv[2] "crossed", rank 0's thread all-reduces while rank 1's own thread broadcasts: the contract broken."""

import json
import sys
import threading

import torch
import torch.distributed as dist

out, where, phantom = sys.argv[1], sys.argv[2], sys.argv[3:] == ["phantom"]
dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(r)
x = torch.full((1 << 20,), float(r + 1), device="cuda")
host = None if phantom else x.cpu()
side = torch.cuda.Stream() if where == "side" else None
seen: dict = {}
go = threading.Event()


def background() -> None:
    if where == "crossed" and r == 1:
        go.wait()
        return
    with torch.cuda.stream(side):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dist.all_reduce(x)
        b.record()
    seen["ns"] = round(a.elapsed_time(b) * 1e6)


torch.cuda.synchronize()
t = threading.Thread(target=background, name="background all-reduce")
t.start()
if where == "crossed" and r == 1:
    dist.broadcast(x, 0)
    go.set()
t.join()
torch.cuda.synchronize()
if host is not None:  # real mode: the values gloo gives
    gloo = dist.new_group(backend="gloo")
    dist.all_reduce(host, group=gloo)
    seen["equal"] = torch.equal(x.cpu(), host)
    seen["value"] = x[0].item()
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(seen, f)
