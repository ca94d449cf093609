"""An empty tensor on the simulated GPU holds zeros in real mode (runtime/dispatch.py), in one process.

torch leaves an empty tensor's memory as it finds it, and in real mode that memory is the host's: glibc hands a
freed block back to the next request of its size, stale bytes and all, and which block that is depends on what gloo's
threads freed meanwhile, so a program that reads an empty tensor saw values that differed from run to run. Programs
do: torch's pipeline stages run their shape inference on `torch.empty_strided` buffers (stage.py `_to_tensor`). Each
test frees a tensor of sevens, then asks for an empty one of its size, which glibc serves from freed blocks (before,
it held the bytes of tensors freed earlier, not zeros). The fill is not a kernel: it charges no time, counts as no op.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.simcuda.tensor import SimCudaTensor

aten = torch.ops.aten
CUDA0 = torch.device("cuda", 0)
# the aten ops, called as the dispatcher calls them (torch.empty(n, device="cuda") is aten.empty.memory_format; torch's
# Python entries would first initialise CUDA, which a CPU build cannot: a rank's simulated device answers that)
MAKERS: dict[str, Callable[[int, torch.Tensor], torch.Tensor]] = {
    "empty": lambda n, like: aten.empty.memory_format([n], device=CUDA0),
    "empty_strided": lambda n, like: aten.empty_strided.default([n], [1], device=CUDA0),
    "new_empty": lambda n, like: aten.new_empty.default(like, [n]),
    "empty_like": lambda n, like: aten.empty_like.default(like),
}


@pytest.mark.parametrize("name", MAKERS)
def test_an_empty_tensor_on_the_simulated_gpu_holds_zeros_in_real_mode(charge_mode: ChargeMode, name: str) -> None:
    s, made = charge_mode.session, []
    with charge_mode:
        for n in (256, 1024, 4096):
            like = SimCudaTensor(torch.ones(n), 0)
            stale = aten.full.default([n], 7.0, device=CUDA0)
            del stale  # its block is free, sevens and all
            ops, compute_ns = s.ops, s.clock.compute_ns
            made.append(MAKERS[name](n, like))
            assert s.ops - ops == 1 and s.clock.compute_ns == compute_ns  # the factory, of no time; no fill kernel
    for t in made:
        assert type(t) is SimCudaTensor and t.device == CUDA0
        assert int(torch.count_nonzero(t.elem)) == 0
