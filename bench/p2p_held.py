"""A fan-out batch whose receive on one rank waits on its NCCL stream behind a long transfer that rank issued just
before and has not waited for (docs/egraph.md "NCCL groups of transfers"): rank 0 sends 64 MiB to rank 1 in one
batch, then rank 2 sends 8 MiB to ranks 0, 3 and 4 in another, on the world's communicator. Recorded and replayed:

    .venv/bin/python bench/bench_p2p_replay.py --topology testbed16 --nproc 8 bench/p2p_held.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
n, me = dist.get_world_size(), dist.get_rank()
dev = me % torch.cuda.device_count()
torch.cuda.set_device(dev)
MiB = 1 << 18  # fp32 elements
x, y = torch.ones(8 * MiB, device="cuda"), torch.empty(8 * MiB, device="cuda")
big = torch.ones(64 * MiB, device="cuda")
dist.barrier()
torch.cuda.synchronize()
first = []  # a long transfer 0 -> 1 on the world's NCCL stream, not waited for yet
if me == 0:
    first = dist.batch_isend_irecv([dist.P2POp(dist.isend, big, 1)])
elif me == 1:
    first = dist.batch_isend_irecv([dist.P2POp(dist.irecv, big, 0)])
if me == 2:  # a fan-out whose receive on rank 0 is held behind that transfer on rank 0's stream
    ops = [dist.P2POp(dist.isend, x, p) for p in (0, 3, 4)]
elif me in (0, 3, 4):
    ops = [dist.P2POp(dist.irecv, y, 2)]
else:
    ops = []
for q in first + (dist.batch_isend_irecv(ops) if ops else []):
    q.wait()
torch.cuda.synchronize()
dist.destroy_process_group()
