"""A small causal language model trained with DeepSpeed ZeRO (stage 1, 2 or 3) and a torch optimizer, written
as DeepSpeed's own examples are: `deepspeed.init_distributed()`, `deepspeed.initialize(...)`, then
`engine.backward` and `engine.step`.

    phantora run --topology testbed16 --nproc 2 examples/deepspeed_zero.py --stage 3
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 examples/deepspeed_zero.py --stage 3   # the same on gloo

Under phantora DeepSpeed finds CUDA and NCCL (the simulated device). The corpus counts up from a random
start, so the loss falls from ln(vocab) within a few steps.
"""

from __future__ import annotations

import argparse

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

VOCAB = 512


class TinyLM(nn.Module):
    """Token embedding, causal transformer layers, a vocabulary head."""

    def __init__(self, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, default=1, choices=[0, 1, 2, 3], help="ZeRO stage")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="micro-batch per GPU")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    args = p.parse_args()

    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = TinyLM(args.width, args.layers, heads=4)
    print(f"parameters {sum(q.numel() for q in model.parameters())}", flush=True)
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage},
        "steps_per_print": args.steps,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    data = torch.Generator().manual_seed(engine.global_rank)
    for step in range(args.steps):
        start = torch.randint(0, VOCAB, (args.batch, 1), generator=data)
        x = ((start + torch.arange(args.seq + 1)) % VOCAB).to(engine.device)
        logits = engine(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        print(f"step {step} loss {loss.item():.5f}", flush=True)
    dist.destroy_process_group()  # leave gloo's groups before exit (torch's teardown can abort a rank otherwise)


if __name__ == "__main__":
    main()
