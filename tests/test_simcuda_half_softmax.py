"""An fp16 softmax with an fp32 output is one CUDA kernel on the simulated GPU (simcuda/cuda_only.py HALF_TO_FLOAT).

On a cuda tensor, `F.softmax(x, dim, dtype=torch.float32)` and `F.log_softmax` of an fp16 `x` call
``aten._softmax(x, dim, half_to_float=True)`` (ATen's SoftMax.cpp), and so does fp16 autocast's softmax, which it runs
in fp32: `nn.MultiheadAttention`'s weights under `torch.autocast("cuda", torch.float16)` (pytorch/examples'
minGPT-ddp). The CPU kernel refuses it ("softmax with half to float conversion is not supported on CPU"), so real mode
stopped there. Closed forms: the values are the fp32 (log-)softmax of the fp16 input; the kernel reads 2 B and writes
4 B an element (roofline: bytes over HBM bandwidth plus the launch); the backward reads the fp32 gradient and output
and writes the fp16 input's gradient, g - y * sum(g) for log-softmax and y * (g - sum(g * y)) for softmax.
"""

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
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session

ROWS, D = 64, 1024
N = ROWS * D
H100 = get_gpu("h100")
aten = torch.ops.aten


def _roofline_ns(nbytes: int) -> int:
    return math.ceil(nbytes / H100.mem_bw * 1e9) + DEFAULT_LAUNCH_NS


@pytest.fixture(params=[False, True], ids=["real", "phantom"])
def charged(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    """A rank's session under the roofline, in real and in phantom mode (meta data), and the (name, cost) of every
    op it charges."""
    yield from charged_session(monkeypatch, request.param, Roofline(H100, launch_ns=DEFAULT_LAUNCH_NS))


@pytest.mark.parametrize("log", [False, True])
def test_fp16_to_fp32_softmax_is_one_kernel_with_the_closed_form(
    charged: tuple[RankSession, list[tuple[str, int]]], log: bool
) -> None:
    s, seen = charged
    phantom = s.phantom
    torch.manual_seed(0)
    host = torch.randn(ROWS, D).half()
    x = SimCudaTensor(host.to("meta") if phantom else host, 0)
    fn = torch.nn.functional.log_softmax if log else torch.nn.functional.softmax
    with ChargeMode(s):
        y = fn(x, -1, dtype=torch.float32)
    name = "aten._log_softmax" if log else "aten._softmax"
    assert [(n, c.ns) for n, c in seen] == [
        (name, _roofline_ns(2 * N + 4 * N))
    ]  # fp16 in, fp32 out: one kernel, no cast of its own
    assert y.device == torch.device("cuda", 0) and y.dtype == torch.float32 and y.shape == (ROWS, D)
    if not phantom:
        xd = host.double()
        want = xd - xd.logsumexp(-1, keepdim=True)
        torch.testing.assert_close(y.elem.double(), want if log else want.exp(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("log", [False, True])
def test_its_backward_gives_the_fp16_gradient_in_one_kernel(
    charged: tuple[RankSession, list[tuple[str, int]]], log: bool
) -> None:
    s, seen = charged
    torch.manual_seed(1)
    xd = torch.randn(ROWS, D).half().double()
    out = xd - xd.logsumexp(-1, keepdim=True)
    if not log:
        out = out.exp()
    grad = torch.randn(ROWS, D, dtype=torch.float64)
    op = aten._log_softmax_backward_data.default if log else aten._softmax_backward_data.default
    g, y = (SimCudaTensor(t.float().to("meta") if s.phantom else t.float(), 0) for t in (grad, out))
    with ChargeMode(s):
        dx = op(g, y, -1, torch.float16)
    assert [(n, c.ns) for n, c in seen] == [(str(op.overloadpacket), _roofline_ns(4 * N + 4 * N + 2 * N))]
    assert dx.dtype == torch.float16 and dx.device == torch.device("cuda", 0)
    if s.phantom:
        return
    if log:
        want = grad - out.exp() * grad.sum(-1, keepdim=True)
    else:
        want = out * (grad - (grad * out).sum(-1, keepdim=True))
    torch.testing.assert_close(dx.elem.double(), want.half().double(), rtol=2e-3, atol=2e-3)


def test_without_a_conversion_the_cpu_kernel_runs_as_before(charged: tuple[RankSession, list[tuple[str, int]]]) -> None:
    """An fp32 softmax (and an fp16 one to fp16) keeps the op's own kernel: 8 B and 4 B an element."""
    s, seen = charged
    hosts = (torch.randn(ROWS, D), torch.randn(ROWS, D).half())
    x32, x16 = (SimCudaTensor(t.to("meta") if s.phantom else t, 0) for t in hosts)
    with ChargeMode(s):
        y32, y16 = torch.softmax(x32, -1), torch.softmax(x16, -1)
    assert [(n, c.ns) for n, c in seen] == [
        ("aten._softmax", _roofline_ns(8 * N)),
        ("aten._softmax", _roofline_ns(4 * N)),
    ]
    assert (y32.dtype, y16.dtype) == (torch.float32, torch.float16)
    if s.phantom:
        return
    torch.testing.assert_close(y16.elem.float(), torch.softmax(x16.elem.float(), -1), rtol=2e-3, atol=2e-3)
