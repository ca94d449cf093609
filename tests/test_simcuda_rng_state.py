"""`torch.cuda.get_rng_state` on the simulated device answers as CUDA does: a host tensor of 16 bytes (the Philox
seed, then the offset), in phantom mode too, where the default device is `meta` (DTensor's RNG tracker compares
the states it gets, so a phantom state would stop it)."""

from __future__ import annotations

import torch

from phantora.runtime.simcuda import api


def test_the_state_is_16_host_bytes_seed_first_even_with_meta_as_the_default_device() -> None:
    api.manual_seed(1234)
    before = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        state = api.get_rng_state(0)
    finally:
        torch.set_default_device(before)
    assert state.device == torch.device("cpu") and state.dtype == torch.uint8 and state.numel() == 16
    assert int.from_bytes(bytes(state[:8].tolist()), "little") == 1234
