"""The compiled per-op entry (simcuda/_fastop.c) for plain tensors: a program that has made no cuda tensor (a script
written for phantora's CPU stand-in, examples/gpt_ddp.py) has its CPU tensors' ops charged as GPU work, and the entry
charges and counts them without the Python route, against closed forms.

Under the roofline model an element-wise add of two 2^20-element fp32 tensors moves 3 x 4 MiB through HBM: it takes
ceil(12 MiB / bandwidth) ns plus the launch overhead, and its output holds 4 MiB of device memory until it dies; an
in-place add returns its input and allocates nothing; a view costs nothing. Once the program has made a cuda tensor,
CPU tensors are host data: neither charged nor counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, device
from phantora.runtime.simcuda import tensor as simtensor

N = 1 << 20
ADD_NS = math.ceil(3 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS


def _mode(phantom: bool) -> ChargeMode:
    session = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none", phantom=phantom)
    return ChargeMode(session)


@pytest.fixture
def general(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The ops that reach the mode's general (Python) route."""
    if compiled.load() is None:
        pytest.skip("the compiled fast path is not built (scripts/setup.sh)")
    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank
    monkeypatch.setattr(simtensor, "_seen", False)  # no cuda tensor made yet
    calls: list[str] = []
    python = ChargeMode._general

    def counted(self: ChargeMode, func: Any, *rest: Any) -> Any:
        calls.append(str(func))
        return python(self, func, *rest)

    monkeypatch.setattr(ChargeMode, "_general", counted)
    yield calls


def test_plain_ops_are_charged_and_counted_without_the_python_route(general: list[str]) -> None:
    mode = _mode(phantom=False)
    s = mode.session
    a, b = torch.ones(N), torch.full((N,), 2.0)
    with mode:
        start, base = s.clock.compute_ns, s.memory.current
        c = torch.add(a, b)
        assert type(c) is torch.Tensor and s.clock.compute_ns - start == ADD_NS and s.memory.current - base == 4 * N
        assert c.add_(b) is c  # in place: its own output, nothing more allocated
        assert s.clock.compute_ns - start == 2 * ADD_NS and s.memory.current - base == 4 * N
        v = c.view(2, N // 2)  # a view: no kernel, no memory
        assert s.clock.compute_ns - start == 2 * ADD_NS and s.memory.current - base == 4 * N
        d = torch.add(a, b)
        assert s.ops == 4 and s.memory.current - base == 8 * N
        del d  # freed: its bytes leave the live count, the peak stays
        assert s.memory.current - base == 4 * N and s.memory.peak - base == 8 * N
    assert general == [] and c[0].item() == 5.0 and v.shape == (2, N // 2)


def test_ops_the_entry_leaves_take_the_python_route_with_the_same_charge(general: list[str]) -> None:
    mode = _mode(phantom=False)
    s = mode.session
    a = torch.ones(N // 2)
    with mode:
        start = s.clock.compute_ns
        out = torch.cat([a, a])  # tensors in a list: the general route
    assert general == ["aten.cat.default"] and out.shape == (N,)
    assert s.clock.compute_ns - start == math.ceil(2 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS


def test_phantom_meta_tensors_take_the_entry(general: list[str]) -> None:
    mode = _mode(phantom=True)
    s = mode.session
    a, b = torch.empty(N, device="meta"), torch.empty(N, device="meta")
    with mode:
        start, base = s.clock.compute_ns, s.memory.current
        c = torch.add(a, b)
        assert c.is_meta and s.clock.compute_ns - start == ADD_NS and s.memory.current - base == 4 * N
    assert general == []


def test_after_a_cuda_tensor_cpu_tensors_are_host_data(general: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simtensor, "_seen", True)
    mode = _mode(phantom=False)
    s = mode.session
    a = torch.ones(N)
    with mode:
        start, base = s.clock.compute_ns, s.memory.current
        torch.add(a, a)
    assert general == ["aten.add.Tensor"] and s.clock.compute_ns == start and s.memory.current == base


def test_a_traced_op_is_recorded_from_the_compiled_charge(general: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """With a trace (every real run's trace.json), the compiled charge records each op's span on the compute lane
    without the Python `RankSession.charge`: its name and its closed-form duration (an in-place scale of N fp32
    values moves 2 x 4 N bytes), back to back."""
    session = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="ops")
    mode = ChargeMode(session)
    python = []
    monkeypatch.setattr(RankSession, "charge", lambda self, *a: python.append(a))  # the method, never called
    a = torch.ones(N)
    with mode:
        start = session.clock.compute_ns
        torch.add(a, a).mul_(2.0)
    assert python == [] and general == []
    mul_ns = math.ceil(2 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS  # in place: read and write
    add_end = start + ADD_NS
    assert session.trace._ops[-2:] == [("aten.add", start, add_end), ("aten.mul_", add_end, add_end + mul_ns)]


def test_a_coarse_trace_merges_the_compiled_charges_ops_into_one_block(general: list[str]) -> None:
    """At the "coarse" level the compiled charge hands each op to the recorder's method (only "ops" is appended in
    C): two back-to-back ops are one block from the first's start to the second's end."""
    session = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="coarse")
    a = torch.ones(N)
    with ChargeMode(session):
        start = session.clock.compute_ns
        torch.add(a, a).mul_(2.0)
    assert general == []
    mul_ns = math.ceil(2 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS
    session.trace.stop_ops()  # closes the open block
    assert session.trace._ops == [("compute (2 ops)", start, start + ADD_NS + mul_ns)]


class _Reports(NoNetworkClient):
    """The stand-in network, keeping the clocks the rank reported."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[int] = []

    def advance_clock(self, t_ns: int) -> None:
        self.reports.append(t_ns)
        super().advance_clock(t_ns)


def test_the_compiled_charge_reports_the_clock_as_report_every_us_says(general: list[str]) -> None:
    """The clock report (`_report_check`, done in C by the compiled charge): with report_every_us=0 each op reports
    its end; with an interval longer than the test, none does, and the real clock is read every REPORT_CHECK_OPS
    ops (`_report_in` counts down from it)."""
    from phantora.runtime.session import REPORT_CHECK_OPS

    a = torch.ones(N)
    every = RankSession(0, 1, _Reports(), Roofline(get_gpu("h100")), trace_level="none", report_every_us=0)
    with ChargeMode(every):
        start = every.clock.compute_ns
        for _ in range(3):
            torch.add(a, a)
    assert general == [] and every.client.reports == [start + k * ADD_NS for k in (1, 2, 3)]  # type: ignore[attr-defined]
    rare = RankSession(0, 1, _Reports(), Roofline(get_gpu("h100")), trace_level="none", report_every_us=1e12)
    rare._last_report = 1 << 62  # the last report "now": none is due for the test's length
    with ChargeMode(rare):
        for _ in range(1 + REPORT_CHECK_OPS + 3):  # the first op checks at once (a session starts at 1)
            torch.add(a, a)
    assert rare.client.reports == [] and rare._report_in == REPORT_CHECK_OPS - 3  # type: ignore[attr-defined]
