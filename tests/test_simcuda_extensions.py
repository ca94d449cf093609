"""The CUDA extensions the simulated GPU provides as torch ops (phantora/runtime/simcuda/extensions.py), against
independent implementations: DeepSpeed's `fused_adam.multi_tensor_adam` against torch.optim's Adam and AdamW."""

from __future__ import annotations

import pytest
import torch

from phantora.runtime.simcuda.extensions import multi_tensor_adam, provided

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.99), 1e-8, 0.1


def torch_reference(params: list[torch.Tensor], grads: list[list[torch.Tensor]], decoupled: bool) -> list[torch.Tensor]:
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls(ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    for step_grads in grads:
        for p, g in zip(ps, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in ps]


def kernel_steps(params: list[torch.Tensor], grads: list[list[torch.Tensor]], mode: int) -> list[torch.Tensor]:
    ps = [p.clone() for p in params]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    fused = provided("fused_adam")
    for step, step_grads in enumerate(grads, start=1):
        gs = [g.to(p.dtype) for g, p in zip(step_grads, ps, strict=True)]
        fused.multi_tensor_adam(
            2048, torch.zeros(1, dtype=torch.int), [gs, ps, ms, vs], LR, *BETAS, EPS, step, mode, 1, WD
        )
    return ps


@pytest.mark.parametrize(("mode", "decoupled"), [(0, False), (1, True)])
def test_multi_tensor_adam_is_torchs_adam(mode: int, decoupled: bool) -> None:
    """mode 0: Adam with L2 decay (torch.optim.Adam's weight_decay); mode 1: AdamW's decoupled decay. Five steps."""
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(7, 5, generator=g), torch.randn(3, generator=g)]
    grads = [[torch.randn_like(p) for p in params] for _ in range(5)]
    want = torch_reference(params, grads, decoupled)
    got = kernel_steps(params, grads, mode)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got[0], params[0])  # the step moved the parameters


def test_half_precision_tensors_are_updated_in_fp32() -> None:
    """bf16 parameters, gradients and moments: the fp32 reference's result at bf16's precision."""
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(64, generator=g).bfloat16()]
    grads = [[torch.randn(64, generator=g)] for _ in range(3)]
    got = kernel_steps(params, grads, 1)
    want = torch_reference([params[0].float()], [[x.bfloat16().float() for x in s] for s in grads], True)
    assert got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0].float(), want[0], rtol=2e-2, atol=2e-2)


def test_an_unknown_extension_is_not_provided() -> None:
    assert provided("fused_lamb") is None and provided("fused_adam") is not None
    assert multi_tensor_adam is provided("fused_adam").multi_tensor_adam
