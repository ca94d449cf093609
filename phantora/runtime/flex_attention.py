"""FlexAttention on the simulated GPU: one fused kernel, timed as flash attention is.

`torch.nn.attention.flex_attention` runs as higher-order operators (``flex_attention`` and
``flex_attention_backward``). On a GPU, torch.compile turns each into one fused kernel; in eager mode on
the CPU, PyTorch runs an unfused reference that materialises the score matrix (called directly, not
through torch.compile, which refuses a rank's dispatch mode). A rank's dispatch mode
(dispatch.py) therefore handles the operators whole:
- the values come from PyTorch's own reference, run with the mode off (so its inner ops are neither
  charged nor counted as device memory) on the tensors' data, in query slices on real data (flex_chunks.py: the
  reference's score matrices are B x H x Lq x Lkv, which the fused kernel never holds);
- the time is the flash-attention kernel's for the same query, key and value shapes (the compute
  model's attention formula) charged for the blocks the block mask keeps (flex_blocks.py: the full kernel when
  nothing is masked, else the causal kernel's pairs scaled by the kept blocks against a causal mask's). In phantom
  mode the mask has no values, and it is taken as causal, the mask of language-model training.
  FlexAttention's kernel is inductor's own Triton template (flash-style: tiles, online softmax), not one of
  sdpa's backends (simcuda/sdp_choice.py), so it keeps this charge whatever sdpa would pick: in bf16/fp16 it
  is what sdpa's flash kernel costs; in fp32 its dots take torch's fp32 matmul precision
  (inductor's `get_float32_precision`: IEEE fp32 on CUDA cores at "highest", else TF32), which is how the
  compute model times an fp32 flash call, where sdpa's fp32 pick, the efficient kernel, always runs 3 TF32
  products (compute._FAST_F32);
- the outputs count as device memory, and are cuda tensors again when the inputs were;
- `kernel_options={"BACKEND": "FLASH"}` (FlashAttention-4's CuTe kernels) in a region the program compiled with
  Inductor stops as torch's lowering does on a GPU of any arch when the `flash_attn.cute` package is absent
  (torch's own check and message, `refuse_flash`). Run eagerly (flex_attention's own compile uses the eager
  backend), torch ignores the option, and so does this.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.attention.flex_attention
from torch._C import DispatchKey
from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

from phantora.runtime import flex_blocks, flex_chunks, fusion
from phantora.runtime.compute import OpCost, kept_flops, tensors_in
from phantora.runtime.simcuda import device as simcuda
from phantora.runtime.simcuda.tensor import SimCudaTensor

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default


def _charge(mode: Any, name: str, op: Any, inputs: tuple, out: Any, block_mask: tuple, q: Any, k: Any) -> None:
    """Charge the flash op `op` on `inputs` (unwrapped) for the blocks `block_mask` keeps (flex_blocks.py)."""
    s = mode.session
    how = flex_blocks.charge(simcuda.unwrap(block_mask), q.shape[-2], k.shape[-2])
    c = s.model.cost(op, inputs, how.flags(), out)
    if how.kept != how.of:
        c = OpCost(kept_flops(c.flops, how.kept, how.of), c.nbytes, c.dtype, c.ns, c.tier)
    s.charge(name, c)


def _run(mode: Any, hop: Any, args: tuple, kwargs: dict) -> Any:
    """Run `hop` on the tensors' data with the mode off; wrap the outputs back on the simulated GPU."""
    index = next((t.device.index or 0 for t in tensors_in(args) if isinstance(t, SimCudaTensor)), None)
    reference = hop.py_kernels[DispatchKey.CompositeExplicitAutograd]  # not the operator: no re-dispatch
    data, options = simcuda.unwrap(args), simcuda.unwrap(kwargs)
    flex_chunks.note(data[0], data[1].shape[2])  # the workspace real mode holds (memcheck's probe reads it)
    with simcuda.device_work():
        if data[0].is_meta:  # phantom mode: shapes only, no score matrix to hold
            out = reference(*data, **options)
        else:  # real data: in query slices, without the whole score matrix (flex_chunks.py)
            out = (flex_chunks.forward if hop is flex_attention else flex_chunks.backward)(reference, data, options)
    mem = mode.session.memory
    if mem.enabled:
        mem.on_outputs(out, hop)
    return out if index is None else simcuda.wrap(out, index)


def refuse_flash(session: Any, kernel_options: Any) -> None:
    """Raise torch's error when Inductor would lower a FLASH-backend call without the `flash_attn.cute` package."""
    if not isinstance(kernel_options, dict) or kernel_options.get("BACKEND") != "FLASH":
        return
    if not fusion.in_inductor(session):
        return
    # torch's own check (find_spec of flash_attn.cute) and message, as Inductor's lowering raises them
    from torch._inductor.kernel.flex import flex_flash_attention as ffa

    if not ffa.ensure_flash_available():
        raise RuntimeError(
            f"BACKEND='FLASH' but flash attention cannot be used: {ffa._flash_attention_unavailable_message()}"
        )


def _forward(mode: Any, q: Any, k: Any, v: Any, score_mod: Any, block_mask: tuple, *rest: Any, **kw: Any) -> Any:
    refuse_flash(mode.session, rest[1] if len(rest) > 1 else kw.get("kernel_options"))
    out = _run(mode, flex_attention, (q, k, v, score_mod, block_mask, *rest), kw)
    _charge(mode, "flex_attention", _FLASH, simcuda.unwrap((q, k, v)), simcuda.unwrap(out[:2]), block_mask, q, k)
    return out


def _backward(mode: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, grad_out: Any, *rest: Any, **kw: Any) -> Any:
    grads = _run(mode, flex_attention_backward, (q, k, v, out, lse, grad_out, *rest), kw)
    block_mask = rest[3]  # after grad_logsumexp, fw_graph, joint_graph
    inputs = simcuda.unwrap((grad_out, q, k, v, out, lse))
    _charge(mode, "flex_attention_backward", _FLASH_BWD, inputs, simcuda.unwrap(grads[:3]), block_mask, q, k)
    return grads


def register(mode_class: type) -> None:
    """Let `mode_class` (the rank's dispatch mode, which has a ``session``) run the FlexAttention operators."""
    flex_attention.py_impl(mode_class)(_forward)
    flex_attention_backward.py_impl(mode_class)(_backward)
    # Eager flex_attention wraps the operator in torch.compile, which refuses a rank's dispatch mode; this
    # switch of PyTorch's makes it call the operator directly (its autograd still traces score_mod).
    torch.nn.attention.flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
