"""Indexing a simulated-GPU tensor with a Python list (`x[[1, 5]]`, `x[:, [0, 2]] = 0`), as a CUDA tensor takes it.

torch turns a list (or numpy array) index into an index tensor in C++ (python_variable_indexing.cpp,
`sequenceToVariable`): it builds the tensor on the host and moves it to the indexed tensor's device with the
Python dispatch key excluded, so the move reached this CPU build's missing CUDA kernels past phantora's simulated
GPU ("Could not run 'aten::empty_strided' with arguments from the 'CUDA' backend"). `SimCudaTensor.__getitem__` and
`__setitem__` make each such index the tensor torch would, from Python: a bool (or uint8) index as it is, any other
as int64, copied to the device (the copy a GPU makes too, charged as a host-to-device transfer), then index as torch
does. A list that torch reads as a tuple of indices (one holding a list, a slice, None, Ellipsis or a tensor, shorter
than 32: NumPy's rule, deprecated) stays a list, its items converted, so torch still reads it so and warns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_KEPT = (torch.bool, torch.uint8)  # the dtypes torch keeps for an index list; others become int64
SEQUENCES = frozenset({list, tuple, np.ndarray})  # the index types that may hold a list (a cheap first test)


def needs_conversion(index: Any) -> bool:
    """Does `index` hold a list or numpy array (at the top, or as an item of a tuple)?"""
    kind = type(index)
    if kind is list or kind is np.ndarray:
        return True
    if kind is tuple:
        for i in index:  # a loop, not any() of a generator: every tuple index of a cuda tensor comes here
            if type(i) is list or type(i) is np.ndarray:
                return True
    return False


def on_device(index: Any, device: torch.device) -> Any:
    """`index` with each list or numpy array in it made an index tensor on `device`, as torch makes it."""
    if type(index) is tuple:
        return tuple(_tensor(i, device) for i in index)
    if type(index) is list and _read_as_tuple(index):
        return [_tensor(i, device) for i in index]
    return _tensor(index, device)


def _read_as_tuple(index: list) -> bool:
    """torch's `treatSequenceAsTuple` for a list: fewer than 32 items, one of them a sequence, slice, None,
    Ellipsis or tensor."""
    if len(index) >= 32:
        return False
    return any(
        isinstance(i, (list, tuple, slice, torch.Tensor, np.ndarray)) or i is None or i is Ellipsis for i in index
    )


def _tensor(index: Any, device: torch.device) -> Any:
    if type(index) is not list and type(index) is not np.ndarray:
        return index
    host = torch.as_tensor(index) if type(index) is np.ndarray else torch.tensor(index)
    if host.dtype not in _KEPT:
        host = torch.tensor(index, dtype=torch.long) if type(index) is list else host.long()
    return host.to(device)
