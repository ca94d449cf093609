"""Ops that take a device, run as a CUDA tensor runs them when they reach the simulated GPU below autograd.

An aten op with a ``CompositeImplicitAutograd`` kernel (``Tensor.to``) is normally split into its parts by the
autograd key, so a dispatch mode or a tensor subclass never sees it. Below autograd (inside another subclass's
handler: DTensor's ``loss_parallel`` runs ``(target != ignore_index).sum().to(x)`` on its local tensors) the op itself
reaches the Python key, with its arguments as the program gave them: a device may be positional (``aten.to.device``,
which ``aten.to.other`` becomes), where the simulated GPU looks for the ``device=`` keyword, and run on the data it
would ask this CPU build for a CUDA tensor. A CUDA tensor there reaches the CUDA key, whose kernel is the composite;
the simulated GPU does the same (`OpOverload.decompose`), so the copy is dispatched with ``device=``, charged and
moved as on the GPU.

Custom ops that wrap collectives run as their Python bodies too: torch's context-parallel `cplib::flex_cp_allgather`
(torchtitan's CP with FlexAttention) makes its key and value contiguous and all-gathers them with functional
collectives, and its backward reduce-scatters the gradients. On a GPU the op is no kernel of its own, only its parts;
run whole on the data, its collectives were simulated and the op was charged again as a kernel of all its bytes
(the roofline's guess for an op it does not know). Its body now runs on the simulated GPU's tensors, so the copies
are charged as copies and the collectives as collectives, once.

So does ``aten.contiguous`` (`COPIES`): its schema marks its output as an alias of its input, which the compute
model takes for a view that launches nothing, yet of a non-contiguous tensor it is a copy (the body of
`flex_cp_allgather` makes its key contiguous so). Its part is that copy (``clone``), charged as any copy; of a
contiguous tensor it has no part, and returns its input, as on a GPU.

Only such ops: any other composite without a device argument (``linear``, ``where`` with a scalar) runs on the data as
before, since its parts may make tensors on the device where no dispatch mode takes them (FlexAttention's eager
reference runs with the mode off); nor the composites phantora keeps whole (a CUDA kernel given, ``_fused_rms_norm``;
the CUDA-only ops; ``scaled_dot_product_attention``, sdpa_op.py).
"""

from __future__ import annotations

from typing import Any

import torch

from phantora.runtime.simcuda import cuda_only

_KEPT_WHOLE = frozenset({torch.ops.aten.scaled_dot_product_attention.default})
_KNOWN: dict[int, bool] = {}  # id(op) -> answer (OpOverloads live as long as torch; hashing one runs Python)
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
_DEVICE_TYPES = frozenset({"Device", "Optional[Device]"})  # a schema argument that names a device


# custom ops (torch.library.custom_op) around collectives, run as their Python bodies
BODIES = frozenset({"cplib::flex_cp_allgather", "cplib::flex_cp_allgather_backward"})
COPIES = frozenset({"aten::contiguous"})  # composites whose one part is a copy (its alias schema says a view)


def runs_as_parts(func: Any) -> bool:
    """Is `func` an aten op taking a device that a CUDA tensor runs as its ``CompositeImplicitAutograd`` composite,
    one of `COPIES`, or a custom op of `BODIES` (decided once per op)?"""
    known = _KNOWN.get(id(func))
    if known is None:
        name = func.name()
        known = _KNOWN[id(func)] = (
            name in BODIES
            or name in COPIES
            or (
                func.namespace == "aten"
                and func not in _KEPT_WHOLE
                and func not in cuda_only.KERNELS
                and func not in cuda_only.HALF_TO_FLOAT
                and _has_kernel(name, "CompositeImplicitAutograd")
                and not _has_kernel(name, "CUDA")
                and any(str(a.type) in _DEVICE_TYPES for a in func._schema.arguments)
            )
        )
    return known


def run_parts(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Run `func` (`runs_as_parts`) through its parts: an aten composite's decomposition, a custom op's Python body
    (each part then dispatched, charged and moved as usual)."""
    if func.namespace == "aten":
        return func.decompose(*args, **kwargs)
    from torch._library.custom_ops import OPDEFS

    return OPDEFS[func.name()]._init_fn(*args, **kwargs)
