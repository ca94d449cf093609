"""torch.distributed.checkpoint of an FSDP2 model and its optimizer on the GPU: save, train on, load, resume.

argv[1]: the checkpoint directory; argv[2]: where rank 0 writes what it saw (JSON) and the full model
state at the save, copied to the host (`full.pt`).
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
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)


def train(seed: int) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed)).cuda()
    model(x).square().sum().backward()
    opt.step()
    opt.zero_grad()


def full() -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}


train(1)
msd, osd = get_state_dict(model, opt)
dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
saved = full()
train(2)
after_two = full()
msd, osd = get_state_dict(model, opt)
state = {"model": msd, "optim": osd}
dcp.load(state, checkpoint_id=ckpt)
set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
loaded = full()
train(2)  # the same second step again, from the loaded model and optimizer state
seen = {
    "loaded_equal": all(torch.equal(loaded[k], saved[k]) for k in saved),
    "moved_on": any(not torch.equal(after_two[k], saved[k]) for k in saved),
    "resumed_equal": all(torch.equal(full()[k], after_two[k]) for k in saved),
    "shards": {k: [str(v.to_local().device), list(v.to_local().shape)] for k, v in model.state_dict().items()},
}
if rank == 0:
    torch.save(saved, out / "full.pt")
    (out / "seen.json").write_text(json.dumps(seen))
dist.destroy_process_group()
