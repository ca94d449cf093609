"""A phantora group's identity as torch on a CUDA build reports it: its backend name and its bound device.

torch records the backend string a group was asked for (`_world.pg_map`) and answers it from
`get_backend`: "nccl" for `init_process_group("nccl")`, "cpu:gloo,cuda:nccl" for that request, "undefined"
for a bare `init_process_group()`. Under phantora those requests make phantora groups, so torch's map says
"phantora", and programs that branch on `get_backend() == "nccl"` take a CPU path. torch's map keeps
"phantora" (new groups and splits copy it, and it must keep making phantora groups); only `get_backend`,
the public answer, gives the name the request would have had on a GPU.

`init_process_group(device_id=...)` binds the device on the C++ group torch builds, which the phantora group
(a Python ProcessGroup) replaces; `bind_device` binds it on the group that stays, as torch would have.

backend.py installs these with its group class and backend name as arguments (this module imports nothing of it:
no import cycle).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def cuda_name(backend: Any, device_id: Any = None) -> str:
    """The backend name torch on a CUDA build records for a request that phantora serves.

    No backend: the device's default ("nccl" for a cuda `device_id`), else "undefined" (torch's lazy init)."""
    if backend is None or str(backend) == "":
        if device_id is None:
            return "undefined"
        kind = torch.device("cuda", device_id).type if isinstance(device_id, int) else torch.device(device_id).type
        return "nccl" if kind == "cuda" else str(dist.Backend.default_device_backend_map.get(kind, "undefined"))
    return str(dist.Backend(str(backend)))


def name_of(group: Any, ours: type[Any]) -> str:
    """This phantora group's name as torch on a CUDA build answers it (`torch_backend`); a group made without a
    request has the default group's. `ours`: the phantora group class."""
    if group.torch_backend:
        return str(group.torch_backend)
    default = dist.distributed_c10d._get_default_group()
    if isinstance(default, ours) and default.torch_backend:
        return str(default.torch_backend)
    return "nccl"


def get_backend_as_cuda(orig: Callable[..., Any], ours: type[Any], backend: str) -> Callable[..., Any]:
    """`get_backend` answering a group of class `ours` (registered as `backend`) by its CUDA name (`name_of`); any
    other group as torch does."""

    @functools.wraps(orig)
    def get_backend(group: Any = None) -> Any:
        answer = orig(group)
        pg = group or dist.distributed_c10d._get_default_group()
        if answer != backend or not isinstance(pg, ours):
            return answer
        return dist.Backend(name_of(pg, ours))

    return get_backend


def bind_device(orig: Callable[..., Any], ours: type[Any]) -> Callable[..., Any]:
    """torch's `_new_process_group_helper`, then `bound_device_id` on the group of class `ours` it returns."""

    @functools.wraps(orig)
    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        pg, store = orig(*args, **kwargs)
        device_id = kwargs.get("device_id", args[9] if len(args) > 9 else None)
        if device_id is not None and isinstance(pg, ours):
            pg.bound_device_id = device_id
        return pg, store

    return _new_process_group_helper
