"""HF transformers' `attn_implementation="flash_attention_2"` and `"flash_attention_3"` on the simulated GPU
(FlashAttention not installed: phantora's simulated `flash_attn` and `flash_attn_interface`): a small Llama with
grouped key heads and a padded batch (so HF packs the rows and calls `flash_attn_varlen_func`), against the same
weights under `"sdpa"`. Writes, as JSON to argv[1], the losses, the largest difference of each one's gradients from
sdpa's, and the implementation each model kept."""

import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
torch.manual_seed(0)
ids = torch.randint(0, 128, (2, 32)).cuda()
mask = torch.ones(2, 32, dtype=torch.long).cuda()
mask[1, 20:] = 0
labels = ids.clone()
labels[1, 20:] = -100
IMPLS = ("flash_attention_2", "flash_attention_3", "sdpa")
seen = {}
state = None
for impl in IMPLS:
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=impl, torch_dtype=torch.bfloat16).cuda()
    if state is None:
        state = model.state_dict()
    model.load_state_dict(state)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    grads = torch.cat([p.grad.float().flatten().cpu() for p in model.parameters()])
    seen[impl] = {"loss": loss.item(), "impl": model.config._attn_implementation, "grads": grads}
json.dump(
    {
        "losses": [seen[i]["loss"] for i in IMPLS],
        "impls": [seen[i]["impl"] for i in IMPLS],
        "grad_errors": [(seen[i]["grads"] - seen["sdpa"]["grads"]).abs().max().item() for i in IMPLS[:2]],
        "grad_scale": seen["sdpa"]["grads"].abs().max().item(),
    },
    open(sys.argv[1], "w"),
)
