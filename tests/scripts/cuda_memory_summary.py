"""`torch.cuda.memory_summary()` in a CUDA program (tests/test_simcuda_memory_summary.py): after a 4 MiB tensor and
a freed 8 MiB one, it writes the summary and `memory_allocated` / `max_memory_allocated` to `argv[1]`."""

import json
import sys

import torch

torch.cuda.set_device(0)
keep = torch.ones(1 << 20, device="cuda")  # 4 MiB of fp32
tmp = torch.ones(2 << 20, device="cuda")  # 8 MiB, freed
del tmp
with open(sys.argv[1], "w") as f:
    json.dump(
        {
            "summary": torch.cuda.memory_summary(),
            "allocated": torch.cuda.memory_allocated(),
            "peak": torch.cuda.max_memory_allocated(),
        },
        f,
    )
