"""FlexAttention is charged for the blocks its block mask keeps (runtime/flex_blocks.py).

Inductor's flex_attention kernel computes, per query block, the key/value blocks its block mask lists (partial and
full), each a whole (128, 128) tile. Closed forms over S = 1,024 (n = 8 blocks each way): a top-left causal mask keeps
n(n + 1)/2 = 36 blocks; a causal sliding window of 128 keys back the diagonal block and the one before it, 2n - 1 = 15;
4 documents of 256 tokens 4 x 2^2 = 16 (causal within them: 4 x 3 = 12); a bidirectional prefix of 512 then causal
4 x 4 + (5 + 6 + 7 + 8) = 42; a full mask all 64, none masked. The charge is the causal flash kernel's with its
(query, key) pairs and torch's FLOP count (every pair of the causal kernel: 2 x B x H x S^2 x (d + dv) forward) times
kept / 36; above 36 the pairs go from the causal kernel's S(S + 1)/2 towards the full kernel's S^2 as the kept
blocks go from 36 towards 64; a full mask is the full kernel; phantom mode's meta mask is taken as causal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from phantora.errors import InputError
from phantora.perfmodel.features import compute_features, make_call
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime import flex_blocks
from phantora.runtime import session as session_module
from phantora.runtime.compute import Calibrated, OpCost, Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import attention, device
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session

B, H, S, D = 1, 2, 1024, 16
N = S // 128
CAUSAL_PAIRS = S * (S + 1) // 2
MASKS: dict[str, tuple[Callable, int]] = {  # mask_mod, blocks kept (closed form)
    "causal": (lambda b, h, i, j: i >= j, N * (N + 1) // 2),
    "window": (lambda b, h, i, j: (i >= j) & (i - j <= 128), 2 * N - 1),
    "documents": (lambda b, h, i, j: i // 256 == j // 256, 4 * 2 * 2),
    "causal_documents": (lambda b, h, i, j: (i // 256 == j // 256) & (i >= j), 4 * 3),
    "prefix": (lambda b, h, i, j: (j < 512) | (i >= j), 4 * 4 + 5 + 6 + 7 + 8),
    "full": (lambda b, h, i, j: i >= 0, N * N),
}


def _mask(name: str) -> BlockMask:
    return create_block_mask(MASKS[name][0], None, None, S, S, device="cpu")


@pytest.mark.parametrize("name", list(MASKS))
def test_the_blocks_a_mask_keeps(name: str) -> None:
    got = flex_blocks.blocks(_mask(name).as_tuple(), S, S)
    assert got is not None
    assert (got.kept, got.causal, got.total) == (MASKS[name][1], N * (N + 1) // 2, N * N)
    assert got.unmasked == (name == "full")


def test_causal_blocks_at_unequal_lengths_and_block_sizes() -> None:
    """Query block r's last row min((r + 1) bq, Lq) - 1 reaches key block row // bkv (top-left causal)."""
    assert flex_blocks.causal_blocks(1024, 1024, 128, 128) == 36
    assert flex_blocks.causal_blocks(300, 300, 128, 128) == 1 + 2 + 3  # a short last block
    assert flex_blocks.causal_blocks(256, 1024, 128, 64) == 2 + 4  # rows 127 and 255: key blocks 0-1, 0-3
    assert flex_blocks.causal_blocks(1024, 256, 128, 128) == 1 + 2 * 7  # rows past the keys see them all


def _want(name: str) -> flex_blocks.Charge:
    """The closed-form charge of a mask over S (module docstring)."""
    kept, causal = MASKS[name][1], N * (N + 1) // 2
    if name == "full":
        return flex_blocks.Charge(False)
    if kept == causal:
        return flex_blocks.Charge(True)
    if kept < causal:
        return flex_blocks.Charge(True, round(CAUSAL_PAIRS * kept / causal), kept, causal)
    return flex_blocks.Charge(True, round(CAUSAL_PAIRS + (S * S - CAUSAL_PAIRS) * (kept - causal) / (N * N - causal)))


@pytest.mark.parametrize("name", list(MASKS))
def test_the_charge_of_a_mask(name: str) -> None:
    assert flex_blocks.charge(_mask(name).as_tuple(), S, S) == _want(name)


def test_no_mask_and_a_meta_mask() -> None:
    """flex_attention without a block mask makes one block of 2^30 with `noop_mask`: the full kernel. A meta mask
    (phantom mode) has no counts: taken as causal."""
    empty = torch.nn.attention.flex_attention._create_empty_block_mask(torch.empty(1, 1, S, D), torch.empty(1, 1, S, D))
    assert flex_blocks.charge(empty.as_tuple(), S, S) == flex_blocks.Charge(False)
    meta = _mask("window").as_tuple()
    meta = (*meta[:2], *(x if x is None else x.to("meta") for x in meta[2:14]), *meta[14:])
    assert flex_blocks.blocks(meta, S, S) is None and flex_blocks.charge(meta, S, S) == flex_blocks.Charge(True)


