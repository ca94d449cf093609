"""Index data that grows into a model-sized tensor in phantom mode (tests/test_phantom_routing.py): `arange` on the
simulated GPU has values; a comparison of two slices broadcast to 64 x 64 keeps them, one to 8192 x 8192 (a whole
attention mask, as FlexAttention's create_block_mask builds) is phantom. argv: OUT_FILE."""

import json
import resource
import sys

import torch

from phantora.runtime.phantom_mode import PhantomValueError

a = torch.arange(8192, device="cuda")
seen = {"small": int((a[:64, None] >= a[None, :64]).sum().item())}
big = a[:, None] >= a[None, :]
try:
    seen["big"] = int(big.sum().item())
except PhantomValueError:
    seen["big"] = "phantom"
seen["shape"] = list(big.shape)
seen["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
