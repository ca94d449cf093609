"""A thread's synchronise does not wait for work the program launched after it (test_thread_collectives.py), 2 ranks.

Both ranks: from an event k0, the program runs a kernel of K ns and synchronises (its host at K). On rank 0 a thread
started at k0 launches an all-reduce of x on a side stream (its host at L, the launch) and waits for it; while it
waits, the program, its host past the thread's, launches a long kernel (the matrix product below) and writes a file
that rank 1's program waits for (in real time) before its all-reduce of x (launched at K + L), so the thread's wait
ends after that kernel's launch. x ends at K + L + R on both ranks. Then the thread synchronises the device and
all-reduces y on another side stream, launched from its host clock; rank 1's program synchronises (its host at x's
end) and all-reduces y: y ends at K + L + R + L + R. Waiting for the long kernel too, as before, the thread's
all-reduce of y ended after it. argv[2] "phantom": no values.
"""

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

out, phantom = sys.argv[1], sys.argv[2:] == ["phantom"]
dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(r)
x = torch.full((1 << 20,), float(r + 1), device="cuda")
y = torch.full((1 << 20,), float(10 * (r + 1)), device="cuda")
z = torch.ones(2048, 2048, device="cuda")
big = torch.ones(8192, 8192, device="cuda")
side, other = torch.cuda.Stream(), torch.cuda.Stream()
gate = f"{out}/launched"
seen: dict = {}


def background() -> None:
    with torch.cuda.stream(side):
        dist.all_reduce(x, async_op=True).wait()  # its host waits to learn the end, the program runs on
    torch.cuda.synchronize()
    with torch.cuda.stream(other):
        dist.all_reduce(y)
        b = torch.cuda.Event(enable_timing=True)
        b.record()
    seen["ns"] = round(k0.elapsed_time(b) * 1e6)


torch.cuda.synchronize()
k0, k1, k2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
k0.record()
if r == 0:
    t = threading.Thread(target=background, name="waits, then synchronises")
    t.start()
z @ z  # K ns; then the program's host moves past the thread's (which launches x and waits meanwhile)
torch.cuda.synchronize()
k1.record()
seen["K"] = round(k0.elapsed_time(k1) * 1e6)
if r == 0:
    big @ big  # launched after the thread's host time: its synchronise does not wait for it
    k2.record()
    seen["long"] = round(k0.elapsed_time(k2) * 1e6)
    open(gate, "w").close()
    t.join()
else:
    while not os.path.exists(gate):  # real time: rank 0's long kernel is launched first
        time.sleep(0.01)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.all_reduce(y)
    b = torch.cuda.Event(enable_timing=True)
    b.record()
    seen["ns"] = round(k0.elapsed_time(b) * 1e6)
torch.cuda.synchronize()
if not phantom:
    seen["values"] = [x[0].item(), y[0].item()]
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(seen, f)
