"""`torch.export` and torch's pipeline tracer on a host model, before the program selects a GPU, as torch's
pipelining tutorial does (tests/test_host_export.py). Writes the exported graph's ops and the pipe's stage count
to `argv[1]/rank{r}.json`."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import SplitPoint, pipeline


class Decoder(nn.Module):
    """Embedding, two decoder layers, a norm and the output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.layers = nn.ModuleDict({str(i): nn.TransformerDecoderLayer(32, 4, 64) for i in range(2)})
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 50)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for layer in self.layers.values():
            h = layer(h, h)
        return self.out(self.norm(h)).clone()


def exported_ops(model: nn.Module, tokens: torch.Tensor) -> list[str]:
    """The call targets of `torch.export.export(model, (tokens,))`'s graph, in order."""
    ep = torch.export.export(model, (tokens,))
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def example_tokens() -> torch.Tensor:
    """A micro-batch of a batch, as the tutorial takes it: a view (`chunk`) whose storage is the whole batch's."""
    return torch.ones(16, 10, dtype=torch.long).chunk(4)[0]


if __name__ == "__main__":
    dist.init_process_group()
    torch.manual_seed(0)
    model, tokens = Decoder(), example_tokens()
    ops = exported_ops(model, tokens)
    pipe = pipeline(model, mb_args=(tokens,), split_spec={"layers.1": SplitPoint.BEGINNING})
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"ops": ops, "stages": pipe.num_stages}, f)
    dist.destroy_process_group()