@pytest.fixture(params=[False, True], ids=["real", "phantom"])
def session(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    yield from charged_session(monkeypatch, request.param, Calibrated(get_gpu("h100"), DEFAULT_LAUNCH_NS))


def _on_device(mask: BlockMask, phantom: bool) -> BlockMask:
    """The mask's tensors on the simulated GPU (meta in phantom mode), as `create_block_mask(device="cuda")` gives."""
    t = mask.as_tuple()
    sim = [None if x is None else SimCudaTensor(x.to("meta") if phantom else x, 0) for x in t[2:10]]
    return BlockMask(mask.seq_lengths, *sim, BLOCK_SIZE=mask.BLOCK_SIZE, mask_mod=mask.mask_mod)


def test_flex_attention_is_charged_for_its_blocks(session: tuple[RankSession, list]) -> None:
    """Through the rank's dispatch mode: FLOPs torch's count for the causal kernel, 2 x B x H x S^2 x 2D, times
    kept / 36 below 36 blocks; the bytes the flash kernel's; the time the calibrated model's of the closed-form
    pairs, the causal kernel's exactly for the causal mask and the full kernel's for the full one. Phantom mode:
    every mask the causal kernel."""
    s, seen = session
    torch.manual_seed(0)
    host = [torch.randn(B, H, S, D).bfloat16() for _ in range(3)]
    q, k, v = (SimCudaTensor(x.to("meta") if s.phantom else x, 0) for x in host)
    with ChargeMode(s):
        for name in MASKS:
            flex_attention(q, k, v, block_mask=_on_device(_mask(name), s.phantom))
    assert [n for n, _ in seen] == ["flex_attention"] * len(MASKS)
    meta = [torch.empty(B, H, S, D, dtype=torch.bfloat16, device="meta")] * 3
    outs = (meta[0], torch.empty(B, H, S, dtype=torch.float32, device="meta"))  # the output and log-sum-exp
    every_pair = 2 * B * H * S * S * 2 * D
    for (_, got), name in zip(seen, MASKS, strict=True):
        want = flex_blocks.Charge(True) if s.phantom else _want(name)
        kernel = s.model.cost(attention.FLASH, tuple(meta), want.flags(), outs)
        flops = round(every_pair * want.kept / want.of)
        assert (got.flops, got.nbytes, got.ns) == (flops, kernel.nbytes, kernel.ns), name
    causal = s.model.cost(attention.FLASH, tuple(meta), {"is_causal": True}, outs)
    full = s.model.cost(attention.FLASH, tuple(meta), {"is_causal": False}, outs)
    by_name = {name: c for (_, c), name in zip(seen, MASKS, strict=True)}
    assert by_name["causal"].ns == causal.ns and by_name["full"].ns == (causal if s.phantom else full).ns
    if not s.phantom:
        assert by_name["causal_documents"].ns < by_name["window"].ns < by_name["documents"].ns < causal.ns
        assert causal.ns < by_name["prefix"].ns < full.ns


def test_the_roofline_counts_the_same_flops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The roofline's FLOPs (torch's formula) are scaled alike: a window's kept / causal blocks."""
    monkeypatch.setattr(device, "_installed", True)
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none", phantom=False)
    seen: list[OpCost] = []
    monkeypatch.setattr(s, "charge", lambda name, cost: seen.append(cost))
    session_module.install(s)
    try:
        q = SimCudaTensor(torch.randn(B, H, S, D).bfloat16(), 0)
        with ChargeMode(s):
            flex_attention(q, q, q, block_mask=_on_device(_mask("window"), False))
    finally:
        session_module.install(None)
    assert [c.flops for c in seen] == [round(2 * B * H * S * S * 2 * D * (2 * N - 1) / (N * (N + 1) // 2))]


def test_the_model_takes_the_pairs_and_checks_them() -> None:
    """perfmodel's attention features take a batch-head's pairs as given (`pairs`, from `kept_pairs`); a count
    outside [0, Lq x Lkv] is an error naming the field."""
    shapes, dtypes = [(B, H, S, D)] * 3, ["bf16"] * 3
    f = compute_features(make_call("aten::_scaled_dot_product_flash_attention", shapes, dtypes, {"pairs": 1000}))
    assert f.pairs == B * H * 1000 and f.flops == 2 * B * H * 1000 * 2 * D
    with pytest.raises(InputError, match="pairs") as err:
        compute_features(make_call("aten::_scaled_dot_product_flash_attention", shapes, dtypes, {"pairs": S * S + 1}))
    assert err.value.field == "pairs"
