"""torch.distributed.checkpoint (DCP) in phantom mode: each rank saves and loads its own part, unchanged programs.

Real DCP makes its ranks agree on a plan by exchanging pickled objects (gather, scatter, broadcast). Phantom ranks
carry no data in their collectives (they are timed, not carried), and deduplicated ones are not all processes.
So in phantom mode, for a multi-rank run:
- `dcp.save` / `save_state_dict` run as `dcp.save(..., use_collectives=False)`, torch's own format for a checkpoint
  written without rank coordination: each rank plans alone and writes its data files (`__{rank}_N.distcp`; phantom
  tensors as data-less meta records, `_HostRecord`) and its own metadata (`__{rank}.metadata`); after DCP's
  barrier the coordinator merges those into the global `.metadata` a coordinated save writes (programs look for
  it: torchtitan finds its checkpoints by it), then a second barrier (a FileSystemWriter only);
- `dcp.load` reads the global `.metadata` (phantom or real mode wrote it) or else the rank's own; DCP's object
  exchanges run locally (`_LocalDistWrapper`): a load plan depends only on the rank's state dict and the
  metadata (the default load planner's global step changes nothing);
- `dcp.async_save` is refused in one line (its background save is not modelled).
What real DCP does that this does not: it writes a replicated item once, on one rank (the storage model charges
its bytes over the ranks holding it: storage.py), and its plan exchange (a few small collectives) is not charged.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
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


def _refuse(
    name: str, why: str = "DCP's ranks would exchange pickled objects, which phantom ranks do not carry"
) -> NotSimulatedError:
    return NotSimulatedError(
        f"torch.distributed.checkpoint.{name} in phantom mode: {why}; use dcp.save / dcp.load (supported in phantom "
        "mode), or run without --phantom"
    )


def _merged(parts: list[Any]) -> Any:
    """One checkpoint metadata of the ranks' own (`parts`): every tensor's chunks once, every item's storage."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    described: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    planner: dict[Any, Any] = {}
    for md in parts:
        for key, value in md.state_dict_metadata.items():
            have = described.get(key)
            if have is None:
                fresh = isinstance(value, TensorStorageMetadata)
                described[key] = dataclasses.replace(value, chunks=list(value.chunks)) if fresh else value
            elif isinstance(value, TensorStorageMetadata):
                known = {(tuple(c.offsets), tuple(c.sizes)) for c in have.chunks}
                have.chunks.extend(c for c in value.chunks if (tuple(c.offsets), tuple(c.sizes)) not in known)
        for index, info in (md.storage_data or {}).items():
            storage.setdefault(index, info)
        if isinstance(md.planner_data, dict):
            for key, value in md.planner_data.items():
                planner.setdefault(key, value)
    return dataclasses.replace(parts[0], state_dict_metadata=described, storage_data=storage, planner_data=planner)


def _write_global_metadata(path: str, world: int) -> None:
    """Merge the ranks' own metadata files in checkpoint folder `path` into the global `.metadata` a coordinated
    save writes (programs look for it: torchtitan finds its checkpoints so), and remove them."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.storage import WriteResult

    reader = FileSystemReader(path)
    ranks = [r for r in range(world) if os.path.exists(reader._get_metadata_path(r))]
    if not ranks:
        return
    merged = _merged([reader.read_metadata(rank=r) for r in ranks])
    results = [
        WriteResult(index=i, size_in_bytes=info.length, storage_data=info) for i, info in merged.storage_data.items()
    ]
    FileSystemWriter(path).finish(metadata=merged, results=[results])  # torch's own writing of `.metadata`
    for r in ranks:
        os.remove(reader._get_metadata_path(r))


def _without_coordination(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_save_state_dict` saving each rank's part with its own metadata (use_collectives=False), which the
    coordinator then merges into the global metadata, before a barrier."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        if not _distributed(bool(given["no_dist"])):
            return original(*args, **kwargs)
        given["use_collectives"] = False
        out = original(**given)  # ends with a barrier: every rank's files are written
        group, writer = given["process_group"], given["storage_writer"]
        if isinstance(writer, FileSystemWriter):
            if dist.get_rank(group) == given["coordinator_rank"]:
                _write_global_metadata(str(writer.path), dist.get_world_size(group))
            dist.barrier(group=group)
        return out

    setattr(call, _MARK, True)
    return call


def _refusing(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _distributed(bool(kwargs.get("no_dist", False))):
            raise _refuse(name, "a save in the background is not modelled")
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
