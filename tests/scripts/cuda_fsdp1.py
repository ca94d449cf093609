"""FSDP1 (`FullyShardedDataParallel`, FULL_SHARD, `sync_module_states` as HF Accelerate sets it) on the simulated
GPU, then its sharded state dict and a full one offloaded to the host (as HF Trainer saves a model).

Each rank trains on its own batch (seeded by its rank) for two SGD steps; a plain replica trains on every rank's
batch with the mean of their gradients, which is what FSDP computes. Rank 0 writes to argv[1] the largest difference
between FSDP's gathered parameters and the replica's, the flat parameter's shard size, the sharded state dict's
keys and the device type of its shards, `_get_pg_default_device()`, the full state dict's devices and its largest
difference from the replica's, the flat parameter's device after it, and a parameter moved to the host in place
(`p.data = p.to("cpu")`) and back: its class and device each way, and whether it is the same object.
"""

import copy
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.distributed_c10d import _get_pg_default_device
from torch.distributed.fsdp import FullStateDictConfig, ShardingStrategy, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

rank = int(os.environ["RANK"])
dist.init_process_group("nccl")
torch.cuda.set_device(rank)
world = dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
replica = copy.deepcopy(model).cuda()
fsdp = FSDP(
    model,
    sharding_strategy=ShardingStrategy.FULL_SHARD,
    device_id=torch.cuda.current_device(),
    sync_module_states=True,
)
opt = torch.optim.SGD(fsdp.parameters(), lr=0.1)
opt_replica = torch.optim.SGD(replica.parameters(), lr=0.1)


def batch(r: int, step: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + r)).cuda()


for step in range(2):
    fsdp(batch(rank, step)).square().sum().backward()
    opt.step()
    opt.zero_grad()
    for r in range(world):
        (replica(batch(r, step)).square().sum() / world).backward()
    opt_replica.step()
    opt_replica.zero_grad()
with FSDP.summon_full_params(fsdp):
    pairs = zip(fsdp.module.parameters(), replica.parameters(), strict=True)
    diff = max(float((a - b).abs().max()) for a, b in pairs)
shard = fsdp._handle.flat_param.numel()
with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
    state = fsdp.state_dict()
devices = sorted({t.local_shards()[0].tensor.device.type for t in state.values() if t.local_shards()})
with FSDP.state_dict_type(
    fsdp, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
):
    full = fsdp.state_dict()
expected = replica.state_dict()
full_diff = max(float((full[k] - expected[k].cpu()).abs().max()) for k in full) if rank == 0 else 0.0
p = torch.nn.Parameter(torch.arange(4.0, device="cuda"))
before = id(p)
p.data = p.to("cpu")
host = [type(p).__name__, p.device.type]
p.data = p.to("cuda")
moved = {"host": host, "back": [type(p).__name__, p.device.type], "same_object": id(p) == before}
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(
            {
                "max_diff": diff,
                "shard_numel": shard,
                "keys": sorted(state),
                "shard_devices": devices,
                "default_device": str(_get_pg_default_device()),
                "full_devices": sorted({v.device.type for v in full.values()}),
                "full_diff": full_diff,
                "flat_param_after": fsdp._handle.flat_param.device.type,
                "moved": moved,
            },
            f,
        )
dist.destroy_process_group()
