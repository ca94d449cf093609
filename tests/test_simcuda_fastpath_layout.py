"""The simulated GPU's fast path keys a bf16 matrix product by the operand layout the calibrated model reads.

cuBLAS's fast tensor-core kernels need each operand's contiguous extent, leading dimension and base pointer on the
16-byte grid (cuBLAS docs 2.1.11; perfmodel/gemm_layout.py): an operand that breaks it costs 155.9/111.3 more
(pytorch#181718's aligned against align1 kernels), whatever the call asked before at the same shapes. Each
[1024, 1024] x [1024, 1024] bf16 mm below is asked through the fast path (compiled and Python) in one model, the
aligned layouts first: the aligned ones cost the same, the unaligned ones the published ratio more, and each costs
what the general route (`Calibrated.cost`, keyed by the exact strides and offsets) and a fresh model give. Asked
again, every one is answered from the fast path's own cache (`keyed`, read before any call into the model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.runtime.compute import Calibrated
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import fastpath
from phantora.runtime.simcuda.tensor import SimCudaTensor

N = 1024
UNALIGNED = 155.9 / 111.3  # pytorch#181718: the aligned kernel's TFLOP/s over the align1 kernels' mean
MM = torch.ops.aten.mm.default


def _at(offset: int, size: tuple[int, int], stride: tuple[int, int]) -> torch.Tensor:
    """A bf16 meta tensor of `size` and `stride` at storage offset `offset` (elements)."""
    base = torch.empty(offset + size[0] * stride[0] + size[1] * stride[1], device="meta", dtype=torch.bfloat16)
    return base.as_strided(size, stride, offset)


# A as laid out, and whether cuBLAS gets it on the 16-byte grid (bf16: 8 elements)
LAYOUTS: dict[str, tuple[Callable[[], torch.Tensor], bool]] = {
    "contiguous": (lambda: _at(0, (N, N), (N, 1)), True),
    "transposed view": (lambda: _at(0, (N, N), (1, N)), True),
    "contiguous at 16 bytes": (lambda: _at(8, (N, N), (N, 1)), True),
    "contiguous at 32 bytes": (lambda: _at(16, (N, N), (N, 1)), True),
    "rows of 1032": (lambda: _at(0, (N, N), (N + 8, 1)), True),
    "contiguous at 8 bytes": (lambda: _at(4, (N, N), (N, 1)), False),
    "rows of 1028": (lambda: _at(0, (N, N), (N + 4, 1)), False),
    "transposed, columns of 1030": (lambda: _at(0, (N, N), (1, N + 6)), False),
    "rows of 1032 at 2 bytes": (lambda: _at(1, (N, N), (N + 8, 1)), False),
}


def _session(model: Calibrated) -> tuple[RankSession, list[Any]]:
    session = RankSession(0, 1, NoNetworkClient(), model, trace_level="none", phantom=True)
    session.report_every_ns = 1 << 62
    costs: list[Any] = []
    session.charge = lambda name, cost: costs.append(cost)  # type: ignore[method-assign]
    return session, costs


def _mm_ns(op: Any, session: RankSession, costs: list[Any], a: torch.Tensor) -> int:
    b = SimCudaTensor(_at(0, (N, N), (N, 1)), 0)
    assert op(session, MM, (SimCudaTensor(a, 0), b), {}) is not fastpath.SLOW
    return costs[-1].ns - session.model.launch_ns


@pytest.mark.parametrize("route", ["compiled", "python"])
def test_fast_path_keys_a_bf16_mm_by_the_layout_the_model_reads(route: str) -> None:
    op = fastpath.device_op if route == "compiled" else fastpath.python_device_op
    if route == "compiled" and op is fastpath.python_device_op:
        pytest.skip("the compiled fast path is not built")
    model = Calibrated(get_gpu("h100"))
    session, costs = _session(model)
    got = {name: _mm_ns(op, session, costs, make()) for name, (make, _) in LAYOUTS.items()}
    aligned = got["contiguous"]
    for name, (make, on_grid) in LAYOUTS.items():
        assert got[name] / aligned == pytest.approx(1.0 if on_grid else UNALIGNED, rel=2e-3), name
        fresh, fresh_costs = _session(Calibrated(get_gpu("h100")))
        assert _mm_ns(op, fresh, fresh_costs, make()) == got[name], name
        a = make()
        general = model.cost(MM, (a, _at(0, (N, N), (N, 1))), {}, torch.empty(N, N, device="meta")).ns
        assert general - model.launch_ns == got[name], name

    def no_model(*args: Any) -> Any:
        raise AssertionError("the fast path asked the model for a cost it had cached")

    for method in ("cost_keyed", "cost_for", "cost", "compute"):
        setattr(model, method, no_model)
    for name, (make, _) in LAYOUTS.items():
        assert _mm_ns(op, session, costs, make()) == got[name], name
