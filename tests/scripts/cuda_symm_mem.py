"""torch's symmetric memory on the simulated GPU (test_simcuda_symm_mem.py): argv[1] the folder for what the program
saw, argv[2] "empty" (allocate a symmetric buffer on the GPU) or "rendezvous" (of a plain GPU tensor)."""

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

out, call = sys.argv[1], sys.argv[2]
dist.init_process_group("nccl")
torch.cuda.set_device(0)
with open(f"{out}/seen.json", "w") as f:
    json.dump({"backend": symm_mem.get_backend(torch.device("cuda", 0)), "cpu": symm_mem.get_backend("cpu")}, f)
if call == "empty":
    symm_mem.empty(16, dtype=torch.float32, device="cuda")
else:
    symm_mem.rendezvous(torch.zeros(16, device="cuda"), dist.group.WORLD)
