"""GPU work in a function run over torch.distributed.rpc (pytorch/examples' distributed/rpc/ddp_rpc: the trainers'
model is built on the GPU inside `_run_trainer`, an RPC) runs on RPC's request thread, where no rank's dispatch mode
is: the run ends on phantora's one line naming that limitation and the remote line, not on torch's wrapped error of
some hundred lines; so does GPU work on a thread outside the rank (one the program starts with `threading` runs
on the simulated GPU: test_simcuda_thread_streams.py; this test's pool runs outside any rank). Here a real RPC to
this process's own worker makes that error (this CPU build's dispatcher has no CUDA kernel, as past phantora's
simulated GPU)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed.rpc as rpc

from phantora.runtime.unsupported import explain


def _gpu_work() -> torch.Tensor:
    return torch.ops.aten.empty.memory_format([4], device="cuda")


def _bad_input() -> None:
    raise ValueError("bad input")


@pytest.fixture(scope="module")
def worker(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch_module.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch_module.setenv("MASTER_PORT", str(port))
    rpc.init_rpc("trainer0", rank=0, world_size=1)
    yield "trainer0"
    rpc.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_gpu_work_on_rpcs_thread_is_named_in_one_line(worker: str) -> None:
    with pytest.raises(RuntimeError) as info:
        rpc.rpc_sync(worker, _gpu_work)
    line = explain(info.value)
    assert line is not None and "\n" not in line
    assert line.startswith("NotSimulatedError: `rpc.rpc_sync(worker, _gpu_work)` ran a function over")
    assert "torch.distributed.rpc on worker trainer0 (id 0)" in line
    assert '(`return torch.ops.aten.empty.memory_format([4], device="cuda")`, ' in line and "in _gpu_work)" in line
    assert "RPC's request thread and reached aten::empty.memory_format on torch's own CUDA backend" in line
    assert "GPU work on another thread (an RPC's request thread, one started elsewhere) is not simulated" in line


def test_other_remote_failures_are_left_as_they_are(worker: str) -> None:
    with pytest.raises(ValueError) as info:
        rpc.rpc_sync(worker, _bad_input)
    assert explain(info.value) is None


def test_gpu_work_on_a_thread_outside_the_rank_is_named_in_one_line() -> None:
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(_gpu_work)
        with pytest.raises(NotImplementedError) as info:
            future.result()
    line = explain(info.value)
    assert line is not None and "\n" not in line
    call = '`return torch.ops.aten.empty.memory_format([4], device="cuda")`'  # the thread's line
    assert line.startswith(f"NotSimulatedError: {call} ran GPU work on a thread other than the program's,")
    assert "aten::empty.memory_format reached torch's own CUDA backend" in line
    assert "GPU work on another thread (an RPC's request thread, one started elsewhere) is not simulated" in line


def test_the_programs_own_thread_keeps_its_line() -> None:
    with pytest.raises(NotImplementedError) as info:
        _gpu_work()
    line = explain(info.value)
    assert line is not None and "reached aten::empty.memory_format on torch's own CUDA backend, past" in line
