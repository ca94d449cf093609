"""torch's RMSNorm on the simulated GPU is the one fused kernel each way a CUDA build runs (simcuda/cuda_only.py).

Closed forms: y = x * rstd * w with rstd = (mean(x^2) + eps)^(-1/2) over the normalised dims (in fp32 for half
inputs, eps None the fp32 machine epsilon); the forward is one charged `aten._fused_rms_norm`, costed by the
roofline as the bytes it moves: x and y, the weight, and one fp32 rstd per row, over HBM bandwidth, plus the launch
overhead; its backward `aten._fused_rms_norm_backward` reads the gradient, x, rstd and the weight, and writes dx and
dw. A CPU tensor keeps torch's composite (several ops).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from phantora.errors import InputError
from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime import session as session_module
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import cuda_only, device, torch_release
from phantora.runtime.simcuda.tensor import SimCudaTensor

ROWS, D = 64, 1024
H100 = get_gpu("h100")


def _roofline_ns(nbytes: int) -> int:
    return math.ceil(nbytes / H100.mem_bw * 1e9) + DEFAULT_LAUNCH_NS


@pytest.fixture
def charged(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list[tuple[str, int]]]]:
    """A rank's session under the roofline, as a rank has it (no device guard: no autograd on cuda tensors here),
    and the (name, ns) of every op it charges."""
    monkeypatch.setattr(device, "_installed", True)
    cuda_only.register_fused_rms_norm(torch_release.FUSED_RMS_NORM)
    s = RankSession(0, 1, NoNetworkClient(), Roofline(H100, launch_ns=DEFAULT_LAUNCH_NS), trace_level="none")
    seen: list[tuple[str, int]] = []
    charge = s.charge
    monkeypatch.setattr(s, "charge", lambda name, cost: (seen.append((name, cost.ns)), charge(name, cost))[1])
    session_module.install(s)
    try:
        yield s, seen
    finally:
        session_module.install(None)


def _closed_form(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.double()
    rstd = 1.0 / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * rstd * (w.double() if w is not None else 1.0)
    return y, rstd


@pytest.mark.parametrize("phantom", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_is_one_fused_kernel_with_the_closed_form(
    charged: tuple[RankSession, list[tuple[str, int]]], phantom: bool, dtype: torch.dtype
) -> None:
    s, seen = charged
    torch.manual_seed(0)
    host_x, host_w = torch.randn(ROWS, D).to(dtype), (1 + torch.rand(D)).to(dtype)
    x, w = (SimCudaTensor(t.to("meta") if phantom else t, 0) for t in (host_x, host_w))
    with ChargeMode(s):
        y = torch.nn.functional.rms_norm(x, [D], w, 1e-6)
    size = dtype.itemsize
    assert seen == [("aten._fused_rms_norm", _roofline_ns(2 * ROWS * D * size + D * size + 4 * ROWS))]
    assert y.device == torch.device("cuda", 0) and y.dtype == dtype and y.shape == (ROWS, D)
    if not phantom:
        want, _ = _closed_form(host_x, host_w, 1e-6)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(y.elem.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("phantom", [False, True])
def test_the_fused_op_saves_rstd_and_its_backward_is_one_kernel(
    charged: tuple[RankSession, list[tuple[str, int]]], phantom: bool
) -> None:
    """rstd in fp32, one per row (shape (ROWS, 1)); the backward of that rstd is charged once with its bytes."""
    s, seen = charged
    torch.manual_seed(1)
    host_x, host_w, host_g = torch.randn(ROWS, D), 1 + torch.rand(D), torch.randn(ROWS, D)
    x, w, g = (SimCudaTensor(t.to("meta") if phantom else t, 0) for t in (host_x, host_w, host_g))
    with ChargeMode(s):
        y, rstd = torch.ops.aten._fused_rms_norm(x, [D], w, None)  # eps None: fp32's machine epsilon
        dx, dw = torch.ops.aten._fused_rms_norm_backward(g, x, [D], rstd, w, [True, True])
    assert rstd.shape == (ROWS, 1) and rstd.dtype == torch.float32
    backward_bytes = 3 * 4 * ROWS * D + 2 * 4 * D + 4 * ROWS  # g, x, dx; w, dw; rstd
    assert [n for n, _ in seen] == ["aten._fused_rms_norm", "aten._fused_rms_norm_backward"]
    assert seen[1][1] == _roofline_ns(backward_bytes)
    if not phantom:
        eps = torch.finfo(torch.float32).eps
        want_y, want_rstd = _closed_form(host_x, host_w, eps)
        torch.testing.assert_close(rstd.elem.double(), want_rstd, rtol=1e-6, atol=0)
        torch.testing.assert_close(y.elem.double(), want_y, rtol=1e-5, atol=1e-5)
        # dx = rstd * (g w - x rstd^2 mean(g w x)), dw = sum over rows of g x rstd
        xd, gd, wd = host_x.double(), host_g.double(), host_w.double()
        want_dx = want_rstd * (gd * wd - xd * want_rstd**2 * (gd * wd * xd).mean(-1, keepdim=True))
        torch.testing.assert_close(dx.elem.double(), want_dx, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(dw.elem.double(), (gd * xd * want_rstd).sum(0), rtol=1e-4, atol=1e-4)


def test_a_cpu_tensor_keeps_torchs_composite() -> None:
    """The CUDA kernel is for (simulated) CUDA tensors only: on CPU, autograd still differentiates the composite."""
    cuda_only.register_fused_rms_norm(torch_release.FUSED_RMS_NORM)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.rms_norm(x, [8], w, 1e-6)
    assert type(y.grad_fn).__name__ != "FusedRmsNormBackward0"
    torch.testing.assert_close(y, _closed_form(x.detach(), w.detach(), 1e-6)[0])
    assert torch.autograd.gradcheck(lambda x, w: torch.nn.functional.rms_norm(x, [8], w, 1e-6), (x, w))


SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_rms_norm.py"


@pytest.mark.slow
@pytest.mark.parametrize("tensors", ["real", "phantom"])
def test_a_ranks_rms_norm_forward_and_backward_are_two_kernels(tmp_path: Path, tensors: str) -> None:
    """In a rank, under autograd: torch's nn.RMSNorm and apex's FusedRMSNorm (32 x 256 fp32) each charge exactly two
    kernels, the fused forward and the fused backward, at their roofline closed forms; the values and gradients are
    the closed form's, and torch's autograd node is the fused op's, holding rstd."""
    from phantora.launcher import RunConfig, launch

    out = tmp_path / "seen.json"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, gpu="h100", tensors=tensors,
                     compute_model="roofline", trace="none", timeout_s=300))  # fmt: skip
    seen = json.loads(out.read_text())
    rows, d = 32, 256
    forward = 2 * 4 * rows * d + 4 * d + 4 * rows  # x, y; w; rstd
    backward = 3 * 4 * rows * d + 2 * 4 * d + 4 * rows  # g, x, dx; w, dw; rstd
    want = [
        ["aten._fused_rms_norm", forward, _roofline_ns(forward)],
        ["aten._fused_rms_norm_backward", backward, _roofline_ns(backward)],
    ]
    assert seen["phantom"] is (tensors == "phantom")
    assert seen["torch"]["node"] == "FusedRmsNormBackward0"
    for name in ("torch", "apex"):
        case = seen[name]
        assert case["ops"] == want, name
        assert case["shape"] == [rows, d]
        if tensors == "real":
            for key in ("y_error", "dx_error", "dw_error"):
                assert case[key] < 1e-5, (name, key)
    if tensors == "real":
        assert seen["torch"]["rstd_error"] < 1e-6


