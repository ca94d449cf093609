"""Indexing cuda tensors with Python lists and numpy arrays, reading and writing, and the same on the host.

Writes to argv[1], per case, whether the cuda result equals the host's (real mode) and its device and shape.
"""

import json
import sys
import warnings

import numpy as np
import torch

real = len(sys.argv) > 2 and sys.argv[2] == "real"
torch.manual_seed(0)
host = torch.randn(6, 8)
x = host.to("cuda")
w = torch.randn(6, 8, device="cuda", requires_grad=True)
cases = {
    "rows": lambda t: t[[1, 5]],
    "columns": lambda t: t[:, [0, 2, 2]],
    "pairs": lambda t: t[[0, 1], [3, 4]],
    "mask list": lambda t: t[[True, False, True, False, False, True]],
    "nested": lambda t: t[([[0, 1], [2, 3]],)],
    "numpy": lambda t: t[np.array([4, 0])],
    "empty": lambda t: t[[]],
}
seen: dict[str, object] = {}
for name, f in cases.items():
    out = f(x)
    seen[name] = {"device": str(out.device), "shape": list(out.shape)}
    if real:
        seen[name]["equal"] = bool(torch.equal(out.cpu(), f(host)))  # type: ignore[index]
with warnings.catch_warnings(record=True) as caught:  # torch reads this list as a tuple of indices, and says so
    warnings.simplefilter("always")
    out = x[[slice(None), [1, 2]]]
seen["as tuple"] = {"shape": list(out.shape), "warned": any("non-tuple sequence" in str(c.message) for c in caught)}
if real:
    seen["as tuple"]["equal"] = bool(torch.equal(out.cpu(), host[:, [1, 2]]))  # type: ignore[index]
y, z = x.clone(), host.clone()
y[[1, 5]] = -100.0
z[[1, 5]] = -100.0
y[:, [0, 7]] = torch.zeros(6, 2, device="cuda")
z[:, [0, 7]] = torch.zeros(6, 2)
seen["written"] = {"device": str(y.device), "equal": bool(torch.equal(y.cpu(), z)) if real else None}
w[[1, 5, 5]].sum().backward()  # row 5 twice: its gradient 2
seen["grad rows"] = w.grad.sum(1).cpu().tolist() if real else list(w.grad.shape)
torch.cuda.synchronize()
json.dump(seen, open(sys.argv[1], "w"))
