"""The simulated apex (runtime/simcuda/simapex.py, apex_norm.py): apex's norms against their closed forms, and an
installed apex never shadowed."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from phantora.runtime.simcuda import apex_norm, simapex


@pytest.fixture
def fresh_apex(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No apex module imported, and the simulated finder installed, for one test."""
    for name in [m for m in sys.modules if m == "apex" or m.startswith("apex.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    simapex.install()
    yield
    for name in [m for m in sys.modules if m == "apex" or m.startswith("apex.")]:
        del sys.modules[name]


def test_megatron_imports_resolve(fresh_apex: None) -> None:
    """What Megatron-core's guards import: `apex`, FusedLayerNormAffineFunction (its forward's argument names are
    probed), apex.normalization's modules; what a build without those extensions lacks does not import."""
    import inspect

    import apex  # noqa: F401
    from apex.normalization import FusedLayerNorm, FusedRMSNorm  # noqa: F401
    from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction, fused_layer_norm_affine  # noqa: F401

    args = inspect.getfullargspec(FusedLayerNormAffineFunction.forward).args
    assert args == ["ctx", "input", "weight", "bias", "normalized_shape", "eps", "memory_efficient"]
    for missing in ("apex.optimizers", "amp_C", "apex.multi_tensor_apply", "apex.contrib.layer_norm.layer_norm"):
        with pytest.raises(ImportError):
            importlib.import_module(missing)
    assert simapex.simulated_packages() == ["apex"]


def test_installed_apex_is_not_shadowed(fresh_apex: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "apex").mkdir()
    (tmp_path / "apex" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    apex = importlib.import_module("apex")
    assert getattr(apex, "REAL", False) and not hasattr(apex, "__phantora_simulated__")


def test_layer_norm_is_the_closed_form() -> None:
    """y = (x - mean) / sqrt(var + eps) * w + b over the last dimension (biased variance)."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64), torch.randn(16)
    b = b.double()
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    want = (x - mean) / torch.sqrt(var + 1e-5) * w + b
    got = apex_norm.fused_layer_norm_affine(x, w, b, (16,), 1e-5)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_rms_norm_is_the_closed_form() -> None:
    """y = x / sqrt(mean(x^2) + eps) * w."""
    torch.manual_seed(1)
    x, w = torch.randn(4, 2, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    want = x / torch.sqrt(x.pow(2).mean((-2, -1), keepdim=True) + 1e-6) * w
    torch.testing.assert_close(apex_norm.fused_rms_norm_affine(x, w, (2, 8), 1e-6), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("affine", [True, False])
def test_backward_kernels_are_the_derivative(affine: bool) -> None:
    """Each Function's backward against finite differences (float64)."""
    torch.manual_seed(2)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    if affine:
        assert torch.autograd.gradcheck(
            lambda x, w, b: apex_norm.fused_layer_norm_affine(x, w, b, (6,), 1e-5), (x, w, b)
        )
        assert torch.autograd.gradcheck(lambda x, w: apex_norm.fused_rms_norm_affine(x, w, (6,), 1e-5), (x, w))
    else:
        assert torch.autograd.gradcheck(lambda x: apex_norm.fused_layer_norm(x, (6,), 1e-5), (x,))
        assert torch.autograd.gradcheck(lambda x: apex_norm.fused_rms_norm(x, (6,), 1e-5), (x,))


def test_modules_initialise_as_apex() -> None:
    """Weight ones, bias zeros; the mixed-dtype norm returns the parameters' dtype."""
    ln = apex_norm.FusedLayerNorm(8)
    assert torch.equal(ln.weight, torch.ones(8)) and torch.equal(ln.bias, torch.zeros(8))  # type: ignore[arg-type]
    assert apex_norm.FusedRMSNorm([2, 4]).weight.shape == (2, 4)  # type: ignore[union-attr]
    assert apex_norm.MixedFusedLayerNorm(8)(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.float32


def test_modules_without_affine_have_no_parameters_and_mixed_rms_casts() -> None:
    """elementwise_affine=False: no parameters, the plain closed forms; MixedFusedRMSNorm returns the weight's dtype,
    the RMS of a bf16 input taken in fp32: x / sqrt(mean(x^2) + eps)."""
    x = torch.randn(3, 8, dtype=torch.float64)
    ln, rms = apex_norm.FusedLayerNorm(8, elementwise_affine=False), apex_norm.FusedRMSNorm(8, 1e-6, False)
    assert list(ln.parameters()) == [] and list(rms.parameters()) == [] and not hasattr(rms, "bias")
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(ln(x), (x - mean) / torch.sqrt(var + 1e-5), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rms(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), rtol=1e-12, atol=1e-12)
    xb = torch.randn(2, 8, dtype=torch.bfloat16)
    mixed = apex_norm.MixedFusedRMSNorm(8, 1e-6)
    xf = xb.float()
    want = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    got = mixed(xb)
    assert got.dtype == torch.float32 and [n for n, _ in mixed.named_parameters()] == ["weight"]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


SCRIPT = Path(__file__).resolve().parent / "scripts" / "cuda_apex_norms.py"


@pytest.mark.slow
def test_apex_norms_on_the_simulated_gpu(tmp_path: Path) -> None:
    """A rank's `import apex` gets the simulated apex (said in results.json); its norms give the closed forms'
    values and gradients, and each norm kernel is charged once: LayerNorm forward and backward, RMSNorm forward and
    backward (torch's fused ops, as a CUDA build runs them: cuda_only.py)."""
    from phantora.launcher import RunConfig, launch

    out, run = tmp_path / "seen.json", tmp_path / "run"
    launch(RunConfig(str(SCRIPT), [str(out)], "testbed16", nproc=1, timeout_s=300, out_dir=str(run)))
    seen = json.loads(out.read_text())
    assert seen["simulated"] is True and seen["device"] == "cuda:0"
    for key in ("ln_error", "ln_grad_error", "rms_error", "rms_grad_error"):
        assert seen[key] < 1e-5, key
    events = json.loads((run / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [e["name"] for e in events if e.get("ph") == "X"]
    kernels = ("aten.native_layer_norm", "aten.native_layer_norm_backward")
    for kernel in (*kernels, "aten._fused_rms_norm", "aten._fused_rms_norm_backward"):
        assert names.count(kernel) == 1, kernel
    assert json.loads((run / "results.json").read_text())["simulated_packages"] == ["apex"]
