"""Probe when the simulated GPU's memory is taken and given back, as a CUDA program sees it.

With Python's cycle collector off (as torchtitan runs), memory a program drops must come back at once;
shape propagation under FakeTensorMode (DTensor's, the compiler's) must take none; torch.compile'd code
runs. Rank 0 writes what it saw as JSON (argv[1]).
"""

import gc
import json
import sys

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

gc.disable()
out: dict = {}
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
world = dist.get_world_size()
n = 1 << 20  # floats per rank

base = torch.cuda.memory_allocated()
x = torch.ones(n, device="cuda")
out["one_tensor"] = torch.cuda.memory_allocated() - base

# An all-gather's output, dropped by the program, is free again without a garbage collection.
gathered = torch.empty(world * n, device="cuda")
dist.all_gather_into_tensor(gathered, x)
out["gathered_sum"] = float(gathered.sum()) if not gathered.is_meta else None
with_output = torch.cuda.memory_allocated() - base
del gathered
out["all_gather_output"] = with_output - (torch.cuda.memory_allocated() - base)
work = dist.all_reduce(x, async_op=True)
work.wait()
del work
out["after_async_all_reduce"] = torch.cuda.memory_allocated() - base

# Shape propagation takes no device memory.
before = torch.cuda.memory_allocated()
with FakeTensorMode():
    fake = torch.empty(1 << 28, device="cuda")
    out["fake_device"] = str(fake.device)
out["fake_bytes"] = torch.cuda.memory_allocated() - before


# FSDP2 gives an unsharded parameter's memory back after the forward (reshard_after_forward).
from torch.distributed.fsdp import fully_shard  # noqa: E402

# A model built on the meta device, as torchtitan builds it, takes no memory until `to_empty` places its shards.
before = torch.cuda.memory_allocated()
with torch.device("meta"):
    meta_model = torch.nn.Linear(4096, 4096, bias=False)
out["meta_model_bytes"] = torch.cuda.memory_allocated() - before
fully_shard(meta_model)
meta_model.to_empty(device="cuda")
out["placed_shard_bytes"] = torch.cuda.memory_allocated() - before
del meta_model

model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False, device="cuda") for _ in range(2)])
for layer in model:
    fully_shard(layer)
fully_shard(model)
inp = torch.ones(8, 1024, device="cuda")
before = torch.cuda.memory_allocated()
with torch.no_grad():
    y = model(inp)
out["fsdp_forward_kept"] = torch.cuda.memory_allocated() - before
out["fsdp_output_bytes"] = y.numel() * y.element_size()


@torch.compile
def double_plus_one(t: torch.Tensor) -> torch.Tensor:
    return t * 2 + 1


y = double_plus_one(torch.arange(4.0, device="cuda"))
out["compiled"] = y.cpu().tolist() if not y.is_meta else None
out["compiled_device"] = str(y.device)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh)
dist.destroy_process_group()
