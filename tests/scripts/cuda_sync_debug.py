"""`torch.cuda.set_sync_debug_mode` in a CUDA program (tests/test_simcuda_sync_debug.py): each level set by name is
read back by `get_sync_debug_mode`, a wrong name is refused by torch; written to `argv[1]`."""

import json
import sys

import torch

seen = {}
for name in ("warn", "error", "default"):
    torch.cuda.set_sync_debug_mode(name)
    seen[name] = torch.cuda.get_sync_debug_mode()
try:
    torch.cuda.set_sync_debug_mode("loud")
except RuntimeError as e:
    seen["refused"] = str(e)
x = torch.ones(4, device="cuda")
seen["sum"] = x.sum().item()  # a synchronising call, which runs
with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
