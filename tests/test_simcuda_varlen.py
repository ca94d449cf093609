"""Packed (variable-length) flash attention on the simulated GPU (simcuda/varlen.py).

`torch.nn.attention.varlen.varlen_attn` (torchtitan's `VarlenAttention`) calls ``aten._flash_attention_forward`` on
(total, heads, dim) with cumulative sequence lengths; torch has it for CUDA only, and real mode stopped with
`NotSimulatedError`. Closed forms: each sequence attends to itself only, softmax(q k^T * scale + mask) v with the
causal mask (and a sliding window's) aligned to the bottom right, computed here in fp64; the log-sum-exp is that
softmax's normaliser (heads, total); the gradients are autograd's of the fp64 reference. The charge is one kernel
with the FLOPs of the sequences' (query, key) pairs, which the roofline counts as torch's flop formula for SDPA does
(every pair, the causal mask not discounted): 2 x heads x sum(n^2) x (d + dv) forward, x (3d + 2dv) backward.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session

aten = torch.ops.aten
LENGTHS = [5, 12, 7, 12]  # four packed sequences, two of one length
HEADS, KV_HEADS, D = 4, 2, 16


@pytest.fixture(params=[False, True], ids=["real", "phantom"])
def charged(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    yield from charged_session(monkeypatch, request.param, Roofline(get_gpu("h100"), launch_ns=DEFAULT_LAUNCH_NS))


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, left: int = -1) -> tuple:
    """fp64 output and log-sum-exp of each sequence on its own, key heads shared by HEADS / KV_HEADS query heads."""
    outs, lses, start = [], [], 0
    for n in LENGTHS:
        qs, ks, vs = (x[start : start + n].double().transpose(0, 1) for x in (q, k, v))
        ks, vs = (x.repeat_interleave(HEADS // KV_HEADS, 0) for x in (ks, vs))
        scores = qs @ ks.transpose(-1, -2) * D**-0.5
        i, j = torch.arange(n).unsqueeze(1), torch.arange(n).unsqueeze(0)
        keep = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
        if left >= 0:
            keep &= j >= i - left
        scores = scores.masked_fill(~keep, float("-inf"))
        lses.append(scores.logsumexp(-1))
        outs.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs), torch.cat(lses, dim=1)


def _inputs(phantom: bool, grad: bool = False) -> tuple[list[torch.Tensor], list[SimCudaTensor], SimCudaTensor]:
    torch.manual_seed(0)
    total = sum(LENGTHS)
    host = [torch.randn(total, h, D).bfloat16() for h in (HEADS, KV_HEADS, KV_HEADS)]
    sims = [SimCudaTensor(x.to("meta") if phantom else x, 0) for x in host]
    cum = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    return host, sims, SimCudaTensor(cum, 0)  # the lengths are host values, as phantom mode keeps integer data


PAIRS = sum(n * n for n in LENGTHS)
# Phantom mode: the op mixes meta data with the lengths' values, so it runs on meta and the lengths are unknown:
# taken as max_q (12) each, 36 rows as 3 sequences of 12
PHANTOM_PAIRS = 3 * 12 * 12


@pytest.mark.parametrize("causal", [True, False])
def test_each_sequence_attends_to_itself_in_one_kernel(charged: tuple[RankSession, list], causal: bool) -> None:
    s, seen = charged
    host, (q, k, v), cum = _inputs(s.phantom)
    with ChargeMode(s):
        out, lse, rng, _, _ = aten._flash_attention_forward(q, k, v, cum, cum, 12, 12, 0.0, causal, False)
    assert [name for name, _ in seen] == ["aten._flash_attention_forward"]
    assert seen[0][1].flops == 2 * HEADS * (PHANTOM_PAIRS if s.phantom else PAIRS) * (D + D)
    assert out.shape == (sum(LENGTHS), HEADS, D) and lse.shape == (HEADS, sum(LENGTHS))
    assert (out.dtype, lse.dtype, out.device) == (torch.bfloat16, torch.float32, torch.device("cuda", 0))
    if s.phantom:
        return
    want, want_lse = _reference(*host, causal)
    torch.testing.assert_close(out.elem.double(), want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.elem.double(), want_lse, rtol=1e-3, atol=1e-3)


def test_a_sliding_window_masks_keys_further_back(charged: tuple[RankSession, list]) -> None:
    s, _ = charged
    if s.phantom:
        pytest.skip("values only")
    host, (q, k, v), cum = _inputs(False)
    with ChargeMode(s):
        out = aten._flash_attention_forward(
            q, k, v, cum, cum, 12, 12, 0.0, True, False, window_size_left=3, window_size_right=0
        )[0]
    want, _ = _reference(*host, True, left=3)
    torch.testing.assert_close(out.elem.double(), want, rtol=2e-2, atol=2e-2)


def test_the_backward_gives_the_references_gradients_in_one_kernel(charged: tuple[RankSession, list]) -> None:
    s, seen = charged
    host, (q, k, v), cum = _inputs(s.phantom)
    leaves = [x.double().requires_grad_() for x in host]
    want_out, want_lse = _reference(*leaves, True)
    grad = torch.randn_like(want_out)
    (want_out * grad).sum().backward()
    out_bf16 = want_out.detach().bfloat16()
    lse32 = want_lse.detach().float()
    g, o, lse = (SimCudaTensor(x.to("meta") if s.phantom else x, 0) for x in (grad.bfloat16(), out_bf16, lse32))
    rng, unused = (SimCudaTensor(torch.zeros(2 if i else (), dtype=torch.uint64), 0) for i in (1, 0))
    with ChargeMode(s):
        dq, dk, dv = aten._flash_attention_backward(g, q, k, v, o, lse, cum, cum, 12, 12, 0.0, True, rng, unused)
    assert [name for name, _ in seen] == ["aten._flash_attention_backward"]
    cost = seen[0][1]
    assert cost.flops == 2 * HEADS * (PHANTOM_PAIRS if s.phantom else PAIRS) * (3 * D + 2 * D)
    assert [x.shape for x in (dq, dk, dv)] == [x.shape for x in host]
    if s.phantom:
        return
    for got, leaf in zip((dq, dk, dv), leaves, strict=True):
        torch.testing.assert_close(got.elem.double(), leaf.grad, rtol=5e-2, atol=5e-2)


def test_torchs_varlen_attn_ops_are_the_same_kernels(charged: tuple[RankSession, list]) -> None:
    """`varlen_attn`'s own custom ops (``torch_attn::_varlen_attn`` and its backward) run the same FlashAttention
    calls on the data, charged as them; before, the custom op ran its Python body on the CPU data, whose
    ``_flash_attention_forward`` has no CPU kernel."""
    s, seen = charged
    host, (q, k, v), cum = _inputs(s.phantom)
    with ChargeMode(s):
        out, lse, rng = torch.ops.torch_attn._varlen_attn(q, k, v, cum, cum, 12, 12, True)
        grads = torch.ops.torch_attn._varlen_attn_backward(out, q, k, v, out, lse, cum, cum, 12, 12, True, rng)
    assert [name for name, _ in seen] == ["aten._flash_attention_forward", "aten._flash_attention_backward"]
    pairs = PHANTOM_PAIRS if s.phantom else PAIRS
    assert [c.flops for _, c in seen] == [2 * HEADS * pairs * 2 * D, 2 * HEADS * pairs * 5 * D]
    assert [x.shape for x in grads] == [x.shape for x in host]
    if not s.phantom:
        torch.testing.assert_close(out.elem.double(), _reference(*host, True)[0], rtol=2e-2, atol=2e-2)


def _window_pairs(n: int, w: int) -> int:
    """Closed form: a causal window of w keys back over n queries keeps min(i, w) + 1 keys for query i."""
    return (w + 1) * n - w * (w + 1) // 2 if n > w else n * (n + 1) // 2


@pytest.mark.parametrize("w", [0, 3, 20])
def test_a_sliding_window_is_charged_its_pairs(charged: tuple[RankSession, list], w: int) -> None:
    """A causal window of w keys over a sequence of n is charged the causal kernel's FLOPs times the share of its
    pairs the window keeps, sum_n W(n, w) / sum_n n(n+1)/2 within a group of one length; the same bytes; forward and
    backward. A window wider than every sequence (20) costs what the causal kernel does."""
    s, seen = charged
    _, (q, k, v), cum = _inputs(s.phantom)
    lengths = [12, 12, 12] if s.phantom else LENGTHS
    with ChargeMode(s):
        aten._flash_attention_forward(q, k, v, cum, cum, 12, 12, 0.0, True, False)
        aten._flash_attention_forward(
            q, k, v, cum, cum, 12, 12, 0.0, True, False, window_size_left=w, window_size_right=0
        )
    (_, causal), (_, window) = seen
    per_length: dict[int, int] = {}
    for n in lengths:
        per_length[n] = per_length.get(n, 0) + 1
    want = sum(
        round(2 * HEADS * c * n * n * 2 * D * _window_pairs(n, w) / (n * (n + 1) // 2)) for n, c in per_length.items()
    )
    assert causal.flops == 2 * HEADS * sum(n * n for n in lengths) * 2 * D  # torch's formula: every pair
    assert window.flops == want and window.nbytes == causal.nbytes
    assert (window.flops < causal.flops) == (w < max(lengths) - 1)


def test_a_window_of_right_0_is_the_causal_kernels(charged: tuple[RankSession, list]) -> None:
    """torch's `varlen_attn` passes `is_causal=False` with a window (w, 0) (causal is FlashAttention's window (-1, 0)):
    charged as the causal window, and a window wider than every sequence as the causal kernel, not the full one."""
    s, seen = charged
    _, (q, k, v), cum = _inputs(s.phantom)
    with ChargeMode(s):
        for causal, left in ((True, 3), (False, 3), (True, -1), (False, 20)):
            aten._flash_attention_forward(
                q, k, v, cum, cum, 12, 12, 0.0, causal, False, window_size_left=left, window_size_right=0
            )
    window, same, causal, wide = (c for _, c in seen)
    assert (same.flops, same.ns) == (window.flops, window.ns)
    assert (wide.flops, wide.ns) == (causal.flops, causal.ns)


def test_the_calibrated_model_times_a_window_by_its_pairs() -> None:
    """perfmodel's attention features count a window's pairs (FlashAttention's bottom-right alignment), and the
    calibrated model's time falls with them."""
    from phantora.perfmodel.features import window_pairs
    from phantora.runtime.compute import Calibrated
    from phantora.runtime.simcuda import attention

    for n, w in ((4096, 128), (4096, 4095), (100, 0)):
        assert window_pairs(n, n, True, w, 0) == _window_pairs(n, w)
    assert window_pairs(3, 5, True, -1, -1) == 3 + 4 + 5  # bottom right: query i sees keys 0 .. i + 2
    assert window_pairs(4, 4, False, 1, 1) == 2 + 3 + 3 + 2
    model = Calibrated(get_gpu("h100"), DEFAULT_LAUNCH_NS)
    q = torch.empty(1, 8, 4096, 128, dtype=torch.bfloat16, device="meta")
    causal = model.cost(attention.FLASH, (q, q, q, 0.0, True, False), {}, None)
    window = model.cost(
        attention.FLASH, (q, q, q, 0.0, True, False), {"window_size_left": 128, "window_size_right": 0}, None
    )
    assert window.ns < causal.ns / 4  # 129 of 2,048.5 keys a query on average: the rows' fixed costs remain
