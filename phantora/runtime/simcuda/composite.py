"""Ops a CUDA tensor runs as a composite of other ops, when they reach the simulated GPU below autograd.

An aten op with a ``CompositeImplicitAutograd`` kernel (``Tensor.to``, ``linear``, ``where`` with a scalar) is
normally split into its parts by the autograd key, so a dispatch mode or a tensor subclass never sees it. Below
autograd (inside another subclass's handler: DTensor's ``loss_parallel`` runs ``(target != ignore_index).sum().to(x)``
on its local tensors) the op itself reaches the Python key, with its arguments as the program gave them: a device
may be positional (``aten.to.device``, ``aten.to.other`` through it), where the simulated GPU looks for the
``device=`` keyword. A CUDA tensor there reaches the CUDA key, whose kernel is the composite; the simulated GPU does
the same (`OpOverload.decompose`), so each part is dispatched, charged and moved as the GPU would run it.

Not the composites phantora keeps whole: those given a CUDA kernel (``_fused_rms_norm``), the CUDA-only ops and
``scaled_dot_product_attention`` (sdpa_op.py).
"""

from __future__ import annotations

from typing import Any

import torch

from phantora.runtime.simcuda import cuda_only

_KEPT_WHOLE = frozenset({torch.ops.aten.scaled_dot_product_attention.default})
_KNOWN: dict[int, bool] = {}  # id(op) -> answer (OpOverloads live as long as torch; hashing one runs Python)
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key


def runs_as_parts(func: Any) -> bool:
    """Does a CUDA tensor run aten op `func` as its ``CompositeImplicitAutograd`` composite (decided once per op)?"""
    known = _KNOWN.get(id(func))
    if known is None:
        name = func.name()
        known = _KNOWN[id(func)] = (
            func.namespace == "aten"
            and func not in _KEPT_WHOLE
            and func not in cuda_only.KERNELS
            and func not in cuda_only.HALF_TO_FLOAT
            and _has_kernel(name, "CompositeImplicitAutograd")
            and not _has_kernel(name, "CUDA")
        )
    return known
