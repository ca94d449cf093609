"""The fast path's bookkeeping (simcuda/fastpath.py), in one process, against closed forms; each test runs the compiled
fast path (simcuda/_fastop.c) and the Python one.

- Device memory: ten 4-element fp32 adds hold ten 512-byte blocks (the allocator's rounding), which the small
  pool packs into one 2 MiB segment; freeing them returns the live bytes to where they were and keeps the peak;
  a 3 MiB output takes a 20 MiB large-pool segment (requests under 10 MiB), so 22 MiB are reserved, the reserved
  peaks say so, and the segments stay cached after the free.
- The device index: an op's output is on its inputs' device, read from the index their wrapper keeps; a wrapper
  without it asks torch.
- The fp32 matmul precision in the cost key: a 512^3 fp32 matmul costs max(2 * 512^3 / peak, 3 MiB / bandwidth)
  + the launch, at the fp32 peak under "highest" and at the TF32 peak under "high", switched by either torch API.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime import precision
from phantora.runtime.compute import Roofline
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, fastpath
from phantora.runtime.simcuda.tensor import SimCudaTensor

MiB = 1 << 20
add = torch.ops.aten.add.Tensor
mm = torch.ops.aten.mm.default


@pytest.fixture(params=["compiled", "python"])
def device_op(request: pytest.FixtureRequest) -> Callable[..., Any]:
    if request.param == "python":
        return fastpath.python_device_op
    fast = compiled.load()
    if fast is None:
        pytest.skip("the compiled fast path is not built (scripts/setup.sh)")
    return fast.device_op


@pytest.fixture
def session() -> RankSession:
    return RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")


@pytest.fixture
def restore_precision() -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def _cuda(t: torch.Tensor, index: int = 0) -> SimCudaTensor:
    return SimCudaTensor(t, index)


def test_repeated_ops_hold_the_allocators_closed_form_and_the_exact_peak(
    session: RankSession, device_op: Callable[..., Any]
) -> None:
    mem, alloc = session.memory, session.memory.allocator
    a, b = _cuda(torch.ones(4)), _cuda(torch.full((4,), 2.0))
    base = mem.current
    assert alloc.reserved == 0  # the inputs were made outside the tracker
    outs = [device_op(session, add, (a, b), {}) for _ in range(10)]
    for out in outs:
        assert type(out) is SimCudaTensor and out.device == torch.device("cuda", 0)
        assert out.dtype == torch.float32 and out.shape == (4,) and out.elem.tolist() == [3.0] * 4
    assert mem.current == base + 10 * 512 and mem.peak == base + 10 * 512
    assert alloc.reserved == 2 * MiB and mem.reserved_step_peak == 2 * MiB and mem.program_reserved_peak == 2 * MiB
    assert mem.peak_by_cat == [0, 0, 0, 0, base + 10 * 512]  # all temporaries
    del outs, out
    assert mem.current == base and mem.peak == base + 10 * 512  # freed; the peak stays
    assert alloc.cached_free == 2 * MiB  # the small segment stays reserved
    n = 3 * MiB // 4
    big = device_op(session, add, (_cuda(torch.ones(n)), _cuda(torch.ones(n))), {})
    assert mem.current == base + 3 * MiB and mem.peak == base + 3 * MiB
    assert alloc.reserved == 22 * MiB and mem.reserved_step_peak == 22 * MiB and alloc.peak_reserved == 22 * MiB
    del big
    assert mem.current == base and alloc.reserved == 22 * MiB and alloc.cached_free == 22 * MiB
    again = device_op(session, add, (a, b), {})  # a cached small block: nothing more reserved
    assert mem.current == base + 512 and alloc.reserved == 22 * MiB
    del again
    assert mem.current == base and mem.allocations == 12


def test_outputs_are_on_the_inputs_device_read_from_their_wrapper(
    session: RankSession, device_op: Callable[..., Any]
) -> None:
    a, b = _cuda(torch.ones(4), 3), _cuda(torch.ones(4), 3)
    out = device_op(session, add, (a, b), {})
    assert out.device == torch.device("cuda", 3) and out._sim_index == 3
    del out.__dict__["_sim_index"]  # a wrapper without the kept index asks torch
    assert out._sim_index == 3
    again = device_op(session, add, (out, b), {})
    assert again.device == torch.device("cuda", 3)
    assert device_op(session, torch.ops.aten.add_.Tensor, (a, b), {}) is a  # in place: its input


def _mm_ns(session: RankSession, n: int, device_op: Callable[..., Any]) -> int:
    x = _cuda(torch.ones(n, n))
    start = session.clock.compute_ns
    device_op(session, mm, (x, x), {})
    return session.clock.compute_ns - start


@pytest.mark.usefixtures("restore_precision")
def test_the_matmul_precision_in_the_cost_key_follows_each_setter(
    session: RankSession, device_op: Callable[..., Any]
) -> None:
    gpu, n = get_gpu("h100"), 512
    memory_s = 3 * n * n * 4 / gpu.mem_bw

    def closed_form(peak: float) -> int:
        return math.ceil(max(2 * n**3 / peak, memory_s) * 1e9) + DEFAULT_LAUNCH_NS

    fp32, tf32 = closed_form(gpu.peak("fp32")), closed_form(gpu.peak("tf32"))
    assert fp32 != tf32
    torch.set_float32_matmul_precision("highest")
    assert precision.value is None  # a setter drops the cached value
    assert _mm_ns(session, n, device_op) == fp32
    assert precision.value == "highest"
    torch.set_float32_matmul_precision("high")
    assert _mm_ns(session, n, device_op) == tf32
    torch.set_float32_matmul_precision("highest")
    assert _mm_ns(session, n, device_op) == fp32
    torch.backends.cuda.matmul.allow_tf32 = True  # the other API
    assert _mm_ns(session, n, device_op) == tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    assert _mm_ns(session, n, device_op) == fp32


@pytest.mark.usefixtures("restore_precision")
def test_torchs_newer_precision_api_is_read_when_the_legacy_getter_refuses(
    session: RankSession, device_op: Callable[..., Any]
) -> None:
    """transformers' `enable_tf32` (Trainer's `--torch_compile` or `--bf16` on a TF32 GPU) sets the generic
    `torch.backends.fp32_precision = "tf32"`, after which `torch.get_float32_matmul_precision()` raises ("checking the
    matmul precision without a specific backend name"); the matmul is charged at the TF32 peak, and at the fp32 peak
    once it is "ieee" again."""
    gpu, n = get_gpu("h100"), 512
    memory_s = 3 * n * n * 4 / gpu.mem_bw

    def closed_form(peak: float) -> int:
        return math.ceil(max(2 * n**3 / peak, memory_s) * 1e9) + DEFAULT_LAUNCH_NS

    try:
        for backend in (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul):
            backend.fp32_precision = "none"  # a fresh process's: each follows the generic setting
        torch.backends.fp32_precision = "tf32"
        with pytest.raises(RuntimeError, match="without a specific backend name"):
            torch.get_float32_matmul_precision()
        assert _mm_ns(session, n, device_op) == closed_form(gpu.peak("tf32"))
        torch.backends.fp32_precision = "ieee"
        assert _mm_ns(session, n, device_op) == closed_form(gpu.peak("fp32"))
    finally:
        torch.backends.fp32_precision = "ieee"
