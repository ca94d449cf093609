"""A thread the program starts waits on the device (test_thread_collectives.py), on 2 ranks, symmetric:
on a side stream a kernel, then an all-reduce of x, which argv[2] "sync" does not wait for but synchronises the
device after (`torch.cuda.synchronize()`) and "timeout" waits for with a timeout; then an all-reduce of y on a
second side stream. Times from the thread's first event (on the side
stream); argv[3] "phantom": no values.
"""

import datetime
import json
import sys
import threading

import torch
import torch.distributed as dist

out, mode, phantom = sys.argv[1], sys.argv[2], sys.argv[3:] == ["phantom"]
dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(r)
x = torch.full((1 << 20,), float(r + 1), device="cuda")
y = torch.full((1 << 20,), float(10 * (r + 1)), device="cuda")
z = torch.ones(2048, 2048, device="cuda")
side, other = torch.cuda.Stream(), torch.cuda.Stream()
seen: dict = {}


def background() -> None:
    a, k, w, b = (torch.cuda.Event(enable_timing=True) for _ in range(4))
    with torch.cuda.stream(side):
        a.record()
        z @ z  # the side stream busy for K ns
        k.record()
        work = dist.all_reduce(x, async_op=True)
        if mode == "sync":
            torch.cuda.synchronize()  # the thread's host waits for the device: the kernel and the all-reduce
        else:
            work.wait(timeout=datetime.timedelta(seconds=120))  # the side stream and the host wait for it
            w.record()
    with torch.cuda.stream(other):
        dist.all_reduce(y)
        b.record()
    work.wait()
    seen["K"] = round(a.elapsed_time(k) * 1e6)
    seen["wait"] = round(a.elapsed_time(w) * 1e6) if mode == "timeout" else 0
    seen["ns"] = round(a.elapsed_time(b) * 1e6)


torch.cuda.synchronize()
t = threading.Thread(target=background, name="waits")
t.start()
t.join()
torch.cuda.synchronize()
if not phantom:
    seen["values"] = [x[0].item(), y[0].item()]
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(seen, f)
