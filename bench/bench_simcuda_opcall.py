"""Which ops of the compiled per-op path run through the dispatcher from C++ (simcuda/opcall.cc).

    .venv/bin/python bench/bench_simcuda_opcall.py [--steps 2]

In one process (no rank: the dispatch mode over a session with no network, as tests/test_simcuda_tensorinfo.py), a
small transformer block's forward on cuda tensors of the simulated GPU (embedding, layer norm, attention by bmm and
softmax, an MLP with gelu, a residual, a cast and a square, a mean, an in-place update, a concatenation, a reduction
over two dimensions), `--steps` times; then, for every op the compiled path planned, how many of its calls
opcall.cc ran. An op it does not take runs as before (the OpOverload's `_op`, or the Python path: a tensor list).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install

import torch  # noqa: E402

from phantora.perfmodel.gpus import get_gpu  # noqa: E402
from phantora.runtime.compute import Roofline  # noqa: E402
from phantora.runtime.dispatch import ChargeMode  # noqa: E402
from phantora.runtime.nonet import NoNetworkClient  # noqa: E402
from phantora.runtime.session import RankSession  # noqa: E402
from phantora.runtime.simcuda import compiled, device, fastpath  # noqa: E402
from phantora.runtime.simcuda.tensor import SimCudaTensor  # noqa: E402


def block(steps: int) -> None:
    """The block's forward, `steps` times, under the rank's dispatch mode."""
    s = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    b, t, d = 2, 8, 16
    with ChargeMode(s):
        w1, w2 = SimCudaTensor(torch.randn(d, 4 * d), 0), SimCudaTensor(torch.randn(4 * d, d), 0)
        g, emb = SimCudaTensor(torch.ones(d), 0), SimCudaTensor(torch.randn(32, d), 0)
        idx = SimCudaTensor(torch.randint(0, 32, (b, t)), 0)
        for _ in range(steps):
            x = torch.nn.functional.embedding(idx, emb)
            h = torch.nn.functional.layer_norm(x, (d,), g)
            a = torch.softmax(h @ h.transpose(1, 2) / 4.0, -1) @ h
            y = torch.nn.functional.gelu(a @ w1) @ w2 + x
            (y.double() ** 2).mean()
            w1.add_(torch.ones_like(w1), alpha=-0.1)
            torch.cat([y, x], -1).sum(dim=(0, 1))


def planned() -> list[torch._ops.OpOverload]:
    """The aten overloads the compiled path planned (fastpath's plans, by the overload's id)."""
    ids = {k for k, v in fastpath._PLANS.items() if v is not None}
    found = []
    for packet in list(vars(torch.ops.aten).values()):
        if isinstance(packet, torch._ops.OpOverloadPacket):
            found += [f for f in (getattr(packet, o) for o in packet.overloads()) if id(f) in ids]
    return sorted(found, key=str)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2)
    steps = p.parse_args().steps
    device._installed = True  # what simcuda.install sets in a rank (no device guard here)
    if compiled.load() is None or not compiled.op_call_address():
        sys.exit("bench_simcuda_opcall: the compiled per-op path or opcall.cc is not available")
    block(steps)
    ops = planned()
    taken = [(str(f), compiled.op_calls(f)) for f in ops if compiled.op_calls(f)]
    print(f"a transformer block's forward, {steps} steps: {len(ops)} ops planned, {len(taken)} through opcall.cc")
    print("  through opcall.cc (calls): " + ", ".join(f"{name} {n}" for name, n in taken))
    print("  not: " + (", ".join(str(f) for f in ops if not compiled.op_calls(f)) or "none"))


if __name__ == "__main__":
    main()
