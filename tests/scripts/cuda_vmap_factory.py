"""A CUDA program that builds tensors on the GPU inside torch.func transforms, as FlexAttention's mask functions and
torch's context parallelism do: `torch.tensor(..., device="cuda")` under vmap, and an int index of a cuda tensor in a
mask function (FlexAttention turns it into a cuda index tensor). Writes what it saw as JSON to argv[1]."""

import json
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask

x = torch.arange(6.0, device="cuda").reshape(2, 3)
y = torch.vmap(lambda row: row * torch.tensor(2.0, device="cuda") + 1)(x)

doc = torch.tensor([0] * 96 + [1] * 160, device="cuda")  # two documents of 96 and 160 tokens
first = torch.tensor([0, 96], device="cuda")


def same_doc_causal(b, h, q, k):
    starts = first[1]  # an int index inside the mask function
    return (doc[q] == doc[k]) & (q >= k) & ((q < starts) | (k >= starts))


mask = create_block_mask(same_doc_causal, 1, 1, 256, 256, device="cuda")
dense = mask.to_dense()
json.dump(
    {
        "y": y.cpu().tolist(),
        "y_device": str(y.device),
        "blocks_shape": list(dense.shape),
        "blocks": dense.cpu().flatten().tolist(),
    },
    open(sys.argv[1], "w"),
)
