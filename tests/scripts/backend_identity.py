"""A CUDA + NCCL program's view of its groups (tests/test_backend_identity.py): `get_backend`, `get_backend_config`,
the groups' own names, the bound device,
DeviceMesh's split under eager init, and a 4 MiB all-reduce on a split group. argv: OUT_DIR MODE, where MODE is
"eager" (nccl + device_id), "pair" ("cpu:gloo,cuda:nccl") or "bare" (no backend)."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import phantora.runtime as pr

out_dir, mode = sys.argv[1], sys.argv[2]
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
if mode == "eager":
    dist.init_process_group("nccl", device_id=dev)
else:
    dist.init_process_group("cpu:gloo,cuda:nccl" if mode == "pair" else None)
default = dist.distributed_c10d._get_default_group()
seen: dict = {
    "backend": str(dist.get_backend()),
    "bound": str(default.bound_device_id),
    "config": dist.get_backend_config(),
    "names": [default._get_backend_name(), default._get_backend(dev).name()],  # the group's, its cuda backend's
}
if mode == "eager":
    seen["safe_to_split"] = dist.distributed_c10d._is_safe_to_split()
    mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    seen.update(
        tp_ranks=dist.get_process_group_ranks(tp),
        splits=default._get_backend(dev).comm_split_count(),  # ProcessGroupNCCL's count of ncclCommSplit
        tp_backend=str(dist.get_backend(tp)),
        tp_config=dist.get_backend_config(tp),
        tp_names=[tp._get_backend_name(), tp._get_backend(dev).name()],
        tp_bound=str(tp.bound_device_id),
    )
    x = torch.full((1 << 20,), float(dist.get_rank()), device="cuda")  # 4 MiB of fp32
    torch.cuda.synchronize()
    t0 = pr.now()
    dist.all_reduce(x, group=tp)
    torch.cuda.synchronize()
    seen["tp_ns"] = pr.now() - t0  # before reading the sum: `.item()` is a copy of its own
    seen["tp_sum"] = float(x[0].item())
    pair = dist.new_group([0, 2])
    if dist.get_rank() in (0, 2):
        seen.update(new_group_backend=str(dist.get_backend(pair)), new_group_bound=str(pair.bound_device_id))
with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
