"""A batch whose pairs a window-mode run launches in different rounds (docs/egraph.md "Window-mode recordings"): rank
0 joins a small transfer's end, then receives 8 MiB from rank 2; rank 2 computes past that end and sends 8 MiB to
ranks 3 and 0 in one batch. In 20 us windows rank 2 issues in the round before the one rank 0 runs on in, so live the
pair to 3 is launched alone and the pair to 0 knows it. Recorded and replayed:

    .venv/bin/python bench/bench_p2p_replay.py --window 20000 --topology testbed16 --nproc 4 bench/p2p_window.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
me = dist.get_rank()
torch.cuda.set_device(me % torch.cuda.device_count())
MiB = 1 << 18  # fp32 elements
x, y = torch.ones(8 * MiB, device="cuda"), torch.empty(8 * MiB, device="cuda")
s, r = torch.ones(256, device="cuda"), torch.empty(256, device="cuda")
# rank 2's product: it issues at 55.9 us on 8 H100s in 20 us windows, after rank 0 joined its small transfer (47.3 us)
# and issued its receive (52.3 us), before the 60 us round (512 rows issued at 45.8 us once 5c76ccbb timed the
# product by its own output)
a = torch.ones(720, 1024, device="cuda")


def batch(ops: list[dist.P2POp]) -> None:
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    torch.cuda.synchronize()


dist.barrier()
torch.cuda.synchronize()
if me == 0:  # a small transfer first: rank 0 joins its end, then receives from rank 2
    batch([dist.P2POp(dist.isend, s, 1)])
    batch([dist.P2POp(dist.irecv, y, 2)])
elif me == 1:
    batch([dist.P2POp(dist.irecv, r, 0)])
elif me == 2:  # computes past that end, then sends to ranks 3 and 0 in one batch
    a @ a.T
    batch([dist.P2POp(dist.isend, x, 3), dist.P2POp(dist.isend, x, 0)])
elif me == 3:
    batch([dist.P2POp(dist.irecv, y, 2)])
dist.destroy_process_group()
