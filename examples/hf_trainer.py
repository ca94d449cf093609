"""A plain Hugging Face `Trainer` job, written as HF's own example scripts are: `TrainingArguments` from the
command line, a small Llama built from a config (no hub download), and a synthetic corpus in which each
token is the previous one plus one, so the loss falls from ln(vocab).

    phantora run --topology testbed16 --nproc 2 examples/hf_trainer.py --output_dir runs/hf --max_steps 4
    torchrun --nproc_per_node 2 examples/hf_trainer.py --output_dir runs/hf --max_steps 4 --use_cpu  # on gloo

Under phantora the script runs unchanged on the simulated CUDA device with the NCCL-style backend; add
`--fsdp "full_shard auto_wrap" --fsdp_config '{"transformer_layer_cls_to_wrap":["LlamaDecoderLayer"],"version":2}'`
for FSDP2 through Accelerate. The `train_runtime` and `*_per_second` figures it logs are simulated.
"""

from __future__ import annotations

import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

VOCAB, SEQ, SAMPLES = 512, 64, 256


def model_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2 * SEQ,
    )


class Counting(torch.utils.data.Dataset):
    """Sequences that count up from a random start (mod the vocabulary): learnable in a few steps."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=g)
        self.x = (start + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main() -> None:
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    torch.manual_seed(0)
    Trainer(model=LlamaForCausalLM(model_config()), args=args, train_dataset=Counting()).train()
    if torch.distributed.is_initialized():  # a clean shutdown: gloo's threads can abort at interpreter exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