@pytest.mark.parametrize(
    ("text", "want"), [("2.5", (2, 5)), ("2.5.1", (2, 5)), ("v2.8.0", (2, 8)), ("2.6.0.dev20241015+cu124", (2, 6))]
)
def test_the_modelled_torch_is_phantora_torch_version(text: str, want: tuple[int, int]) -> None:
    assert torch_release.modelled({torch_release.VAR: text}) == want
    assert torch_release.modelled({}) == tuple(int(p) for p in torch.__version__.split(".")[:2])


def test_a_bad_torch_version_names_the_variable() -> None:
    with pytest.raises(InputError, match="PHANTORA_TORCH_VERSION='two' is not a torch version") as err:
        torch_release.modelled({torch_release.VAR: "two"})
    assert err.value.field == torch_release.VAR


# torch's composite rms_norm (layer_norm.cpp, rms_norm_symint), one aten op each: x^2, its mean over the normalised
# dims, + eps, rsqrt, x * rstd, * weight; a half input is first upcast to fp32 and the result cast back (_to_copy).
COMPOSITE = ["aten.pow", "aten.mean", "aten.add_", "aten.rsqrt", "aten.mul", "aten.mul"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("version", [(2, 5), (2, 8), (2, 9), (2, 13)])
def test_rms_norm_is_fused_from_torch_2_9_and_the_composite_before(
    charged: tuple[RankSession, list[tuple[str, int]]],
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    version: tuple[int, int],
) -> None:
    """torch's CUDA kernel for `_fused_rms_norm` first shipped in 2.9: modelling 2.9 on, RMSNorm is 1 kernel; before
    it, the composite's 6 ops (fp32) or 8 (bf16: the upcast and the cast back), with the same values."""
    s, seen = charged
    monkeypatch.setenv(torch_release.VAR, f"{version[0]}.{version[1]}.0")
    try:
        fused = cuda_only.register_fused_rms_norm()
        torch.manual_seed(2)
        host_x, host_w = torch.randn(ROWS, D).to(dtype), (1 + torch.rand(D)).to(dtype)
        x, w = SimCudaTensor(host_x, 0), SimCudaTensor(host_w, 0)
        with ChargeMode(s):
            y = torch.nn.functional.rms_norm(x, [D], w, 1e-6)
    finally:
        cuda_only.register_fused_rms_norm(torch_release.installed())
    names = [n for n, _ in seen]
    assert fused is (version >= (2, 9))
    if fused:
        assert names == ["aten._fused_rms_norm"]
    else:
        half = dtype == torch.bfloat16
        assert sorted(names) == sorted(COMPOSITE + ["aten._to_copy"] * (2 if half else 0))
        assert len(names) == (8 if half else 6)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.elem.double(), _closed_form(host_x, host_w, 1e-6)[0], rtol=tol, atol=tol)
