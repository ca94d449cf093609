"""Matrix products with ``out_dtype`` on the simulated GPU (simcuda/cuda_only.py `OUT_DTYPE_PRODUCTS`): torch has
CUDA kernels only for ``aten.mm.dtype`` and the other ``.dtype`` / ``.dtype_out`` overloads (bf16 operands, fp32
result), which TRL's chunked log-probability loss calls; on the data they are the fp32 product of the operands'
values, and each is charged as one matrix product of 2 M N K FLOPs."""

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

M, K, N = 6, 8, 5


@pytest.fixture
def charged(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    yield from charged_session(monkeypatch, False, Roofline(get_gpu("h100"), launch_ns=DEFAULT_LAUNCH_NS))


def test_products_with_out_dtype_are_the_fp32_products(charged: tuple[RankSession, list]) -> None:
    s, seen = charged
    torch.manual_seed(0)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    acc = torch.randn(M, N)
    want_mm = a.double() @ b.double()
    want_addmm = acc.double() + want_mm
    sa, sb, sacc, sa3, sb3 = (SimCudaTensor(x, 0) for x in (a, b, acc.clone(), a.unsqueeze(0), b.unsqueeze(0)))
    with ChargeMode(s):
        product = torch.mm(sa, sb, out_dtype=torch.float32)
        torch.addmm(sacc, sa, sb, out_dtype=torch.float32, out=sacc)  # TRL's `_addmm_fp32`
        batched = torch.bmm(sa3, sb3, out_dtype=torch.float32)
    assert product.dtype == torch.float32 and batched.shape == (1, M, N)
    assert (product.elem.double() - want_mm).abs().max() < 1e-5  # fp32 sums of exact bf16 products
    assert (sacc.elem.double() - want_addmm).abs().max() < 1e-5
    assert (batched.elem[0].double() - want_mm).abs().max() < 1e-5
    names = [name for name, _ in seen]
    assert names == ["aten.mm", "aten.addmm", "aten.bmm"]
    assert [cost.flops for _, cost in seen] == [2 * M * N * K] * 3
