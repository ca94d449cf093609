"""torch's optimizers and `clip_grad_norm_` at their defaults (`foreach=None`) on the simulated GPU take the
multi-tensor foreach kernels, as a CUDA build does (simcuda/device.py): the number of kernels a step launches is then
independent of the number of parameters, where the per-tensor loop launches a fixed number per parameter."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch.optim import optimizer
from torch.utils import _foreach_utils

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import device
from phantora.runtime.simcuda.tensor import SimCudaTensor
from tests.charged_session import charged_session


@pytest.fixture
def charged(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RankSession, list]]:
    for module in (optimizer, _foreach_utils):  # the lists as torch ships them, restored after the test
        monkeypatch.setattr(module, "_foreach_supported_types", list(module._foreach_supported_types))
    device._foreach_takes_simulated_tensors()
    yield from charged_session(monkeypatch, True, Roofline(get_gpu("h100"), launch_ns=DEFAULT_LAUNCH_NS))


def _params(n: int) -> list[torch.Tensor]:
    out = []
    for _ in range(n):
        p = SimCudaTensor(torch.empty(64, 32, device="meta"), 0).requires_grad_()
        p.grad = SimCudaTensor(torch.empty(64, 32, device="meta"), 0)
        out.append(p)
    return out


def _kernels(s: RankSession, seen: list, make: Callable[[list[torch.Tensor]], Callable[[], object]], n: int) -> list:
    """The ops of the second step: the first also makes each parameter's optimizer state, one by one in torch too."""
    step = make(_params(n))
    with ChargeMode(s):
        step()
        seen.clear()
        step()
    return [name for name, _ in seen]


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.AdamW(ps, lr=1e-3).step,
        lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9).step,
        lambda ps: lambda: torch.nn.utils.clip_grad_norm_(ps, 1.0),
    ],
    ids=["adamw", "sgd", "clip_grad_norm"],
)
def test_default_step_takes_the_foreach_kernels(charged: tuple[RankSession, list], make: Callable) -> None:
    s, seen = charged
    assert type(_params(1)[0]) in optimizer._foreach_supported_types  # what torch checks
    few, many = _kernels(s, seen, make, 2), _kernels(s, seen, make, 8)
    assert any(name.startswith("aten._foreach_") for name in few)
    assert len(few) == len(many)  # per-tensor loops would launch 4x as many for 4x the parameters
