"""A GPT-2-style tie (token embedding = output layer weight) moved to the simulated GPU; writes to argv[1].

Records, after `model.to("cuda")` and after `.to(torch.bfloat16)`, whether the two modules still hold one
Parameter object, and the parameter names and element count the model reports (what an optimizer and DDP see).
"""

import json
import sys

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(96, 16), "ln": nn.LayerNorm(16)})
        self.lm_head = nn.Linear(16, 96, bias=False)
        self.transformer.wte.weight = self.lm_head.weight


def seen(model: Tiny) -> dict:
    return {
        "tied": model.transformer.wte.weight is model.lm_head.weight,
        "names": [n for n, _ in model.named_parameters()],
        "numel": sum(p.numel() for p in model.parameters()),
        "device": model.lm_head.weight.device.type,
    }


model = Tiny()
out = {"host": seen(model)}
model.to("cuda")
out["cuda"] = seen(model)
model.to(torch.bfloat16)
out["bf16"] = seen(model)
opt = torch.optim.AdamW(model.parameters())
out["optimizer_tensors"] = sum(len(g["params"]) for g in opt.param_groups)
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh)
