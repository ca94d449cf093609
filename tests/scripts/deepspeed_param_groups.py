"""DeepSpeed ZeRO (stage argv[2]) over a torch AdamW with two parameter groups, as HF Trainer makes it (weights with
weight decay, biases without); `engine.backward` then `engine.step` each iteration.

ZeRO steps the optimizer it wraps once per group; an iteration is still one step. Rank 0 writes to argv[1] its
simulated clock (time.perf_counter_ns, device synchronised) at the end of each iteration.
"""

import json
import sys
import time

import deepspeed
import torch
from torch import nn

out, stage = sys.argv[1], int(sys.argv[2])
deepspeed.init_distributed()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
groups = [
    {"params": [p for n, p in model.named_parameters() if n.endswith("weight")], "weight_decay": 0.01},
    {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0},
]
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage}}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups, lr=1e-3), config=config)
x = torch.randn(8, 256, generator=torch.Generator().manual_seed(engine.global_rank)).to(engine.device)
ends = []
for _ in range(3):
    engine.backward(engine(x).square().mean())
    engine.step()
    torch.cuda.synchronize()
    ends.append(time.perf_counter_ns())
if engine.global_rank == 0:
    with open(out, "w") as f:
        json.dump(ends, f)
