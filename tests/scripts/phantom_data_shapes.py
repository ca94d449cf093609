"""Ops whose output shape depends on the data, on the simulated GPU: each case's shape (or its error) to argv[1].

argv[2] is "real" or "phantom". Each case is caught and reported: its shape, or the error's type and text.
"""

import json
import sys

import torch

real = sys.argv[2] == "real"
torch.manual_seed(0)
host = torch.randn(6, 8)
x = host.to("cuda") if real else torch.randn(6, 8, device="cuda")  # phantom: no values
keep = torch.tensor([True, False, True, False, False, True])  # host data: keeps its values on the device
cases = {
    "mask": lambda t: t[t > 0],
    "row mask": lambda t: t[t[:, 0] > 0],
    "nonzero": lambda t: torch.nonzero(t > 0),
    "where": lambda t: torch.where(t > 0)[0],
    "argwhere": lambda t: torch.argwhere(t > 0),
    "masked_select": lambda t: torch.masked_select(t, t > 0),
    "unique": lambda t: torch.unique(t),
    "unique rows": lambda t: torch.unique(t, dim=0),
    "unique_consecutive": lambda t: torch.unique_consecutive(t),
    "repeat_interleave": lambda t: torch.repeat_interleave(t, (t[:, 0] > 0).long(), dim=0),
    "kept mask": lambda t: t[keep.to(t.device)],
}
seen: dict[str, object] = {}
for name, f in cases.items():
    try:
        out = f(x)
        seen[name] = {"shape": list(out.shape), "device": str(out.device)}
        if real:
            seen[name]["equal"] = bool(torch.equal(out.cpu(), f(host)))  # type: ignore[index]
    except Exception as e:  # noqa: BLE001 - each case reported
        seen[name] = {"error": type(e).__name__, "text": str(e)}
json.dump(seen, open(sys.argv[1], "w"))
