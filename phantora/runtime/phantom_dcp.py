"""torch.distributed.checkpoint (DCP) in phantom mode: each rank saves and loads its own part, unchanged programs.

Real DCP makes its ranks agree on a plan by exchanging pickled objects (gather, scatter, broadcast). Phantom ranks
carry no data in their collectives (they are timed, not carried), and deduplicated ones are not all processes.
So in phantom mode, for a multi-rank run:
- `dcp.save` / `save_state_dict` run as `dcp.save(..., use_collectives=False)`, torch's own format for a checkpoint
  written without rank coordination: each rank plans alone, writes its data files (`__{rank}_N.distcp`; phantom
  tensors as data-less meta records, simcuda/checkpoint.py) and its own metadata (`__{rank}.metadata`), then
  joins the others at a barrier (a timed collective);
- `dcp.load` reads the global `.metadata` (a checkpoint real mode wrote) or else the rank's own; DCP's object
  exchanges run locally (`_LocalDistWrapper`): a load plan depends only on the rank's state dict and the
  metadata (the default load planner's global step changes nothing);
- `dcp.async_save` is refused in one line (its background save is not modelled).
What real DCP does that this does not: it writes a replicated item once, on one rank (the storage model charges
its bytes over the ranks holding it: storage.py), and its plan exchange (a few small collectives) is not charged.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from phantora.runtime import import_hooks
from phantora.runtime.simcuda.devices import NotSimulatedError

_MARK = "_phantora_phantom_dcp"


def _distributed(no_dist: bool = False) -> bool:
    return not no_dist and dist.is_initialized() and dist.get_world_size() > 1


def _refuse(name: str) -> NotSimulatedError:
    return NotSimulatedError(
        f"torch.distributed.checkpoint.{name} in phantom mode: DCP's ranks would exchange pickled objects, which "
        "phantom ranks do not carry; use dcp.save / dcp.load (supported in phantom mode), or run without --phantom"
    )


def _without_coordination(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_save_state_dict` saving each rank's part with its own metadata (use_collectives=False)."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        no_dist = args[4] if len(args) > 4 else kwargs.get("no_dist", False)
        if _distributed(bool(no_dist)):
            kwargs["use_collectives"] = False
        return original(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


def _refusing(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _distributed(bool(kwargs.get("no_dist", False))):
            raise _refuse(name)
        return original(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


def _own_metadata(original: Callable[..., Any]) -> Callable[..., Any]:
    """`FileSystemReader.read_metadata` falling back to the rank's own metadata (a checkpoint phantom mode wrote)
    before torch would, so that torch does not log the missing global file as a failure."""

    @functools.wraps(original)
    def read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is None and _distributed():
            path = self._get_metadata_path()
            own = self._get_metadata_path(dist.get_rank())
            if not os.path.exists(path) and os.path.exists(own):
                kwargs["rank"] = dist.get_rank()
        return original(self, *args, **kwargs)

    setattr(read_metadata, _MARK, True)
    return read_metadata


class _HostRecord(torch.Tensor):
    """A phantom tensor copied to the host, as DCP's writer takes it: on the CPU (so the writer's checks pass) yet
    without data (meta underneath), and pickled as torch pickles a meta tensor, a record of no bytes."""

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return True

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cpu")

    def __reduce_ex__(self, proto: Any) -> tuple[Any, tuple[Any, ...]]:  # type: ignore[override]
        args = (self.dtype, tuple(self.size()), self.stride(), self.requires_grad)
        return torch._utils._rebuild_meta_tensor_no_storage, args


def _host_records(original: Callable[..., Any]) -> Callable[..., Any]:
    """A save planner's `resolve_data` giving a phantom tensor as its host copy: the device-to-host copy is made
    (and charged) as DCP makes it, and handed over as a `_HostRecord`."""

    @functools.wraps(original)
    def resolve_data(self: Any, write_item: Any) -> Any:
        data = original(self, write_item)
        if isinstance(data, torch.Tensor) and not isinstance(data, _HostRecord):
            host = data.detach().cpu()
            if host.is_meta:
                return host.as_subclass(_HostRecord)
        return data

    setattr(resolve_data, _MARK, True)
    return resolve_data


def _local_wrapper(base: type) -> type:
    """A subclass of DCP's `_DistWrapper` whose plan exchanges run on this rank alone (see the module doc)."""

    class _LocalDistWrapper(base):  # type: ignore[valid-type,misc]
        def reduce_scatter(self, step: str, map_fun: Callable[[], Any], reduce_fun: Callable[[list[Any]], Any]) -> Any:
            if not self.use_dist:
                return super().reduce_scatter(step, map_fun, reduce_fun)
            return reduce_fun([map_fun()])[0]

        def all_gather(self, step: str, map_fun: Callable[[], Any]) -> list[Any]:
            if not self.use_dist:
                return super().all_gather(step, map_fun)  # type: ignore[no-any-return]
            return [map_fun()]

        def all_reduce(self, step: str, map_fun: Callable[[], Any], reduce_fun: Callable[[list[Any]], Any]) -> Any:
            if not self.use_dist:
                return super().all_reduce(step, map_fun, reduce_fun)
            raise _refuse(f"all_reduce (step {step!r})")

        def broadcast(self, step: str, map_fun: Callable[[], Any]) -> Any:
            if not self.use_dist:
                return super().broadcast(step, map_fun)
            raise _refuse(f"broadcast (step {step!r})")

    _LocalDistWrapper.__name__ = "_LocalDistWrapper"
    setattr(_LocalDistWrapper, _MARK, True)
    return _LocalDistWrapper


def _patch(package: ModuleType) -> None:
    from torch.distributed.checkpoint import default_planner, filesystem, state_dict_loader, state_dict_saver

    if getattr(state_dict_saver._save_state_dict, _MARK, False):
        return
    state_dict_saver._save_state_dict = _without_coordination(state_dict_saver._save_state_dict)
    wrapper = _local_wrapper(state_dict_loader._DistWrapper)
    state_dict_loader._DistWrapper = wrapper  # type: ignore[misc,assignment]
    planner = default_planner.DefaultSavePlanner
    planner.resolve_data = _host_records(planner.resolve_data)  # type: ignore[method-assign]
    filesystem.FileSystemReader.read_metadata = _own_metadata(filesystem.FileSystemReader.read_metadata)  # type: ignore[method-assign]
    for owner in (package, state_dict_saver):
        original = getattr(owner, "async_save", None)
        if original is not None and not getattr(original, _MARK, False):
            owner.async_save = _refusing("async_save", original)  # type: ignore[attr-defined]


def enable() -> None:
    """Make `torch.distributed.checkpoint` save and load in multi-rank phantom runs (once imported)."""
    import_hooks.after_import("torch.distributed.checkpoint", _patch)
