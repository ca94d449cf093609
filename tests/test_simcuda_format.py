"""A tensor on the simulated GPU formats as torch formats a CUDA tensor, in one process.

torch's `Tensor.__format__` formats a 0-dim tensor as its number only when its type is exactly `Tensor`; a subclass
falls to `object.__format__`, which refuses any format spec. DeepSpeed's pipeline engine logs each batch's loss with
`f"{self.agg_train_loss:0.4f}"` (`runtime/pipe/engine.py`, `train_batch`), and stopped there with "unsupported format
string passed to SimCudaTensor.__format__". On a GPU that line prints the number.
"""

from __future__ import annotations

import pytest
import torch

from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.simcuda.tensor import SimCudaTensor


def test_a_scalar_on_the_simulated_gpu_formats_as_its_number(charge_mode: ChargeMode) -> None:
    with charge_mode:
        loss = SimCudaTensor(torch.tensor(2.718281828), 0)
        half = SimCudaTensor(torch.tensor(0.5, dtype=torch.bfloat16), 0)
        count = SimCudaTensor(torch.tensor(42), 0)
        assert f"{loss:0.4f}" == "2.7183" and f"{loss:.2e}" == "2.72e+00"
        assert f"{half:0.3f}" == "0.500" and f"{count:5d}" == "   42"
        assert f"{loss}" == str(torch.tensor(2.718281828).item())  # a plain tensor's, no spec: the number too


def test_a_tensor_of_more_elements_still_refuses_a_spec_as_torch_does(charge_mode: ChargeMode) -> None:
    with charge_mode:
        t = SimCudaTensor(torch.ones(3), 0)
        with pytest.raises(TypeError):
            format(t, "0.4f")
        assert "simulated cuda:0" in f"{t}"  # no spec: its repr, as torch's str()
