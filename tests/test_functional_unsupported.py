"""A functional collective (torch.ops._c10d_functional, as DTensor and torch.compile issue) that phantora does not
simulate ends in phantora's one-line NotSimulatedError naming the op and the ones it does simulate, never a bare
NotImplementedError; so does a reduce op it does not know."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phantora.runtime import functional
from phantora.runtime.simcuda.devices import NotSimulatedError


def test_an_unknown_functional_collective_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(functional, "_group", lambda name: object())  # as if the group were phantora's
    func = SimpleNamespace(overloadpacket=SimpleNamespace(__name__="reduce_scatter_v"))
    with pytest.raises(NotSimulatedError) as got:
        functional.run(SimpleNamespace(), func, ("x", "group0"), {})  # type: ignore[arg-type]
    text = str(got.value)
    assert not isinstance(got.value, NotImplementedError) and "\n" not in text
    assert "torch.ops._c10d_functional.reduce_scatter_v" in text and "all_gather_into_tensor" in text


def test_an_unknown_reduce_op_is_named_in_one_line() -> None:
    assert functional._op("SUM").reduceOp == functional._OPS["sum"]
    with pytest.raises(NotSimulatedError, match="reduce op 'premul_sum'.*sum, avg"):
        functional._rs_opts("premul_sum")
