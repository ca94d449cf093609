"""The memory tracker told of a storage's death by a C++ hook on its StorageImpl (simcuda/tensorinfo.cc's
`phantora_hook_storage`) instead of a weak reference on its Python object: the accounting must be the same.

Each case is a closed form in 512-byte blocks (memory.BLOCK): an fp32 output of N elements holds 4N bytes while any
tensor or view on its storage lives, and nothing after the last dies; a storage whose data is replaced while it lives
(a CPU resize_, share_memory_) is not freed by that, and is freed when it dies; in phantom mode (meta storages) the
same.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.runtime import memory
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, device
from phantora.runtime.simcuda.tensor import SimCudaTensor

N = 1 << 12  # 16 KiB of fp32: a multiple of the 512-byte block


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[RankSession]:
    fast = compiled.load()
    if fast is None or not compiled.storage_hook_address():
        pytest.skip("the compiled per-op path or its storage hook is not built")
    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank (no device guard here)
    yield RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")


def _entry(s: RankSession, t: SimCudaTensor) -> memory._Entry | memory._HookedEntry:
    return s.memory.live[t.elem.untyped_storage()._cdata]


def _weak(s: RankSession, t: SimCudaTensor) -> object:
    """The storage object the entry of `t`'s storage is a weak reference on."""
    e = _entry(s, t)
    assert isinstance(e, memory._Entry)
    return e()


def _cuda(shape: int, phantom: bool = False) -> SimCudaTensor:
    return SimCudaTensor(torch.empty(shape, device="meta") if phantom else torch.ones(shape), 0)


def test_an_output_is_hooked_and_freed_with_its_last_view(session: RankSession) -> None:
    s = session
    a, b = _cuda(N), _cuda(N)
    with ChargeMode(s):
        base = s.memory.current
        c = torch.add(a, b)
        assert type(_entry(s, c)) is memory._HookedEntry and s.memory.current - base == 4 * N
        v = torch.ops.aten.slice.Tensor(c, 0, N // 2, N)  # a view: the same storage, nothing more held
        w = torch.mul(v, 2.0)  # a new N/2-element output
        assert s.memory.current - base == 6 * N
        del c
        assert s.memory.current - base == 6 * N  # the view keeps the storage
        del v
        assert s.memory.current - base == 2 * N
        del w
        assert s.memory.current == base
        assert s.memory.peak - base == 6 * N


def test_a_storage_whose_data_is_replaced_is_not_freed_then_but_when_it_dies(session: RankSession) -> None:
    s = session
    a, b = _cuda(N), _cuda(N)
    with ChargeMode(s):
        base = s.memory.current
        c, d = torch.add(a, b), torch.sub(a, b)
        c.elem.untyped_storage().resize_(8 * N)  # the CPU resize reallocates: the hooked data is replaced
        d.elem.share_memory_()  # moved to shared memory: replaced too
        assert d.elem.is_shared() and c.elem.untyped_storage().nbytes() == 8 * N
        assert s.memory.current - base == 8 * N  # no free: both live (the resize is seen by the next op's output)
        st = c.elem.untyped_storage()
        assert _weak(s, c) is st and _weak(s, d) is d.elem.untyped_storage()  # weak references from now on
        del st
        out = torch.ops.aten.add_.Tensor(c, c)  # an in-place op outputs the resized storage: counted at 8N now
        assert out is c and s.memory.current - base == 12 * N
        del out, c, d
        gc.collect()
        assert s.memory.current == base


def test_a_storage_that_dies_in_another_thread_is_freed(session: RankSession) -> None:
    s = session
    a, b = _cuda(N), _cuda(N)
    with ChargeMode(s):
        base = s.memory.current
        box = [torch.add(a, b).elem]  # its data: the wrapper is gone, the data's storage lives in the box
        assert s.memory.current - base == 4 * N
        t = threading.Thread(target=box.clear)
        t.start()
        t.join()
        assert s.memory.current == base


def test_phantom_outputs_are_hooked_and_freed(session: RankSession) -> None:
    s = session
    s.phantom = True
    a, b = _cuda(N, phantom=True), _cuda(N, phantom=True)
    with ChargeMode(s):
        base = s.memory.current
        c = torch.add(a, b)
        assert c.elem.is_meta and type(_entry(s, c)) is memory._HookedEntry and s.memory.current - base == 4 * N
        c.elem.untyped_storage().resize_(8 * N)  # a meta resize keeps the DataPtr: still hooked, still no free
        assert type(_entry(s, c)) is memory._HookedEntry and s.memory.current - base == 4 * N
        del c
        assert s.memory.current == base


def test_a_copy_on_write_clone_of_a_hooked_storage_runs(session: RankSession) -> None:
    s = session
    a, b = _cuda(N), _cuda(N)
    with ChargeMode(s):
        base = s.memory.current
        c = torch.add(a, b)
        d = torch._lazy_clone(c)  # torch makes a storage copy-on-write only from its plain DataPtr: unhooked first
        assert _weak(s, c) is c.elem.untyped_storage()  # a weak reference from then on
        assert torch.equal(d.elem, c.elem) and s.memory.current - base == 8 * N  # a new storage, as any output
        del c, d
        assert s.memory.current == base
