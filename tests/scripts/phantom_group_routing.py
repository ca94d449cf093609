"""Rank script for tests/test_phantom_routing.py: the real group-limited routers on phantom scores (one phantom rank).

Megatron-Core's `group_limited_topk` (moe_utils.py) and torchtitan's `TokenChoiceTopKRouter` with
`num_expert_groups` / `num_limited_groups` (its `_get_node_limited_routing_scores`, then its final top-k in
`forward`), each on T tokens, E experts in G groups, top-k over topk_group groups. Writes each router's top-k indices
(argv[1], JSON).
"""

import json
import sys

import torch
from megatron.core.transformer.moe.moe_utils import group_limited_topk
from torchtitan.models.common.linear import Linear
from torchtitan.models.common.moe import TokenChoiceTopKRouter

T, DIM, E, G, KG, K = 64, 16, 64, 8, 2, 4


def run() -> dict:
    hidden = torch.randn(T, DIM, device="cuda")
    scores = torch.softmax(hidden @ torch.randn(DIM, E, device="cuda"), dim=-1)  # phantom: the model's activations
    _, mega = group_limited_topk(scores, K, T, E, G, KG)
    config = TokenChoiceTopKRouter.Config(
        num_experts=E,
        gate=Linear.Config(in_features=DIM, out_features=E),
        num_expert_groups=G,
        num_limited_groups=KG,
        top_k=K,
    )
    router = TokenChoiceTopKRouter(config).to("cuda")
    _, titan, _ = router(hidden.view(2, T // 2, DIM))
    return {"scores_phantom": scores.elem.is_meta, "megatron": mega.tolist(), "titan": titan.reshape(T, K).tolist()}


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(run(), f)
