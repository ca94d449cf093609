"""torch.distributed.checkpoint of an FSDP2 model, as a program writes it, for phantom mode (and real mode).

The state: the model's FSDP2 shards (a 1024 x 1024 weight and its bias, sharded on dim 0), the optimizer's state,
and a plain (replicated) tensor of 1000 floats. Each checkpoint call is alone in a step (an optimizer step between
two calls), so its storage time is the step's. argv[1]: the checkpoint directory (argv[1]-optim: the optimizer's);
argv[2]: where each rank writes what it saw (seen<rank>.json); argv[3] == "load": only load argv[1] (written by
another run).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

ckpt, out = sys.argv[1], Path(sys.argv[2])
load_only = sys.argv[3:] == ["load"]
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
model = torch.nn.Linear(1024, 1024).cuda()
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
extra = torch.zeros(1000, device="cuda")


def train() -> None:
    model(torch.randn(4, 1024, device="cuda")).square().sum().backward()
    opt.step()
    opt.zero_grad()


train()
if not load_only:
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "extra": extra}, checkpoint_id=ckpt)
    train()
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt + "-optim")
    train()
msd, osd = get_state_dict(model, opt)
dcp.load({"model": msd, "extra": extra}, checkpoint_id=ckpt)
train()
state = {"model": msd, "optim": osd}
dcp.load(state, checkpoint_id=ckpt + "-optim")
set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
train()
seen = {
    "shards": {k: [str(v.to_local().device), list(v.to_local().shape)] for k, v in model.state_dict().items()},
    "files": sorted(p.name for p in Path(ckpt).iterdir()),
    "step": {k: float(v["step"]) for k, v in opt.state_dict()["state"].items()},
}
(out / f"seen{rank}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
