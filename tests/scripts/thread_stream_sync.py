"""A thread's stream or event synchronise waits for that stream's work alone (test_thread_collectives.py), 2 ranks.

Each rank alike, no collective: the program times a kernel of K ns and one of B ns (B over twice K), and a thread
runs one kernel on each of two side streams (their lanes begin). Then, from an event s0, a thread launches the long
kernel on its default stream (the compute lane), the short one on a side stream, records an event there, and
synchronises: the device (argv[2] "device"), that stream ("stream") or that event ("event"); then it launches the
short kernel on another side stream, from its host clock, and records an event there. The device's synchronise
waits for the long kernel too, launched before it; the stream's and the event's for the short one alone.
"""

import json
import sys
import threading

import torch
import torch.distributed as dist

out, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(r)
z = torch.ones(2048, 2048, device="cuda")
big = torch.ones(8192, 8192, device="cuda")
side, other = torch.cuda.Stream(), torch.cuda.Stream()
seen: dict = {}


def timed(x: torch.Tensor) -> int:
    """The simulated ns of x @ x, launched on an idle GPU."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    x @ x
    b.record()
    torch.cuda.synchronize()
    return round(a.elapsed_time(b) * 1e6)


def in_thread(target: object) -> None:
    t = threading.Thread(target=target, name=getattr(target, "__name__", "thread"))
    t.start()
    t.join()


def warm() -> None:
    """The side streams' lanes begin (a thread's first kernel on a stream starts after the compute lane's work)."""
    for s in (side, other):
        with torch.cuda.stream(s):
            z @ z


def synchronises() -> None:
    big @ big  # the compute lane
    with torch.cuda.stream(side):
        z @ z
        e = torch.cuda.Event()
        e.record()
    {"device": torch.cuda.synchronize, "stream": side.synchronize, "event": e.synchronize}[mode]()
    with torch.cuda.stream(other):
        z @ z
        b = torch.cuda.Event(enable_timing=True)
        b.record()
    seen["ns"] = round(s0.elapsed_time(b) * 1e6)


seen["K"], seen["B"] = timed(z), timed(big)
in_thread(warm)
torch.cuda.synchronize()
s0 = torch.cuda.Event(enable_timing=True)
s0.record()
in_thread(synchronises)
torch.cuda.synchronize()
with open(f"{out}/rank{r}.json", "w") as f:
    json.dump(seen, f)
