"""The output wrapper of the simulated GPU's fast path (`simcuda.tensor.wrap_output`) carries its data's metadata.

It passes `_make_wrapper_subclass` the strides only when they differ from the contiguous ones torch computes for
the shape; the wrapper must still report exactly its data's shape, strides, storage offset and dtype, and the
device it was given, in every case where those strides differ from the shape's: a transposed view, a broadcast
(stride 0), a dimension of size 1 with an unusual stride, an empty tensor, a 0-dim tensor, and a sliced view with
a storage offset (the constructor's way). Torch's own tensor is the reference.
"""

from __future__ import annotations

import pytest
import torch

from phantora.runtime.simcuda.tensor import SimCudaTensor, _contiguous_strides, wrap_output

_BASE = torch.arange(24.0).reshape(2, 3, 4)
CASES = {
    "contiguous": _BASE,
    "transposed": _BASE.transpose(0, 2),
    "broadcast": torch.ones(3, 1).expand(3, 5),
    "size-1 stride": torch.empty(4, 1).t(),  # shape (1, 4), strides (1, 1): contiguous, not the default strides
    "empty": torch.empty(0, 3),
    "0-dim": torch.tensor(2.0),
    "bf16": torch.zeros(5, 7, dtype=torch.bfloat16),
    "offset view": _BASE[1],
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("index", [0, 3])
def test_wrapper_reports_its_datas_metadata(name: str, index: int) -> None:
    elem = CASES[name]
    w = wrap_output(elem, index, elem.shape, elem.dtype)
    assert type(w) is SimCudaTensor and w.elem is elem and w._sim_index == index
    assert w.shape == elem.shape and w.stride() == elem.stride() and w.dtype == elem.dtype
    assert w.storage_offset() == elem.storage_offset()
    assert w.device == torch.device("cuda", index) and not w.requires_grad


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (0, 3), (3, 0, 2), (1, 4), (4, 1, 1)])
def test_contiguous_strides_are_torchs(shape: tuple[int, ...]) -> None:
    assert _contiguous_strides(torch.Size(shape)) == torch.empty(shape).stride()
