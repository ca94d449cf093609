"""torch's own refusal to read a meta tensor's value (a phantom tensor's value asked for where phantora's check does
not see it: DTensor's RNG tracker comparing RNG states under pipeline parallelism) is said in phantora's one line:
the program's call, that phantom tensors have no values, and what to do."""

from __future__ import annotations

import pytest
import torch

from phantora.runtime.unsupported import explain


def test_reading_a_meta_value_is_named_as_phantom_modes_limit() -> None:
    with pytest.raises(RuntimeError) as info:
        state = torch.zeros(16, dtype=torch.uint8, device="meta")
        if not all(state == state):  # as torch.distributed.tensor._random compares RNG states
            pass
    line = explain(info.value)
    assert line is not None and line.startswith("PhantomValueError: `if not all(state == state):")
    assert "Tensor.item() cannot be called on meta tensors" in line and "without --phantom" in line
    assert explain(RuntimeError("some other failure")) is None
