"""Rank script for tests/test_simcuda_fastpath.py: ops on the simulated GPU with the fast path on and off.

Writes JSON to argv[1]: for each route, the values, the simulated time of each op (CUDA events), the
device memory it added, whether an in-place op returned its input, and how many ops the fast path took; and for
ten repeats of one op, their time, how often the compute model computed a cost, their outputs and the device memory
they hold.
"""

import json
import sys

import torch

from phantora.runtime import session
from phantora.runtime.simcuda import fastpath

N = 1 << 20
taken = [0]
fast = fastpath.device_op


def counted(*args):
    out = fast(*args)
    taken[0] += out is not fastpath.SLOW
    return out


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return out, start.elapsed_time(end) * 1e6  # ns


def run() -> dict:
    a = torch.ones(N, device="cuda")
    b = torch.full((N,), 2.0, device="cuda")
    before = torch.cuda.memory_allocated()
    c, add_ns = timed(lambda: a + b)
    added = torch.cuda.memory_allocated() - before
    r, inplace_ns = timed(lambda: a.add_(b))
    v, view_ns = timed(lambda: c.view(2, -1))
    m, max_ns = timed(lambda: torch.max(c.view(4, -1), dim=1))  # two outputs: values and indices
    # a repeated op: ten bf16 adds of a shape not seen before; the model computes its cost once
    x = torch.ones(N // 2, device="cuda", dtype=torch.bfloat16)
    model = session.current().model
    computed = [0]
    compute = model.compute

    def counting(*args):
        computed[0] += 1
        return compute(*args)

    model.compute = counting
    taken_before = taken[0]
    repeat_before = torch.cuda.memory_allocated()
    ys, repeat_ns = timed(lambda: [x + x for _ in range(10)])
    repeat_added = torch.cuda.memory_allocated() - repeat_before  # the ten outputs are alive
    repeat_taken = taken[0] - taken_before
    model.compute = compute
    return {
        "device": str(c.device),
        "sum": float(c.sum().item()),
        "inplace_is_input": r is a,
        "a_sum": float(a.sum().item()),
        "max": [float(m.values.sum().item()), str(m.indices.device), str(m.values.device)],
        "add_ns": add_ns,
        "inplace_ns": inplace_ns,
        "view_ns": view_ns,
        "max_ns": max_ns,
        "added_bytes": added,
        "view_shape": list(v.shape),
        "repeat_ns": repeat_ns,
        "repeat_computed": computed[0],
        "repeat_taken": repeat_taken,
        "repeat_added_bytes": repeat_added,
        "repeat_out": sorted({(str(y.device), str(y.dtype), tuple(y.shape)) for y in ys}),
        "repeat_value": float(ys[-1][0].item()),
    }


torch.cuda.set_device(0)
fastpath.device_op = counted
on = run()
on["fast_ops"] = taken[0]
fastpath.device_op = lambda *args: fastpath.SLOW
off = run()
fastpath.device_op = fast
json.dump({"on": on, "off": off}, open(sys.argv[1], "w"))
