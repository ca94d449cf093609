"""A CUDA program that asks FlexAttention for its FLASH backend (`kernel_options={"BACKEND": "FLASH"}`): eagerly,
compiled with Inductor (torch.compile's default), compiled with the aot_eager backend, and compiled with the TRITON
backend. Writes, for each, the error it met (None if it ran) as JSON to argv[1]."""

import json
import sys

import torch
from torch.nn.attention.flex_attention import flex_attention

q = torch.randn(1, 2, 128, 16, device="cuda")
seen = {}
for name, fn, backend in (
    ("eager", flex_attention, "FLASH"),
    ("inductor", torch.compile(flex_attention), "FLASH"),
    ("aot_eager", torch.compile(flex_attention, backend="aot_eager"), "FLASH"),
    ("inductor_triton", torch.compile(flex_attention), "TRITON"),
):
    try:
        out = fn(q, q, q, kernel_options={"BACKEND": backend})
        seen[name] = {"error": None, "shape": list(out.shape), "device": str(out.device)}
    except RuntimeError as e:
        seen[name] = {"error": str(e)}
json.dump(seen, open(sys.argv[1], "w"))
