"""Probe: small integer tensors through collectives between 2 phantom ranks (tests/test_tensor_values.py).

Each rank writes what it holds after each collective to `<out>/values<rank>.json`. The values differ by rank, so a
rank that kept its own would be seen. Then each collective is repeated on a phantom float tensor of the same bytes
(no values travel), for the trace to compare their times.
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor import _random as dtensor_random

out = sys.argv[1]
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
seen: dict = {}

torch.cuda.manual_seed(100 + rank)  # each rank's own generator state
state = torch.cuda.get_rng_state().to("cuda")
dist.broadcast(state, 0)
seen["broadcast"] = state.tolist()

sent = torch.tensor([3, 1, 4, 1, 5], device="cuda") * (rank + 1)
got = torch.zeros(5, dtype=torch.int64, device="cuda")  # phantom until it receives
if rank == 0:
    dist.send(sent, 1)
else:
    dist.recv(got, 0)
    seen["recv"] = got.tolist()

count = torch.tensor([rank + 1, 10 * (rank + 1)], device="cuda")
dist.all_reduce(count, op=dist.ReduceOp.MAX)
seen["all_reduce_max"] = count.tolist()
gathered = torch.empty(4, dtype=torch.int32, device="cuda")
dist.all_gather_into_tensor(gathered, torch.tensor([rank, 7 * rank], dtype=torch.int32, device="cuda"))
seen["all_gather"] = gathered.tolist()
# an all-to-all of token counts, as an MoE token dispatcher exchanges them: rank r's row j goes to rank j
counts = torch.tensor([[100 * rank + 10 * j, 100 * rank + 10 * j + 1] for j in range(2)], device="cuda")
exchanged = funcol.all_to_all_single(counts, None, None, group=dist.group.WORLD)  # torchtitan's call
seen["all_to_all_functional"] = funcol.wait_tensor(exchanged).tolist()
into = torch.empty(2, 2, dtype=torch.int64, device="cuda")  # phantom until it receives
dist.all_to_all_single(into, counts)
seen["all_to_all_single"] = into.tolist()

# DTensor's RNG tracker: made on the first random op of a DTensor, it broadcasts rank 0's state and adopts it
torch.cuda.manual_seed(7 + rank)
mesh = init_device_mesh("cuda", (2,))
weight = distribute_tensor(torch.empty(8, 4, device="cuda"), mesh, [Shard(0)])
with torch.no_grad():
    weight.normal_()
seen["dtensor_tracker"] = dtensor_random._rng_tracker is not None
seen["seed_after_tracker"] = torch.cuda.initial_seed()

# the same collectives on phantom floats of the same bytes, for their times
dist.broadcast(torch.empty(4, device="cuda"), 0)
if rank == 0:
    dist.send(torch.empty(10, device="cuda"), 1)
else:
    dist.recv(torch.empty(10, device="cuda"), 0)
torch.cuda.synchronize()
with open(f"{out}/values{rank}.json", "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
