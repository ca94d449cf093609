"""The compiled per-op path's tensor reader (simcuda/tensorinfo.cc) against torch's own Python answers, and the
per-op path with and without it against the closed forms.

What it reads must be what torch's bindings say: `is_meta`, `requires_grad`, `layout is torch.strided`,
`storage_offset()`, `untyped_storage().nbytes()` and `._cdata`, and whether `stride()` equals the strides torch gives
a contiguous tensor of the same shape. Without it (not built: no compiler), the compiled path reads them through
Python and the figures are the same: an fp32 add of two 2^20-element tensors charges ceil(12 MiB / HBM bandwidth) ns
plus the launch overhead and holds 4 MiB.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, device, native
from phantora.runtime.simcuda.tensor import SimCudaTensor


class Info(ctypes.Structure):
    _fields_ = [
        ("nbytes", ctypes.c_int64),
        ("storage", ctypes.c_void_p),
        ("storage_offset", ctypes.c_int64),
        ("is_meta", ctypes.c_int),
        ("requires_grad", ctypes.c_int),
        ("strided", ctypes.c_int),
        ("contiguous", ctypes.c_int),
    ]


@pytest.fixture(scope="module")
def read() -> Iterator[object]:
    fast = compiled.load()
    address = compiled.tensor_info_address() if fast is not None else 0
    if not address:
        pytest.skip("the compiled per-op path or its tensor reader is not built")
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(Info))(address)

    def call(t: torch.Tensor) -> Info | None:
        info = Info()
        return info if fn(t, ctypes.byref(info)) == 0 else None

    yield call


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


BASE = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
CASES = {
    "contiguous": BASE,
    "transposed": BASE.transpose(0, 2),
    "a slice with an offset": BASE[1, 1:],
    "a column (offset, strided)": BASE[:, :, 2],
    "expanded (stride 0)": torch.ones(3, 1).expand(3, 5),
    "size-1 dims with odd strides": torch.ones(4, 6)[:1, ::2].t()[:, :1],
    "zero elements": torch.empty(0, 5),
    "a scalar": torch.tensor(3.0),
    "requires_grad": torch.ones(5, requires_grad=True),
    "meta": torch.empty(7, 9, device="meta", dtype=torch.bfloat16),
    "meta, non-contiguous": torch.empty(7, 9, device="meta").t(),
    "a parameter": torch.nn.Parameter(torch.ones(2, 2)),
    "int64": torch.arange(10),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_reader_answers_as_torch_python_bindings(read: object, name: str) -> None:
    t = CASES[name]
    info = read(t)  # type: ignore[operator]
    assert info is not None
    st = t.untyped_storage()
    assert (info.nbytes, info.storage or 0) == (st.nbytes(), st._cdata)
    assert info.storage_offset == t.storage_offset()
    assert (bool(info.is_meta), bool(info.requires_grad)) == (t.is_meta, t.requires_grad)
    assert bool(info.strided) == (t.layout is torch.strided)
    assert bool(info.contiguous) == (t.stride() == _contiguous(tuple(t.shape)))


def test_the_reader_leaves_a_sparse_tensor_to_python(read: object) -> None:
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(NotImplementedError):
        sparse.untyped_storage()  # torch's bindings have no storage to give: the Python route handles it
    assert read(sparse) is None  # type: ignore[operator]


WRAPPED = {
    "fp32 2x3": torch.ones(2, 3),
    "bf16 meta 4x5": torch.empty(4, 5, device="meta", dtype=torch.bfloat16),
    "a scalar": torch.tensor(3.0),
    "zero elements": torch.empty(0, 5),
    "size-1 dims": torch.ones(3, 1, 4, dtype=torch.int64),
}


@pytest.mark.parametrize("name", list(WRAPPED))
@pytest.mark.parametrize("index", [0, 5])
def test_the_compiled_wrapper_is_the_one_make_wrapper_subclass_makes(name: str, index: int) -> None:
    if compiled.load() is None or not compiled.wrapper_address():
        pytest.skip("the compiled per-op path or its tensor reader is not built")
    fn = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object, ctypes.py_object, ctypes.c_int64)(
        compiled.wrapper_address()
    )
    elem = WRAPPED[name]
    ours = fn(SimCudaTensor, elem, index)
    torchs = torch.Tensor._make_wrapper_subclass(
        SimCudaTensor, elem.shape, dtype=elem.dtype, device=torch.device("cuda", index)
    )
    assert type(ours) is SimCudaTensor
    assert torch._C._dispatch_keys(ours) == torch._C._dispatch_keys(torchs)  # the Python keys: it dispatches to us
    for read in ("shape", "dtype", "device", "layout", "requires_grad", "is_leaf"):
        assert getattr(ours, read) == getattr(torchs, read), read
    assert (ours.stride(), ours.storage_offset()) == (torchs.stride(), torchs.storage_offset())
    ours_st, torchs_st = torch.Tensor.untyped_storage(ours), torch.Tensor.untyped_storage(torchs)
    assert (ours_st.nbytes(), ours_st.device) == (torchs_st.nbytes(), torchs_st.device)
    assert ours_st.nbytes() == elem.numel() * elem.element_size()  # the closed form of a contiguous tensor's bytes


N = 1 << 20


@pytest.mark.parametrize(
    ("reader", "wrapper", "caller"),
    [(True, True, True), (True, True, False), (True, False, False), (False, False, False)],
    ids=["reader, op caller", "reader", "reader, no wrapper", "python bindings"],
)
def test_the_compiled_path_gives_the_closed_forms_with_or_without_the_reader(
    reader: bool, wrapper: bool, caller: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = compiled.load()
    if fast is None:
        pytest.skip("the compiled fast path is not built (scripts/setup.sh)")
    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank (no device guard here)
    fast.set_tensor_info(compiled.tensor_info_address() if reader else 0)
    fast.set_wrapper(compiled.wrapper_address() if wrapper else 0)
    fast.set_op_call(compiled.op_call_address() if caller else 0)
    mul_calls = compiled.op_calls(torch.ops.aten.mul.Tensor)
    try:
        s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
        add_ns = math.ceil(3 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS
        a, b = SimCudaTensor(torch.ones(N), 0), SimCudaTensor(torch.full((N,), 2.0), 0)
        with ChargeMode(s):
            start, base = s.clock.compute_ns, s.memory.current
            c = torch.add(a, b)
            assert s.clock.compute_ns - start == add_ns and s.memory.current - base == 4 * N
            v = torch.ops.aten.slice.Tensor(c, 0, N // 2, N)  # a view with a storage offset: nothing more held
            assert s.memory.current - base == 4 * N and v.storage_offset() == N // 2
            w = torch.mul(v, 2.0)  # a new N/2-element output
            assert s.memory.current - base == 6 * N
            t = torch.ops.aten.t.default(SimCudaTensor(torch.ones(4, 3), 0))  # a view with other strides
            assert t.stride() == (1, 3) and t.elem.stride() == (1, 3)
            del w
            assert s.memory.current - base == 4 * N + 512  # the 48 bytes under `t`, in a 512-byte block
        assert c.elem[0].item() == 3.0 and v.elem[0].item() == 3.0
        assert type(c) is SimCudaTensor and c.device == torch.device("cuda", 0) and c._sim_index == 0
        assert torch._C._dispatch_keys(c).has(torch._C.DispatchKey.Python)
        assert compiled.op_calls(torch.ops.aten.mul.Tensor) - mul_calls == (1 if caller else 0)  # the number: a tensor
    finally:
        fast.set_tensor_info(compiled.tensor_info_address())
        fast.set_wrapper(compiled.wrapper_address())
        fast.set_op_call(compiled.op_call_address())


def test_a_reader_that_does_not_build_leaves_one_warning_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(source: Path, stem: str, what: str, *, python: bool = False) -> Path:
        raise native.NativeBuildError(f"building {what} failed (g++ ...):\nerror: one\nerror: two")

    monkeypatch.setattr(native, "library", fail)
    monkeypatch.setattr(compiled, "_info_lib", None)
    assert compiled.tensor_info_address() == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensorinfo.cc" in err and "Python bindings" in err


def test_a_library_that_does_not_build_warns_once_and_leaves_both_to_python(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def fail(source: Path, stem: str, what: str, *, python: bool = False) -> Path:
        calls.append(stem)
        raise native.NativeBuildError(f"building {what} failed (g++ ...):\nerror: one")

    class Fast:
        info = wrap = call = hook = -1

        def set_tensor_info(self, address: int) -> None:
            self.info = address

        def set_wrapper(self, address: int) -> None:
            self.wrap = address

        def set_op_call(self, address: int) -> None:
            self.call = address

        def set_storage_hook(self, address: int) -> None:
            self.hook = address

    monkeypatch.setattr(native, "library", fail)
    monkeypatch.setattr(compiled, "_info_lib", None)
    monkeypatch.setattr(compiled, "_call_lib", None)
    fast = Fast()
    compiled.set_native(fast)
    assert (fast.info, fast.wrap, fast.call, fast.hook) == (0, 0, 0, 0) and len(calls) == 1
    assert capsys.readouterr().err.count("\n") == 1
