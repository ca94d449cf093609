"""torch.save / torch.load of a model and optimizer on the GPU, as a CUDA program checkpoints and resumes.

Writes argv[1]/seen<rank>.json (what the program saw) and argv[1]/ckpt<rank>.pt (the checkpoint), and
argv[1]/host<rank>.pt: the same state copied to the host with `.cpu()` before saving (real mode).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
dev = torch.device("cuda", rank)
phantom = sys.argv[2] == "phantom"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 32)
        self.mid = torch.nn.Linear(32, 32)
        self.out = torch.nn.Linear(32, 64, bias=False)
        self.out.weight = self.emb.weight  # tied: one storage
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("scale", torch.ones(32, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return self.out(torch.relu(self.mid(self.emb(x))) * self.scale)


def make() -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Net().to(dev)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: Net, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (4, 8), generator=g).to(dev)
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    opt.zero_grad()


model, opt = make()
train(model, opt, 1)
f8 = torch.arange(8, dtype=torch.float32, device=dev).to(torch.float8_e4m3fn)  # a dtype torch saves with v3
row = model.mid.weight.detach()[3]  # a view: saved over the parameter's storage
state = {"model": model.state_dict(), "optim": opt.state_dict(), "f8": f8, "row": row}
path = out / f"ckpt{rank}.pt"
torch.save(state, path)
if not phantom:
    cpu_state = {"model": {k: v.cpu() for k, v in model.state_dict().items()}, "f8": f8.cpu()}
    torch.save(cpu_state, out / f"host{rank}.pt")

seen: dict = {"saved_bytes": path.stat().st_size}
before = torch.cuda.memory_allocated()
loaded = torch.load(path, map_location=f"cuda:{rank}")
seen["allocated_by_load"] = torch.cuda.memory_allocated() - before
seen["model"] = {k: [str(v.device), str(v.dtype), list(v.shape)] for k, v in loaded["model"].items()}
seen["f8"] = [str(loaded["f8"].device), str(loaded["f8"].dtype)]
seen["exp_avg"] = [str(v["exp_avg"].device) for v in loaded["optim"]["state"].values()]
seen["tied"] = loaded["model"]["emb.weight"].data_ptr() == loaded["model"]["out.weight"].data_ptr()
mid = loaded["model"]["mid.weight"]
seen["row_is_view"] = loaded["row"].untyped_storage().data_ptr() == mid.untyped_storage().data_ptr()
seen["default"] = str(torch.load(path)["model"]["mid.weight"].device)  # no map_location: the saved device
seen["to_cpu"] = str(torch.load(path, map_location="cpu")["model"]["mid.weight"].device)
seen["remapped"] = str(torch.load(path, map_location={f"cuda:{rank}": "cuda:0"})["f8"].device)
try:
    torch.load(path, map_location="cuda:7")
    seen["bad_device"] = None
except RuntimeError as e:
    seen["bad_device"] = str(e)
if not phantom:
    seen["equal"] = all(torch.equal(v.cpu(), state["model"][k].cpu()) for k, v in loaded["model"].items())
    seen["f8_equal"] = torch.equal(loaded["f8"].cpu().float(), f8.cpu().float())
    seen["row_equal"] = torch.equal(loaded["row"].cpu(), model.mid.weight.detach()[3].cpu())

# resume: a fresh model and optimizer from the checkpoint train on as the original does
resumed, ropt = make()
resumed.load_state_dict(loaded["model"])
ropt.load_state_dict(loaded["optim"])
train(model, opt, 2)
train(resumed, ropt, 2)
seen["resumed_devices"] = sorted({str(p.device) for p in resumed.state_dict().values()})
if not phantom:
    pairs = zip(model.parameters(), resumed.parameters(), strict=True)
    seen["resumed_equal"] = all(torch.equal(a.cpu(), b.cpu()) for a, b in pairs)
(out / f"seen{rank}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
