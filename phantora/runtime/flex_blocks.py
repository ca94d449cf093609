"""What a FlexAttention block mask asks its kernel to compute, in the flash kernel's terms.

Inductor's flex_attention Triton template walks, for each query block, the key/value blocks its block mask lists:
`kv_num_blocks` partial ones (mask_mod runs on them) and `full_kv_num_blocks` full ones (mask_mod skipped), each a
BLOCK_SIZE (q, kv) tile computed whole; the backward walks the transposed lists, the same blocks. The compute model
knows the flash kernel, causal or full, so a mask is charged against it:
- every block kept, none masked (all full blocks, or the mask_mod is `noop_mask`): the full kernel;
- otherwise the causal kernel, with the (query, key) pairs it times scaled by the blocks kept against the blocks a
  top-left causal mask keeps at the same lengths and block sizes (so a causal block mask is exactly the causal
  kernel: a partial block counts as a causal kernel's diagonal tile does), and, above the causal count, from the
  causal kernel's pairs towards the full kernel's as the kept blocks go towards all of them;
- counts unknown (phantom mode's block mask is meta, or has no blocks): taken as causal, the mask of language-model
  training.
The FLOPs follow torch's formula, which counts every pair of the causal kernel: times the kept share below the causal
count (`compute.kept_flops`, as a sliding window's in simcuda/varlen.py), the formula's above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.nn.attention.flex_attention import noop_mask

from phantora.perfmodel.features import causal_pairs


@dataclass(frozen=True)
class MaskBlocks:
    """A block mask's blocks for one batch-head on average (`kept`, partial + full), against the blocks a top-left
    causal mask keeps (`causal`) and all of them (`total`); `unmasked`: every block kept with mask_mod skipped."""

    kept: float
    causal: int
    total: int
    unmasked: bool


@dataclass(frozen=True)
class Charge:
    """How to charge a flex call as the flash kernel: `is_causal`, the pairs a batch-head computes (None: the
    kernel's own) and the FLOPs' share of torch's formula's (`kept` of `of`)."""

    is_causal: bool
    pairs: int | None = None
    kept: float = 1.0
    of: float = 1.0

    def flags(self) -> dict[str, Any]:
        """The compute model's keywords for the flash op (`kept_pairs`: perfmodel's `pairs` extra)."""
        if self.pairs is None:
            return {"is_causal": self.is_causal}
        return {"is_causal": self.is_causal, "kept_pairs": self.pairs}


def causal_blocks(q_len: int, kv_len: int, q_block: int, kv_block: int) -> int:
    """(q, kv) blocks a top-left causal mask (query i sees keys 0..i) touches: query block r's last row
    min((r + 1) q_block, q_len) - 1 reaches key block (that row) // kv_block."""
    n_q, n_kv = -(-q_len // q_block), -(-kv_len // kv_block)
    return sum(min(n_kv, (min((r + 1) * q_block, q_len) - 1) // kv_block + 1) for r in range(n_q))


def blocks(block_mask: tuple, q_len: int, kv_len: int) -> MaskBlocks | None:
    """The blocks of a block mask in its tuple form (`BlockMask.as_tuple()`), None when its counts are unknown
    (meta tensors) or it lists no blocks."""
    kv_num, kv_indices, full_num = block_mask[2], block_mask[3], block_mask[4]
    if kv_num.is_meta or kv_indices.numel() == 0 or (full_num is not None and full_num.is_meta):
        return None
    q_block, kv_block, mask_mod = block_mask[14], block_mask[15], block_mask[16]
    heads = kv_num.numel() // max(1, kv_num.shape[-1])  # the mask's (batch, head) rows; 1 and 1 broadcast
    partial = int(kv_num.sum().item())
    full = int(full_num.sum().item()) if full_num is not None else 0
    n_q, n_kv = -(-q_len // q_block), -(-kv_len // kv_block)
    unmasked = full + (partial if mask_mod is noop_mask else 0) == heads * n_q * n_kv
    return MaskBlocks((partial + full) / heads, causal_blocks(q_len, kv_len, q_block, kv_block), n_q * n_kv, unmasked)


def charge(block_mask: tuple, q_len: int, kv_len: int) -> Charge:
    """How a flex call over `q_len` queries and `kv_len` keys with this block mask is charged (module docstring)."""
    b = blocks(block_mask, q_len, kv_len)
    if b is None:
        return Charge(True)
    if b.unmasked:
        return Charge(False)
    if b.kept == b.causal:
        return Charge(True)
    c_pairs = causal_pairs(q_len, kv_len)
    if b.kept < b.causal:
        return Charge(True, round(c_pairs * b.kept / b.causal), b.kept, b.causal)
    toward_full = min(1.0, (b.kept - b.causal) / (b.total - b.causal))
    return Charge(True, round(c_pairs + (q_len * kv_len - c_pairs) * toward_full))
