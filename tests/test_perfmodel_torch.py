"""The torch adapter: dispatched aten ops (on meta tensors) become the right calls and costs."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from phantora.perfmodel import compute_features, predict_ns
from phantora.perfmodel.torch_adapter import CalibratedModel, call_of

aten = torch.ops.aten


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_mm_call_and_cost():
    a, b = meta(512, 256), meta(256, 1024)
    out = aten.mm.default(a, b)
    call = call_of(aten.mm.default, (a, b), {}, out)
    assert call.op == "aten::mm" and call.shapes == ((512, 256), (256, 1024)) and call.dtypes == ("bfloat16",) * 2
    assert compute_features(call).flops == 2 * 512 * 1024 * 256
    model = CalibratedModel("h100")
    assert model.op_time_ns(aten.mm.default, (a, b), {}, out) == predict_ns(
        "aten::mm", [(512, 256), (256, 1024)], ["bf16", "bf16"], "h100"
    )


def test_reduction_over_a_dim_counts_its_real_output():
    x = meta(4096, 1024, dtype=torch.float32)
    out = aten.sum.dim_IntList(x, [0])
    f = compute_features(call_of(aten.sum.dim_IntList, (x, [0]), {}, out))
    assert f.op_class == "reduction" and f.bytes == 4 * (4096 * 1024 + 1024)


def test_attention_and_foreach_arguments():
    q = meta(2, 8, 256, 64)
    res = aten._scaled_dot_product_flash_attention.default(q, q, q, 0.0, True)
    call = call_of(aten._scaled_dot_product_flash_attention.default, (q, q, q, 0.0, True), {}, res)
    assert call.extra["causal"] is True
    assert compute_features(call).flops == 4 * 2 * 8 * 64 * 256 * 257 // 2
    xs = [meta(10, dtype=torch.float32), meta(20, dtype=torch.float32)]
    call = call_of(aten._foreach_mul_.Scalar, (xs, 0.5), {}, None)
    f = compute_features(call)
    assert f.op_class == "foreach" and f.tensors == 2 and f.bytes == 2 * 4 * 30


class _Recorder(TorchDispatchMode):
    def __init__(self, model: CalibratedModel) -> None:
        super().__init__()
        self.model = model
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((str(func), self.model.op_time_ns(func, args, kwargs, out)))
        return out


@pytest.mark.parametrize("gpu", ["a100", "l40s"])
def test_training_step_of_a_small_mlp_costs_every_op(gpu):
    """A forward, backward and AdamW step on meta tensors: every dispatched op gets a time, GEMMs dominate."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    model = model.to(device="meta", dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    rec = _Recorder(CalibratedModel(gpu))
    with rec:
        x = torch.empty(8192, 1024, device="meta", dtype=torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        opt.step()
    names = {n.split(".")[1] for n, _ in rec.ops}
    assert {"addmm", "mm", "gelu", "gelu_backward"} <= names
    assert any(n.startswith("_foreach_") for n in names)
    assert all(ns >= 0 for _, ns in rec.ops)
    gemm = sum(ns for n, ns in rec.ops if n.split(".")[1] in ("addmm", "mm"))
    total = sum(ns for _, ns in rec.ops)
    assert gemm > 0.4 * total  # six 8192x4096x1024 matmuls
