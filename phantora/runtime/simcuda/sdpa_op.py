"""``aten.scaled_dot_product_attention`` called as an op (an exported or traced graph) takes the GPU's kernel too.

phantora makes `F.scaled_dot_product_attention` run the kernel torch's CUDA build picks (phantom_mode.py,
`use_fused_attention`; sdp_choice.py). A graph made by `torch.export` (torch's pipeline tracer, `pipeline()`) or
by FX calls the op itself, ``torch.ops.aten.scaled_dot_product_attention.default``, which reaches torch's
composite: on this CPU build it finds no fused-kernel choice for a CUDA device and runs the unfused math path
(two batched matmuls, a softmax, a dropout of the scores), where a GPU runs one memory-efficient or flash kernel
each way. The op is given a kernel for the simulated GPU's autograd key (``AutogradCUDA``, which only its tensors
and DTensors over them carry here): it runs the same function as `F.scaled_dot_product_attention`, and that
function's own fall-back to torch (the math choice, other tensors) runs the composite.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_LIBRARY: list[torch.library.Library] = []
_inside = threading.local()


def _kernel(*args: Any, **kwargs: Any) -> Any:
    """The op on the simulated GPU: `F.scaled_dot_product_attention` (phantora's choice, whose signature is the op's:
    phantom_mode.py's `sdpa` spells it out), which may call torch's own function, and so the op again: that inner call
    runs torch's composite. The dispatcher passes the schema's arguments as given, handed on unchanged."""
    if getattr(_inside, "on", False):
        return _SDPA.decompose(*args, **kwargs)
    from phantora.runtime.phantom_mode import fused_attention

    _inside.on = True
    try:
        return fused_attention()(*args, **kwargs)
    finally:
        _inside.on = False


def install() -> None:
    """Register the kernel (once per process)."""
    if not _LIBRARY:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("scaled_dot_product_attention", _kernel, "AutogradCUDA")
        _LIBRARY.append(lib)
