"""A thread the program starts runs a kernel on a side stream, then sends 1 MiB from rank 0 to rank 1 there (rank 1's
thread receives it), waits, and times it with its own events (test_thread_collectives.py); then gloo sends the same
values (argv[2] "phantom": no values).
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
x = torch.full((1 << 18,), float(r + 1), device="cuda")
box = torch.zeros(1 << 18, device="cuda")
z = torch.ones(2048, 2048, device="cuda")
side = torch.cuda.Stream()
seen: dict = {}


def background() -> None:
    with torch.cuda.stream(side):
        a, k, b = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        a.record()
        z @ z  # the side stream is busy: NCCL's call starts after it there
        k.record()
        work = dist.isend(x, 1) if r == 0 else dist.irecv(box, 0)
        work.wait()
        b.record()
    seen["K"] = round(a.elapsed_time(k) * 1e6)
    seen["ns"] = round(a.elapsed_time(b) * 1e6)


torch.cuda.synchronize()
t = threading.Thread(target=background, name="p2p")
t.start()
t.join()
torch.cuda.synchronize()
if not phantom:  # real mode: the values gloo gives
    gloo = dist.new_group(backend="gloo")
    host = x.cpu() if r == 0 else torch.zeros(1 << 18)
    dist.send(host, 1, group=gloo) if r == 0 else dist.recv(host, 0, group=gloo)
    seen["equal"] = r == 0 or torch.equal(box.cpu(), host)
    seen["value"] = box[0].item()
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(seen, f)
