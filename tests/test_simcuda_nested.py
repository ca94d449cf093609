"""A nested tensor made from simulated-GPU tensors stops the run in one line naming the workaround (cuda_only.py).

`nn.TransformerEncoder` in eval mode under `no_grad` with a padding mask takes torch's inference fast path, which packs
the batch into a nested tensor (`torch._nested_tensor_from_mask`). The simulated GPU's tensor is a wrapper of one
shape, and wrapping the nested result failed inside torch ("Internal error: NestedTensorImpl doesn't support sizes.
Please file an issue."). It is now refused before it runs, naming `enable_nested_tensor=False` (with which the same
encoder's fast path runs on the padded batch, the CPU's values) and `torch.backends.mha.set_fastpath_enabled(False)`.
"""

from __future__ import annotations

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.runtime import session as session_module
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import device
from phantora.runtime.simcuda.devices import NotSimulatedError
from phantora.runtime.simcuda.tensor import SimCudaTensor


def test_a_nested_tensor_on_the_simulated_gpu_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_installed", True)
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    session_module.install(s)
    try:
        x = SimCudaTensor(torch.randn(2, 5, 8), 0)
        keep = SimCudaTensor(torch.tensor([[True] * 5, [True] * 3 + [False] * 2]), 0)
        with ChargeMode(s), pytest.raises(NotSimulatedError) as err:
            torch._nested_tensor_from_mask(x, keep)
    finally:
        session_module.install(None)
    text = str(err.value)
    assert "\n" not in text and text.startswith("aten._nested_tensor_from_mask.default makes a nested tensor")
    assert "enable_nested_tensor=False" in text and "torch.backends.mha.set_fastpath_enabled(False)" in text
