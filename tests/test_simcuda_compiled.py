"""The compiled per-op entry (simcuda/_fastop.c) as a rank's dispatch mode uses it, in one process, against closed
forms.

Under the roofline model an element-wise add of two 2^20-element fp32 tensors moves 3 x 4 MiB through HBM: it takes
ceil(12 MiB / bandwidth) ns plus the launch overhead, and its output holds 4 MiB of device memory until it dies; an
in-place add on it returns it and allocates nothing. A fast path replaced by a program (a test, a benchmark) is
the one the mode calls.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, device, fastpath
from phantora.runtime.simcuda.tensor import SimCudaTensor

N = 1 << 20


@pytest.fixture
def mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChargeMode]:
    if compiled.load() is None:
        pytest.skip("the compiled fast path is not built (scripts/setup.sh)")
    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank (no device guard here)
    session = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    yield ChargeMode(session)


def test_the_compiled_entry_charges_counts_and_wraps_the_closed_form(mode: ChargeMode) -> None:
    assert type(mode.__dict__["__torch_dispatch__"]).__name__ == "builtin_function_or_method"
    s = mode.session
    a, b = SimCudaTensor(torch.ones(N), 0), SimCudaTensor(torch.full((N,), 2.0), 0)
    add_ns = math.ceil(3 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS
    with mode:
        start, base = s.clock.compute_ns, s.memory.current
        c = torch.add(a, b)
        assert s.clock.compute_ns - start == add_ns and s.memory.current - base == 4 * N
        assert c.add_(b) is c  # its output's storage is counted already: nothing more
        assert s.clock.compute_ns - start == 2 * add_ns and s.memory.current - base == 4 * N
        d = torch.add(a, b)
        assert s.ops == 3 and s.memory.current - base == 8 * N
        del d  # freed: its bytes leave the live count, the peak stays
        assert s.memory.current - base == 4 * N and s.memory.peak - base == 8 * N
    assert type(c.elem) is torch.Tensor and c.elem[0].item() == 5.0 and c.shape == (N,)


def test_a_replaced_fast_path_is_the_one_the_mode_calls(mode: ChargeMode, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fast = fastpath.device_op

    def counted(*args: Any) -> Any:
        calls.append(args[1])
        return fast(*args)

    monkeypatch.setattr(fastpath, "device_op", counted)
    a = SimCudaTensor(torch.ones(4), 0)
    with mode:
        out = torch.mul(a, 3.0)
    assert calls == [torch.ops.aten.mul.Tensor] and out.elem.tolist() == [3.0] * 4


def test_a_build_older_than_its_source_is_not_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`_fastop.c` changed after the build (edited, or checked out by a pull: the .so is not in git): the old
    compiled code would run in place of the new, so the Python path runs, with one warning line."""
    if compiled.load() is None:
        pytest.skip("the compiled fast path is not built (scripts/setup.sh)")
    built = Path(compiled.load().__file__)  # type: ignore[union-attr]
    newer = tmp_path / "_fastop.c"
    newer.write_text("/* edited */\n")
    os.utime(newer, (built.stat().st_mtime + 10, built.stat().st_mtime + 10))
    assert compiled.stale(newer, built) and not compiled.stale(built, newer)
    assert not compiled.stale(tmp_path / "absent.c", built)  # no source beside it (a wheel): the build is used
    monkeypatch.setattr(compiled, "SOURCE", newer)
    monkeypatch.setattr(compiled, "_tried", False)
    monkeypatch.setattr(compiled, "_module", None)
    assert compiled.load() is None
    assert "older than _fastop.c" in capsys.readouterr().err
