"""A rank's session installed in the test's own process, each charge recorded: the set-up that the simulated
device's op tests share, on real data or in phantom mode (the simulated tensors' data on the meta device)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from phantora.runtime import session as session_module
from phantora.runtime.compute import OpCost
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import device, tensor


def charged_session(
    monkeypatch: pytest.MonkeyPatch, phantom: bool, model: Any
) -> Iterator[tuple[RankSession, list[tuple[str, OpCost]]]]:
    """Yield a one-rank session timed by `model` and the (op name, cost) of each charge it is given, in order."""
    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank (no device guard here)
    if phantom:
        monkeypatch.setattr(tensor, "_inner_device", torch.device("meta"))
    s = RankSession(0, 1, NoNetworkClient(), model, trace_level="none", phantom=phantom)
    seen: list[tuple[str, OpCost]] = []
    charge = s.charge
    monkeypatch.setattr(s, "charge", lambda name, cost: (seen.append((name, cost)), charge(name, cost))[1])
    session_module.install(s)
    try:
        yield s, seen
    finally:
        session_module.install(None)
