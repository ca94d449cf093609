"""The compiled per-op path's op caller (simcuda/opcall.cc) against the OpOverload's own `_op`.

Each call must give what `func._op(*args, **kwargs)` gives (the same values, types, dtypes, strides, views, tuple for
several returns, autograd history) and raise what it raises (the same exception type and message), whether it is
called typed (a schema of one of opcall.cc's typed forms, plain tensors only) or boxed; a call it must not take (a
torch function mode active, an argument that could override __torch_function__) is left to `_op` with nothing raised.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
import torch

from phantora.runtime.simcuda import compiled

Call = Callable[..., tuple[int, Any]]


@pytest.fixture(scope="module")
def call() -> Call:
    if compiled.load() is None or not compiled.op_call_address():
        pytest.skip("the compiled per-op path or its op caller is not built")
    fn = ctypes.PYFUNCTYPE(
        ctypes.c_int, ctypes.py_object, ctypes.py_object, ctypes.py_object, ctypes.POINTER(ctypes.py_object)
    )(compiled.op_call_address())

    def run(func: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        out = ctypes.py_object()
        taken = fn(func, args, kwargs, ctypes.byref(out))  # an empty dict: as no keywords
        return taken, (out.value if taken else None)

    return run


A = torch.arange(6, dtype=torch.float32).reshape(2, 3)
CALLS: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {
    "add": (torch.ops.aten.add.Tensor, (A, A), {}),
    "tensors and a default": (torch.ops.aten.gelu.default, (A,), {}),
    "three tensors": (torch.ops.aten.where.self, (A > 2, A, -A), {}),
    "a sparse tensor": (torch.ops.aten.add.Tensor, (A.to_sparse(), A.to_sparse()), {}),
    "add, alpha by keyword": (torch.ops.aten.add.Tensor, (A, A), {"alpha": 3}),
    "a number as a tensor": (torch.ops.aten.mul.Tensor, (A, 2.5), {}),
    "two outputs": (torch.ops.aten.max.dim, (A, 1), {}),
    "an int list": (torch.ops.aten.view.default, (A, [3, 2]), {}),
    "a dtype": (torch.ops.aten._to_copy.default, (A,), {"dtype": torch.float16}),
    "a list of outputs": (torch.ops.aten.split.Tensor, (A, 1, 1), {}),
    "a scalar output": (torch.ops.aten._local_scalar_dense.default, (A[0, 1],), {}),
    "typed: mul": (torch.ops.aten.mul.Tensor, (A, A), {}),
    "typed: sub, int tensors": (torch.ops.aten.sub.Tensor, (A.long(), A.long() * 3), {}),
    "typed: mm": (torch.ops.aten.mm.default, (A, A.t()), {}),
    "typed: unary": (torch.ops.aten.neg.default, (A,), {}),
    "typed: a view": (torch.ops.aten.t.default, (A,), {}),
    "typed: broadcast, promoted": (torch.ops.aten.add.Tensor, (A, torch.ones(3, dtype=torch.float64)), {}),
}
# The calls above that opcall.cc makes typed (the schema's form and plain tensors only), the others boxed.
TYPED = {"add"} | {case for case in CALLS if case.startswith("typed: ")}


@pytest.mark.parametrize("case", list(CALLS))
def test_a_call_gives_what_the_binding_gives(call: Call, case: str) -> None:
    func, args, kwargs = CALLS[case]
    taken, got = call(func, *args, **kwargs)
    want = func._op(*args, **kwargs)
    assert taken == 1
    assert type(got) is type(want)
    gots, wants = (got, want) if isinstance(want, tuple | list) else ((got,), (want,))
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants, strict=True):
        assert type(g) is type(w)
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape and g.layout == w.layout
            assert torch.equal(g.to_dense(), w.to_dense())
            if w.layout == torch.strided:
                assert g.stride() == w.stride() and g._is_view() == w._is_view()
        else:
            assert g == w


@pytest.mark.parametrize("case", list(CALLS))
def test_a_call_is_typed_only_in_a_typed_form(call: Call, case: str) -> None:
    func, args, kwargs = CALLS[case]
    before = compiled.op_calls(func), compiled.typed_calls(func)
    call(func, *args, **kwargs)
    assert compiled.op_calls(func) - before[0] == 1
    assert compiled.typed_calls(func) - before[1] == (1 if case in TYPED else 0)


def test_a_typed_call_records_autograd_as_the_binding_does(call: Call) -> None:
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 2, requires_grad=True)
    typed = compiled.typed_calls(torch.ops.aten.mm.default)
    _, got = call(torch.ops.aten.mm.default, x, w)
    want = torch.ops.aten.mm.default._op(x, w)
    assert compiled.typed_calls(torch.ops.aten.mm.default) - typed == 1
    assert got.requires_grad and type(got.grad_fn) is type(want.grad_fn)
    (gx,) = torch.autograd.grad(got.sum(), (x,))
    (wx,) = torch.autograd.grad(want.sum(), (x,))
    assert torch.equal(gx, wx) and torch.equal(gx, torch.ones(3, 2) @ w.detach().t())


ERRORS: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {
    "shapes": (torch.ops.aten.add.Tensor, (A, torch.ones(4)), {}),
    "shapes, typed mm": (torch.ops.aten.mm.default, (A, A), {}),
    "dtypes, typed mm": (torch.ops.aten.mm.default, (A, A.t().long()), {}),
    "a missing argument": (torch.ops.aten.add.Tensor, (A,), {}),
    "an unknown keyword": (torch.ops.aten.add.Tensor, (A, A), {"bogus": 1}),
    "an index (IndexError)": (torch.ops.aten.select.int, (A, 0, 5), {}),
    "a wrong type": (torch.ops.aten.view.default, (A, "x"), {}),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_an_error_is_the_one_the_binding_raises(call: Call, case: str) -> None:
    func, args, kwargs = ERRORS[case]
    with pytest.raises(Exception) as want:
        func._op(*args, **kwargs)
    with pytest.raises(want.type) as got:
        call(func, *args, **kwargs)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


class Marked(torch.Tensor):
    """A subclass whose __torch_function__ records the call: the binding hands the op to it."""

    seen: list[Any] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.seen.append(func)
        return NotImplemented


def test_a_torch_function_mode_or_override_is_left_to_the_binding(call: Call) -> None:
    calls = compiled.op_calls(torch.ops.aten.add.Tensor)
    with torch.device("meta"):  # a torch function mode
        assert call(torch.ops.aten.add.Tensor, A, A) == (0, None)
    assert call(torch.ops.aten.add.Tensor, A, A.as_subclass(Marked)) == (0, None)
    assert call(torch.ops.aten.add.Tensor, A, torch.nn.Parameter(A)) == (0, None)  # not an exact tensor: the binding
    assert compiled.op_calls(torch.ops.aten.add.Tensor) == calls
    assert call(torch.ops.aten.add.Tensor, A, A)[0] == 1 and compiled.op_calls(torch.ops.aten.add.Tensor) == calls + 1
