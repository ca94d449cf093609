"""The simulated host's CUDA devices: how many, which one is current, and the index a device spec names."""

from __future__ import annotations

from typing import Any

import torch

from phantora.errors import PhantoraError
from phantora.runtime.simcuda import guard


class NotSimulatedError(PhantoraError):
    """A CUDA feature the simulated GPU does not provide; the message names the call and a workaround."""


state: dict[str, Any] = {"count": 1, "current": 0, "gpu": None}  # set by api.install


def index_of(device: Any = None) -> int:
    """The device index of `device` (int, str, torch.device or None: the current device)."""
    if device is None:
        return int(state["current"])
    if isinstance(device, int):
        return device
    placed = getattr(device, "device", None)  # a torch.cuda.Stream or Event: the device it belongs to
    if isinstance(placed, torch.device) and placed.type == "cuda":
        return placed.index or 0
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    return int(state["current"]) if d.index is None else d.index


def current_device() -> int:
    return int(state["current"])


def set_device(device: Any) -> None:
    i = index_of(device)
    if not 0 <= i < state["count"]:
        raise RuntimeError(
            f"CUDA error: invalid device ordinal {i} (the simulated host has {state['count']} GPUs; "
            "its GPU count comes from the topology's GPUs per host)"
        )
    state["current"] = i
    guard.set_current_device(i)
