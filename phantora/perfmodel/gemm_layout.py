"""The operands of a matrix product as PyTorch hands them to cuBLAS: the byte sizes cuBLAS wants on a 16-byte grid.

cuBLAS's "Tensor Core Usage" (cuBLAS docs 2.1.11) lists what its fastest tensor-core kernels need, for column-major
A, B, C: each operand's contiguous extent (`op_A == N ? m : k` for A, `op_B == N ? k : n` for B, m for C), its leading
dimension (lda, ldb, ldc) and its base pointer, each a multiple of 16 bytes. Which dimension is contiguous and which
stride is leading is the operand's layout, not its shape: PyTorch's `prepare_matrix_for_cublas` (aten Blas.cpp) passes a
row-major matrix [r, c] (strides (ld, 1)) as a transposed column-major one, a column-major one (strides (1, ld), a
transposed view) as it is, and copies any other layout to a contiguous tensor first. Either way the contiguous extent
is the extent of the stride-1 dimension and the leading dimension is the other stride. The product's output is a new
contiguous [.., m, n], so n is its contiguous extent and leading dimension. The rows of a row-major activation (the
tokens of a linear layer) are therefore never on the list, nor the reduction dimension of a weight gradient dY^T X
(the tokens again: dY^T is a transposed view, contiguous along n).

A call carries its operands' layouts as the hints `strides` (one list per input tensor, in the order of the shapes) and
`offsets` (storage offsets in elements); without them every input is taken as contiguous at offset 0, so the list is
each input's last dimension (the weight's too: `linear` uses its [n, k] weight transposed, contiguous along k) and the
output's n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from phantora.errors import InputError
from phantora.perfmodel.dtypes import dtype_bytes

Shape = tuple[int, ...]


def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    """Row-major strides of `shape` (in elements)."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def cublas_view(rows: int, cols: int, row_stride: int, col_stride: int, offset: int) -> tuple[int, int, int]:
    """(contiguous extent, leading dimension, offset) in elements of a [rows, cols] operand as PyTorch passes it to
    cuBLAS: as it lies when one of its strides is 1 and the other spans the contiguous extent, else copied to a new
    contiguous tensor (prepare_matrix_for_cublas's three cases)."""
    if col_stride == 1 and row_stride == cols:  # contiguous (checked first, as PyTorch's dense case)
        return cols, row_stride, offset
    if row_stride == 1 and (col_stride >= max(1, rows)):  # column-major: a transposed view
        return rows, col_stride, offset
    if col_stride == 1 and (row_stride >= max(1, cols)):  # row-major with a longer leading dimension (a slice)
        return cols, row_stride, offset
    return cols, cols, 0  # copied


def _layouts(call_shapes: Sequence[Shape], extra: dict) -> tuple[list[tuple[int, ...]], list[int]]:
    """Each input's strides and storage offset: the call's hints, or contiguous at offset 0."""
    strides, offsets = extra.get("strides"), extra.get("offsets")
    n = len(call_shapes)
    if strides is None:
        got = [contiguous_strides(s) for s in call_shapes]
    else:
        got = [tuple(int(x) for x in s) for s in strides]
        if len(got) != n or any(len(s) != len(shape) for s, shape in zip(got, call_shapes, strict=True)):
            raise InputError(
                f"strides {strides!r} do not match the shapes {[list(s) for s in call_shapes]}", field="strides"
            )
    offs = [0] * n if offsets is None else [int(o) for o in offsets]
    if len(offs) != n:
        raise InputError(f"offsets {offsets!r} do not match the {n} input tensors", field="offsets")
    return got, offs


def _operand(shape: Shape, strides: Sequence[int], offset: int, transpose: bool = False) -> tuple[int, ...]:
    """(extent, ld, offset[, batch stride]) elements of the matrix in the last two dims of an input (its transpose for
    `transpose`: a weight [n, k] used as [k, n])."""
    rows, cols = shape[-2], shape[-1]
    sr, sc = strides[-2], strides[-1]
    if transpose:
        rows, cols, sr, sc = cols, rows, sc, sr
    view = cublas_view(rows, cols, sr, sc, offset)
    batch = strides[-3] if len(shape) == 3 and shape[0] > 1 else 0
    return (*view, batch) if batch else view


def grid_bytes(op: str, shapes: Sequence[Shape], dtypes: Sequence[str], out_dtype: str, extra: dict) -> tuple[int, ...]:
    """The byte sizes cuBLAS wants on the 16-byte grid for the matrix product `op` (its base name) on inputs `shapes`
    (with the `strides`/`offsets` hints of `extra`): both operands' contiguous extent, leading dimension, offset (and
    batch stride), and the output's n. Empty for a product with a vector operand (no tile kernel)."""
    strides, offsets = _layouts(shapes, extra)
    if op in ("mm", "bmm", "_scaled_mm", "matmul", "linear"):
        ia, ib = 0, 1
    elif op in ("addmm", "baddbmm"):
        ia, ib = 1, 2
    else:
        return ()  # mv, addmv, dot: a vector operand
    a, b = shapes[ia], shapes[ib]
    if len(a) < 2 or len(b) < 2:
        return ()
    if op == "linear":
        a_view = _operand((math.prod(a[:-1]), a[-1]), strides[ia][-2:], offsets[ia])  # [.., k] rows as one dim
        b_view = _operand(b, strides[ib], offsets[ib], transpose=True)
        n = b[0]
    else:
        a_view = _operand(a, strides[ia], offsets[ia])
        b_view = _operand(b, strides[ib], offsets[ib])
        n = b[-1]
    sa, sb, sc = dtype_bytes(dtypes[ia]), dtype_bytes(dtypes[ib]), dtype_bytes(out_dtype)
    return (*(v * sa for v in a_view), *(v * sb for v in b_view), n * sc)
