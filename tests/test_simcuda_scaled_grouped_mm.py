"""`torch._scaled_grouped_mm` (fp8 MoE experts in one kernel) on the simulated GPU (simcuda/scaled_grouped.py): this
CPU build has no kernel for it, so a real-mode run stopped at it. Closed form: out[i, j] = sa[i] sb[j] sum_k a[i, k]
b[k, j] within each group, written as bf16; one charged kernel of 2 m n k FLOPs over the groups at the H100's fp8
rate (1,979 TFLOP/s dense, NVIDIA's datasheet) in the roofline."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda.devices import NotSimulatedError
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session

F8 = torch.float8_e4m3fn
G, M, K, N = 3, 4, 16, 8


@pytest.fixture(params=[False, True], ids=["real", "phantom"])
def charged(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    yield from charged_session(monkeypatch, request.param, Roofline(get_gpu("h100"), launch_ns=DEFAULT_LAUNCH_NS))


def _sim(t: torch.Tensor, s: RankSession) -> SimCudaTensor:
    return SimCudaTensor(t.to("meta") if s.phantom else t, 0)


def test_moe_forward_is_one_fp8_kernel_with_the_closed_form(charged: tuple[RankSession, list]) -> None:
    """2-D x 3-D: G experts' [K, N] weights, M rows routed to each (offs), fp8 values exact in e4m3 (small integers
    and halves), row-wise scales."""
    s, seen = charged
    a = torch.arange(G * M * K).remainder(7).sub(3).float().reshape(G * M, K)  # -3..3
    w = torch.arange(G * N * K).remainder(5).sub(2).float().div(2).reshape(G, N, K)  # -1..1 in halves
    sa = torch.arange(1, G * M + 1).float() / 4
    sb = torch.arange(1, G * N + 1).float().reshape(G, N) / 8
    offs = torch.arange(1, G + 1, dtype=torch.int32) * M
    args = [_sim(a.to(F8), s), _sim(w.to(F8), s).transpose(-2, -1), _sim(sa, s), _sim(sb, s), _sim(offs, s)]
    with ChargeMode(s):
        out = torch._scaled_grouped_mm(*args, out_dtype=torch.bfloat16)
    assert tuple(out.shape) == (G * M, N) and out.dtype == torch.bfloat16 and out.device == torch.device("cuda", 0)
    [(name, cost)] = seen
    assert name == "aten._scaled_grouped_mm" and cost.dtype == "fp8"
    flops = 2 * G * M * K * N
    assert cost.flops == flops
    assert cost.ns == max(math.ceil(flops / 1979e12 * 1e9), math.ceil(cost.nbytes / get_gpu("h100").mem_bw * 1e9)) + (
        DEFAULT_LAUNCH_NS
    )
    if s.phantom:
        return
    want = torch.cat([a.double()[g * M : (g + 1) * M] @ w.double()[g].T for g in range(G)])
    want = want * sa.double()[:, None] * sb.double().repeat_interleave(M, 0)
    torch.testing.assert_close(out.elem.double(), want.to(torch.bfloat16).double(), rtol=0, atol=0)


def test_batched_form_and_a_refused_form(charged: tuple[RankSession, list]) -> None:
    """3-D x 3-D: G products of [M, K] x [K, N], scale_a [G, M]. A bias stops in one line."""
    s, _ = charged
    a = torch.ones(G, M, K)
    w = torch.ones(G, N, K)
    sa = torch.full((G, M), 0.5)
    sb = torch.arange(1, G * N + 1).float().reshape(G, N)
    args = [_sim(a.to(F8), s), _sim(w.to(F8), s).transpose(-2, -1), _sim(sa, s), _sim(sb, s)]
    with ChargeMode(s):
        out = torch._scaled_grouped_mm(*args)
        if not s.phantom:
            with pytest.raises(NotSimulatedError, match="bias"):
                torch.ops.aten._scaled_grouped_mm.default(*args, bias=_sim(torch.zeros(G, N), s))
    assert tuple(out.shape) == (G, M, N) and out.dtype == torch.bfloat16
    if not s.phantom:
        assert torch.equal(out.elem.float(), (K * 0.5 * sb)[:, None, :].expand(G, M, N))
