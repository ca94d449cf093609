"""Tied parameters under moves torch itself does not keep tied, on the simulated GPU and on the host; writes argv[1].

torch keeps a tie only when it moves a parameter in place (`Module._apply`, `compute_should_use_set_data`): a module
built on the meta device and materialised with `to_empty` gets a new Parameter per module, so the tie breaks (a
program must tie again). Records, for the same program, whether the tie holds after `to_empty(device=...)` onto
the simulated GPU and onto the host (torch's own behaviour, the reference), and the parameter count each reports.
"""

import json
import sys

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(96, 16)
        self.lm_head = nn.Linear(16, 96, bias=False)
        self.wte.weight = self.lm_head.weight


def materialised(device: str) -> dict:
    with torch.device("meta"):
        model = Tiny()
    model.to_empty(device=device)
    return {"tied": model.wte.weight is model.lm_head.weight, "numel": sum(p.numel() for p in model.parameters())}


with open(sys.argv[1], "w") as fh:
    json.dump({"cuda": materialised("cuda"), "cpu": materialised("cpu")}, fh)
