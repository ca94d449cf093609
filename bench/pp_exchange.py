"""A pipeline stage's exchange: each of n ranks sends 64 MiB to the next stage and receives from the previous one
in one batch_isend_irecv (the 1F1B steady state's send-forward/recv-forward pair), timed with CUDA events. Its
stages are one host's GPUs, so the pairs run on the n-rank group's p2p channels (docs/collectives.md):

    .venv/bin/phantora run --topology testbed16 --tensors phantom --nproc 4 --trace none bench/pp_exchange.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
r, n = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(r % torch.cuda.device_count())
x = torch.empty(16 << 20, dtype=torch.float32, device="cuda")
y = torch.empty_like(x)
for it in range(3):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    ops = [dist.P2POp(dist.isend, x, (r + 1) % n), dist.P2POp(dist.irecv, y, (r - 1) % n)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    e.record()
    e.synchronize()
    if r == 0:
        print(f"iter {it} exchange {s.elapsed_time(e) * 1000:.1f} us", flush=True)
dist.destroy_process_group()
