"""A tensor on the simulated GPU answers `data_ptr()` with its data's address, as `untyped_storage()` gives its data's
storage, in one process.

A wrapper tensor has no storage of its own, so `data_ptr()` answered 0 while `untyped_storage().data_ptr()` (which
phantora answers with the data's storage, for HF's tied-weight checks) gave the host address. safetensors checks that
every tensor of a state dict covers its storage (`data_ptr() == untyped_storage().data_ptr()`, `_is_complete`) before
it loads into a model (`safetensors.torch.load_model`), so Accelerate's `load_state` of a model on the simulated GPU
(accelerate's complete_nlp_example.py `--resume_from_checkpoint`) stopped with "found no suitable name to keep for
saving amongst: {'bert.embeddings.word_embeddings.weight'}. None is covering the entire storage".
"""

from __future__ import annotations

import pytest
import torch

from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.simcuda.tensor import SimCudaTensor


def test_data_ptr_is_the_datas_address_and_a_view_is_offset_into_it(charge_mode: ChargeMode) -> None:
    with charge_mode:
        data = torch.arange(40, dtype=torch.float32).reshape(10, 4)
        t, row = SimCudaTensor(data, 0), SimCudaTensor(data[3], 0)
        assert t.data_ptr() != 0 and t.data_ptr() == t.untyped_storage().data_ptr()
        assert row.data_ptr() == t.data_ptr() + 3 * 4 * 4  # 3 rows of 4 fp32 in
        assert row.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


def test_safetensors_finds_each_tensor_of_a_state_dict_whole(charge_mode: ChargeMode) -> None:
    """safetensors' check of a state dict before `load_model` loads it (and `save_model` saves it): every tensor covers
    its storage. (A tied pair's check slices the tensors, which needs a rank's device guard: docs/runtime.md's user
    trials resume such a model.)"""
    st = pytest.importorskip("safetensors.torch")
    with charge_mode:
        state = {"embed.weight": SimCudaTensor(torch.randn(16, 8), 0), "head.bias": SimCudaTensor(torch.zeros(16), 0)}
        assert all(st._is_complete(t) for t in state.values())
        assert st._remove_duplicate_names(state) == {}  # before: "None is covering the entire storage"
