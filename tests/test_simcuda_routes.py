"""The compiled mode entry's quick routes (simcuda/routes.py, `_fastop.c`'s `quick_route`): a CUDA program's host op
runs without the Python route, and an op on another subclass's tensors is answered NotImplemented without it; both
as the Python route answers them, against closed forms.

Under the roofline model an element-wise add of two 2^20-element fp32 tensors moves 3 x 4 MiB through HBM: it takes
ceil(12 MiB / bandwidth) ns plus the launch overhead. A host op (once the program has made a cuda tensor) is neither
charged nor counted; a wrapper subclass's add, answered NotImplemented by the mode, runs on its inner tensors, whose
add is charged once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_map

from phantora.perfmodel.gpus import get_gpu
from phantora.perfmodel.hosts import get_host
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime import dispatch, hostwork
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, device, pinned
from phantora.runtime.simcuda import tensor as simtensor

N = 1 << 20
ADD_NS = math.ceil(3 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS


class Boxed(torch.Tensor):
    """A wrapper subclass with its own dispatch (as DTensor): it runs each op on its inner tensors."""

    data_in: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Boxed:
        r = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)
        r.data_in = inner
        return r

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        def unbox(x: Any) -> Any:
            return x.data_in if isinstance(x, Boxed) else x

        out = func(*tree_map(unbox, args), **tree_map(unbox, kwargs or {}))
        return tree_map(lambda x: Boxed(x) if type(x) is torch.Tensor else x, out)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Calls of the Python route's host op and subclass check (module functions: the quick routes stay on)."""
    if compiled.load() is None:
        pytest.skip("the compiled fast path is not built (scripts/setup.sh)")
    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank
    n = {"host_op": 0, "kind": 0}
    host_op, kind = pinned.host_op, dispatch._subclass_kind

    def counted_host_op(*a: Any, **k: Any) -> Any:
        n["host_op"] += 1
        return host_op(*a, **k)

    def counted_kind(types: Any) -> str:
        n["kind"] += 1
        return kind(types)

    monkeypatch.setattr(pinned, "host_op", counted_host_op)
    monkeypatch.setattr(dispatch, "_subclass_kind", counted_kind)
    yield n


def _mode() -> ChargeMode:
    session = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none", phantom=False)
    return ChargeMode(session)


def test_a_cuda_programs_host_ops_run_without_the_python_route(
    counts: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simtensor, "_seen", True)
    mode = _mode()
    s = mode.session
    a, b = torch.ones(N), torch.full((N,), 2.0)
    step = torch.tensor(0.0)
    with mode:
        start, base, ops = s.clock.compute_ns, s.memory.current, s.ops
        c = torch.add(a, b)
        step += 1  # Adam's step count on the host
        v = step.item()
        assert counts["host_op"] == 0 and s.clock.compute_ns == start and s.memory.current == base and s.ops == ops
        pinned_buf = torch.empty(4, pin_memory=True)  # pinning is answered by the Python route (pinned.py)
        assert counts["host_op"] == 1 and pinned_buf.is_pinned() and counts["host_op"] == 2
    assert c[0].item() == 3.0 and v == 1.0


def test_with_the_host_modelled_host_ops_take_the_python_route(
    counts: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """PHANTORA_HOST_COMPUTE=on: every host op is timed on the target host (runtime/hostwork.py), so none is quick."""
    monkeypatch.setattr(simtensor, "_seen", True)
    mode = _mode()
    s = mode.session
    s.host = hostwork.HostModel(get_host("dgx-h100"), 8, get_gpu("h100").host_bw, 1)
    a = torch.ones(N)
    with mode:
        torch.add(a, a)
    assert counts["host_op"] == 1 and s.host_work_ns > 0


def test_another_subclass_is_answered_not_implemented_and_its_inner_op_charged(
    counts: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simtensor, "_seen", False)  # a program that has made no cuda tensor (gpt_fsdp.py)
    mode = _mode()
    s = mode.session
    a, b = Boxed(torch.ones(N)), Boxed(torch.full((N,), 2.0))
    with mode:
        start = s.clock.compute_ns
        c = torch.add(a, b)  # the mode first (NotImplemented), then Boxed's dispatch, then the inner add
        d = torch.add(c, b)
        assert s.clock.compute_ns - start == 2 * ADD_NS and s.ops == 2
    assert type(d) is Boxed and d.data_in[0].item() == 5.0
    assert counts["kind"] <= 1  # at most routes.type_kind's first look at Boxed; the Python route looks per op
