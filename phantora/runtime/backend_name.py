"""A phantora group's identity as torch on a CUDA build reports it: its backend name and its bound device.

torch records the backend string a group was asked for (`_world.pg_map`) and answers it from
`get_backend`: "nccl" for `init_process_group("nccl")`, "cpu:gloo,cuda:nccl" for that request, "undefined"
for a bare `init_process_group()`. Under phantora those requests make phantora groups, so torch's map says
"phantora", and programs that branch on `get_backend() == "nccl"` take a CPU path. torch's map keeps
"phantora" (new groups and splits copy it, and it must keep making phantora groups); the public answers give
what the request would have had on a GPU: `get_backend` its name, `get_backend_config` the device map torch's
`BackendConfig` makes of it ("cuda:nccl" for "nccl" and for a bare request on a CUDA host), and the group's
own `name()` / `_get_backend_name()` "nccl" (a CUDA request's default backend type; backend.py).

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


def cuda_config(name: str) -> str:
    """The device map torch's `BackendConfig` makes of the request `name` on a CUDA host, as
    `get_backend_config` prints it: "cuda:nccl" for "nccl" (NCCL's devices) and for "undefined" (the
    accelerator's default backend); a "device:backend,..." request its own pairs, lower case, in order."""
    text = name.lower()
    if text == str(dist.Backend.UNDEFINED):
        return "cuda:nccl"
    if ":" in text:
        return ",".join(":".join(part.strip() for part in pair.split(":")) for pair in text.split(","))
    return ",".join(f"{device}:{text}" for device in dist.Backend.backend_capability.get(text, ["cpu", "cuda"]))


def _answer_as_cuda(orig: Callable[..., Any], ours: type[Any], answer: Callable[[str], Any]) -> Callable[..., Any]:
    """`orig(group)` (which checks the group as torch does), but a group of class `ours` answered by
    `answer(its CUDA name)` (`name_of`)."""

    @functools.wraps(orig)
    def wrapped(group: Any = None) -> Any:
        theirs = orig(group)
        pg = group or dist.distributed_c10d._get_default_group()
        return answer(name_of(pg, ours)) if isinstance(pg, ours) else theirs

    return wrapped


def get_backend_as_cuda(orig: Callable[..., Any], ours: type[Any]) -> Callable[..., Any]:
    """`get_backend`: a group of class `ours` by its CUDA name; any other group as torch does."""
    return _answer_as_cuda(orig, ours, dist.Backend)


def get_backend_config_as_cuda(orig: Callable[..., Any], ours: type[Any]) -> Callable[..., Any]:
    """`get_backend_config`: a group of class `ours` by its CUDA name's device map (`cuda_config`)."""
    return _answer_as_cuda(orig, ours, cuda_config)


def default_device_as_cuda(orig: Callable[..., Any], ours: type[Any]) -> Callable[..., Any]:
    """`_get_pg_default_device` (FSDP's sharded state dict, DCP's planners and optimizer state ask it): a group of
    class `ours` by the devices of its CUDA request (`cuda_config`), picked as torch picks among a group's devices
    (one: that one; several: cpu if among them); any other group as torch does. A phantora group has no backend
    registered per device, and torch's own answer was "Default device not found"."""

    @functools.wraps(orig)
    def _get_pg_default_device(group: Any = None) -> torch.device:
        pg = group or dist.distributed_c10d._get_default_group()
        if not isinstance(pg, ours):
            return orig(group)  # type: ignore[no-any-return]
        kinds = [pair.split(":")[0] for pair in cuda_config(name_of(pg, ours)).split(",")]
        return torch.device(kinds[0] if len(kinds) == 1 or "cpu" not in kinds else "cpu")

    return _get_pg_default_device


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
